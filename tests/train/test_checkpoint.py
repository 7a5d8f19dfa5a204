"""Rolling atomic checkpoints, with a fake engine whose save() writes one file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from purplerl.errors import ExperimentError, UserError
from purplerl.runs.checkpoints import checkpoint_dirs, latest_checkpoint, newest_intact, read_state, verify_checkpoint
from purplerl.runs.layout import CHECKPOINTS_DIR as CHECKPOINTS
from purplerl.runs.layout import MANIFEST_FILE, STATE_FILE
from purplerl.train.checkpoint import remove_stale, save_checkpoint


class FakeEngine:
    def __init__(self, tag: str = "adapter") -> None:
        self.tag = tag
        self.saved_to: list[Path] = []

    def save(self, path: Path) -> None:
        self.saved_to.append(Path(path))
        (Path(path) / "adapter.txt").write_text(self.tag)


class BrokenEngine:
    def save(self, path: Path) -> None:
        (Path(path) / "adapter.txt").write_text("half")
        raise OSError("disk full")


def test_save_checkpoint_layout_and_state(tmp_path: Path) -> None:
    engine = FakeEngine("weights-3")
    final = save_checkpoint(tmp_path, 3, engine, {"finished": False, "stop_reason": None}, keep_last=2)
    assert final == tmp_path / CHECKPOINTS / "step_000003"
    assert engine.saved_to == [tmp_path / CHECKPOINTS / "step_000003.tmp"]  # written aside, then renamed
    assert (final / "adapter.txt").read_text() == "weights-3"
    assert json.loads((final / STATE_FILE).read_text()) == {"finished": False, "stop_reason": None, "step": 3}
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["step_000003"]
    manifest = json.loads((final / MANIFEST_FILE).read_text())["files"]
    assert manifest["adapter.txt"] == {"size": 9, "sha256": hashlib.sha256(b"weights-3").hexdigest()}
    assert set(manifest) == {"adapter.txt", STATE_FILE}
    assert read_state(final) == {"finished": False, "stop_reason": None, "step": 3}
    assert latest_checkpoint(tmp_path) == final


def test_keep_last_prunes_oldest(tmp_path: Path) -> None:
    for step in (3, 6, 9, 12):
        save_checkpoint(tmp_path, step, FakeEngine(), {}, keep_last=2)
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_000009", "step_000012"]
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["step_000009", "step_000012"]


def test_interrupted_and_foreign_dirs_are_ignored(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 3, FakeEngine(), {}, keep_last=5)
    root = tmp_path / CHECKPOINTS
    leftover = root / "step_000009.tmp"  # a write killed before its rename, even with a state file
    leftover.mkdir()
    (leftover / STATE_FILE).write_text(json.dumps({"step": 9}))
    (root / "step_000010").mkdir()  # no manifest: not a checkpoint
    (root / "notes").mkdir()
    assert latest_checkpoint(tmp_path) == root / "step_000003"
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_000003"]


def test_steps_sort_numerically(tmp_path: Path) -> None:
    for step in (999_999, 1_000_000, 42):
        save_checkpoint(tmp_path, step, FakeEngine(), {}, keep_last=5)
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_000042", "step_999999", "step_1000000"]
    assert read_state(latest_checkpoint(tmp_path))["step"] == 1_000_000


def test_a_stale_tmp_of_the_same_step_is_replaced(tmp_path: Path) -> None:
    stale = tmp_path / CHECKPOINTS / "step_000003.tmp"
    stale.mkdir(parents=True)
    (stale / "junk.bin").write_text("from a killed run")
    final = save_checkpoint(tmp_path, 3, FakeEngine(), {}, keep_last=2)
    assert sorted(p.name for p in final.iterdir()) == ["adapter.txt", STATE_FILE, MANIFEST_FILE]
    assert not stale.exists()


def test_resaving_a_step_overwrites_it(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 4, FakeEngine("old"), {"finished": False}, keep_last=2)
    final = save_checkpoint(tmp_path, 4, FakeEngine("new"), {"finished": True}, keep_last=2)
    assert (final / "adapter.txt").read_text() == "new"
    assert read_state(final) == {"finished": True, "step": 4}
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_000004"]


def test_a_failed_save_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    previous = save_checkpoint(tmp_path, 2, FakeEngine(), {}, keep_last=2)
    with pytest.raises(ExperimentError, match="step 4: cannot write a checkpoint into .* MiB free") as err:
        save_checkpoint(tmp_path, 4, BrokenEngine(), {}, keep_last=2)
    assert "the newest intact checkpoint step_000002 is kept" in str(err.value) and "\n" not in str(err.value)
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["step_000002"]  # no .tmp left behind
    assert latest_checkpoint(tmp_path) == previous


def test_no_checkpoints(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert checkpoint_dirs(tmp_path / "missing") == []
    with pytest.raises(UserError, match="not a purplerl checkpoint"):
        read_state(tmp_path)


def _two_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    older = save_checkpoint(tmp_path, 2, FakeEngine("two"), {}, keep_last=5)
    newer = save_checkpoint(tmp_path, 4, FakeEngine("four"), {}, keep_last=5)
    return older, newer


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda c: (c / "adapter.txt").write_text("fou"), "adapter.txt is 3 bytes, the manifest says 4"),
    (lambda c: (c / "adapter.txt").write_text("FOUR"), "adapter.txt does not match its checksum"),
    (lambda c: (c / "adapter.txt").unlink(), "adapter.txt is missing"),
    (lambda c: (c / MANIFEST_FILE).unlink(), "no manifest.json"),
    (lambda c: (c / MANIFEST_FILE).write_text("{not json"), "manifest.json is unreadable"),
    (lambda c: (c / MANIFEST_FILE).write_text('{"files": {"../x": {}}}'), "does not list the checkpoint's files"),
    (lambda c: (c / STATE_FILE).write_bytes(b"\x00" * 10), "loop_state.json is 10 bytes"),
])
def test_a_damaged_newest_checkpoint_is_skipped_with_its_reason(tmp_path: Path, damage, reason: str) -> None:
    older, newer = _two_checkpoints(tmp_path)
    assert verify_checkpoint(newer) is None
    damage(newer)
    assert reason in verify_checkpoint(newer)
    found, skipped = newest_intact(tmp_path)
    assert found == older
    assert [(p.name, reason in why) for p, why in skipped] == [("step_000004", True)]
    assert latest_checkpoint(tmp_path) == older


def test_a_manifest_that_matches_edited_files_is_still_checked_against_the_step(tmp_path: Path) -> None:
    _, newer = _two_checkpoints(tmp_path)
    state = json.dumps({"step": 9}).encode()
    (newer / STATE_FILE).write_bytes(state)
    manifest = json.loads((newer / MANIFEST_FILE).read_text())
    manifest["files"][STATE_FILE] = {"size": len(state), "sha256": hashlib.sha256(state).hexdigest()}
    (newer / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert verify_checkpoint(newer) == "loop_state.json does not hold step 4"


@pytest.mark.parametrize("entry", ["../x", "../step_000002/adapter.txt", "sub/../../x", "ABSOLUTE"])
def test_a_manifest_entry_outside_the_checkpoint_is_refused_even_when_it_matches(tmp_path: Path, entry: str) -> None:
    # Every other check passes: the file the entry points at exists, with the size and checksum the manifest gives,
    # so only the refusal of a path that leaves the checkpoint dir can stop it. Such an entry would make an edited
    # manifest vouch for files that are not the checkpoint's (and a resume read them).
    older, newer = _two_checkpoints(tmp_path)
    outside = tmp_path / CHECKPOINTS / "x"
    outside.write_bytes(b"not the checkpoint's")
    (newer / "sub").mkdir()
    if entry == "ABSOLUTE":
        entry = str(outside.resolve())
    target = newer / entry
    assert target.is_file() and target.resolve().parent != newer.resolve()
    data = target.read_bytes()
    manifest = json.loads((newer / MANIFEST_FILE).read_text())
    manifest["files"][entry] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (newer / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert verify_checkpoint(newer) == f"{MANIFEST_FILE} has a bad entry for {entry!r}"
    assert newest_intact(tmp_path)[0] == older and latest_checkpoint(tmp_path) == older


def test_no_intact_checkpoint_lists_every_reason(tmp_path: Path) -> None:
    older, newer = _two_checkpoints(tmp_path)
    (older / "adapter.txt").write_text("")
    (newer / MANIFEST_FILE).unlink()
    found, skipped = newest_intact(tmp_path)
    assert found is None and [p.name for p, _ in skipped] == ["step_000004", "step_000002"]
    assert latest_checkpoint(tmp_path) is None


def test_every_file_and_directory_is_fsynced_before_the_rename(tmp_path: Path, monkeypatch) -> None:
    import os

    synced: list[str] = []
    renamed: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def rename(src, dst) -> None:
        renamed.append(str(dst))
        synced.append(f"RENAME {Path(dst).name}")
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    save_checkpoint(tmp_path, 3, FakeEngine(), {}, keep_last=2)
    tmp = str(tmp_path / CHECKPOINTS / "step_000003.tmp")
    before = synced[:synced.index("RENAME step_000003")]
    assert {f"{tmp}/adapter.txt", f"{tmp}/{STATE_FILE}", f"{tmp}/{MANIFEST_FILE}", tmp} <= set(before)
    assert before.index(f"{tmp}/{MANIFEST_FILE}") > before.index(f"{tmp}/adapter.txt")  # the manifest comes last
    assert synced[-1] == str(tmp_path / CHECKPOINTS)  # the rename itself is made durable


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoints(tmp_path: Path) -> None:
    class FullDiskEngine(FakeEngine):
        def save(self, path: Path) -> None:
            super().save(path)
            (Path(path) / "optimizer.pt").symlink_to("/dev/full")  # every write to it fails with ENOSPC
            with open(Path(path) / "optimizer.pt", "wb") as f:
                f.write(b"x" * 4096)

    previous = save_checkpoint(tmp_path, 2, FakeEngine(), {}, keep_last=2)
    with pytest.raises(ExperimentError) as err:
        save_checkpoint(tmp_path, 4, FullDiskEngine(), {}, keep_last=2)
    message = str(err.value)
    assert "the disk is full" in message and str(tmp_path / CHECKPOINTS) in message and "MiB free" in message
    assert "\n" not in message
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["step_000002"]
    assert verify_checkpoint(previous) is None


def test_stale_temporaries_are_removed(tmp_path: Path) -> None:
    kept = save_checkpoint(tmp_path, 2, FakeEngine(), {}, keep_last=2)
    root = tmp_path / CHECKPOINTS
    for name in ("step_000004.tmp", "step_000001.del"):
        (root / name).mkdir()
        (root / name / "big.bin").write_bytes(b"x" * 100)
    removed = remove_stale(tmp_path)
    assert sorted(p.name for p in removed) == ["step_000001.del", "step_000004.tmp"]
    assert sorted(p.name for p in root.iterdir()) == [kept.name]


def test_a_rotation_cut_short_is_finished_at_the_next_start(tmp_path: Path) -> None:
    # a kill after step 6's save but before its rotation leaves steps 2, 4 and 6 with keep_last 2
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, FakeEngine(), {}, keep_last=3)
    removed = remove_stale(tmp_path, keep_last=2)
    assert [p.name for p in removed] == ["step_000002"]
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["step_000004", "step_000006"]
    assert remove_stale(tmp_path) == []  # without keep_last only temporaries go


def test_read_state_refuses_garbage_in_one_line(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("[1, 2")
    with pytest.raises(UserError, match="is not JSON"):
        read_state(tmp_path)
    (tmp_path / STATE_FILE).write_text('{"step": "3"}')
    with pytest.raises(UserError, match="does not hold a step number"):
        read_state(tmp_path)
