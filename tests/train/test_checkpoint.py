"""Rolling atomic checkpoints, with a fake engine whose save() writes one file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purplerl.errors import UserError
from purplerl.train.checkpoint import (
    CHECKPOINTS,
    STATE_FILE,
    checkpoint_dirs,
    latest_checkpoint,
    read_state,
    save_checkpoint,
)


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
    (root / "step_000010").mkdir()  # no loop_state.json: not a checkpoint
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
    assert sorted(p.name for p in final.iterdir()) == ["adapter.txt", STATE_FILE]
    assert not stale.exists()


def test_resaving_a_step_overwrites_it(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 4, FakeEngine("old"), {"finished": False}, keep_last=2)
    final = save_checkpoint(tmp_path, 4, FakeEngine("new"), {"finished": True}, keep_last=2)
    assert (final / "adapter.txt").read_text() == "new"
    assert read_state(final) == {"finished": True, "step": 4}
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_000004"]


def test_a_failed_save_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    previous = save_checkpoint(tmp_path, 2, FakeEngine(), {}, keep_last=2)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 4, BrokenEngine(), {}, keep_last=2)
    assert not (tmp_path / CHECKPOINTS / "step_000004").exists()
    assert latest_checkpoint(tmp_path) == previous


def test_no_checkpoints(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert checkpoint_dirs(tmp_path / "missing") == []
    with pytest.raises(UserError, match="not a purplerl checkpoint"):
        read_state(tmp_path)
