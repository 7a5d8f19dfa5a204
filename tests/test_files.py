"""purplerl.files: one-line errors naming file and line, cut tails, file names that stay in their dir, and the
durable writes (a file or a directory replaced in one rename, everything fsynced first and the rename after)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from purplerl.errors import UserError
from purplerl.files import (
    plain_name_problem,
    read_json,
    read_json_object,
    read_jsonl,
    read_text,
    replace_dir_durably,
    safe_file_stem,
    unicode_problem,
    write_durably,
)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_read_jsonl_skips_blank_lines_and_a_bom_and_keeps_crlf_rows(tmp_path: Path):
    path = _write(tmp_path / "r.jsonl", b'\xef\xbb\xbf{"a": 1}\r\n\n  \n{"a": "\xc3\xa9"}\r\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": "\u00e9"}]


@pytest.mark.parametrize(("data", "message"), [
    (b'{"a": 1}\n{"a": 2}\n\xff\xfe{"a": 3}\n',
     ":3: line 3 is not UTF-8 text (byte 0xff at column 1); save the file as UTF-8"),
    (b'{"a": 1}\n{"a": "\xe9t\xe9"}\n', ":2: line 2 is not UTF-8 text (byte 0xe9 at column 8)"),
    (b'{"a": 1}\n\n{"a": }\n', ":3: invalid JSON (Expecting value)"),
    (b'{"a": 1}\n[1, 2]\n', ":2: expected a JSON object, got an array"),
    (b'"x"\n', ":1: expected a JSON object, got a string"),
    (b'{"a": 1}\n3\n', ":2: expected a JSON object, got a number"),
    (b"null\n", ":1: expected a JSON object, got null"),
])
def test_read_jsonl_errors_name_file_and_line(tmp_path: Path, data: bytes, message: str):
    path = _write(tmp_path / "r.jsonl", data)
    with pytest.raises(UserError) as info:
        read_jsonl(path)
    assert str(info.value).startswith(f"{path}{message}"), str(info.value)


def test_cut_tail_drops_only_an_unfinished_last_line(tmp_path: Path):
    cut = _write(tmp_path / "cut.jsonl", b'{"a": 1}\n{"a": 2}\n{"a": "\xc3')
    assert read_jsonl(cut, cut_tail=True) == [{"a": 1}, {"a": 2}]
    with pytest.raises(UserError, match=":3: line 3 is not UTF-8"):
        read_jsonl(cut)
    # a bad line that did get its newline was written whole: refused even with cut_tail
    with pytest.raises(UserError, match=":2: invalid JSON"):
        read_jsonl(_write(tmp_path / "nl.jsonl", b'{"a": 1}\n{"a": \n'), cut_tail=True)
    middle = _write(tmp_path / "middle.jsonl", b'{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(UserError, match=":2: invalid JSON"):
        read_jsonl(middle, cut_tail=True)
    # a whole value that is not an object is no cut write
    array = _write(tmp_path / "array.jsonl", b'{"a": 1}\n[1]')
    with pytest.raises(UserError, match=":2: expected a JSON object, got an array"):
        read_jsonl(array, cut_tail=True)


def test_read_text_and_json_name_the_line(tmp_path: Path):
    path = _write(tmp_path / "c.json", b'{\n  "a": 1,\n  "b": "\xff"\n}\n')
    with pytest.raises(UserError, match=r"c.json:3: line 3 is not UTF-8 text \(byte 0xff at column 9\)"):
        read_text(path)
    _write(path, b'{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(UserError, match=r"c.json:4: invalid JSON \(Expecting value\)"):
        read_json(path)
    _write(path, b"[1, 2]")
    assert read_json(path) == [1, 2]
    with pytest.raises(UserError, match=r"c.json: expected a JSON object, got an array"):
        read_json_object(path)
    with pytest.raises(UserError, match=r"file not found: .*missing.json"):
        read_json(tmp_path / "missing.json")


@pytest.mark.parametrize("text", ["../../x/evil", "/etc/passwd", "..", ".", "", ".hidden", "a/b", "a\\b", "a\x00b",
                                  "x" * 300, "reward", "completion_length", "kl.v2"])
def test_safe_file_stem_is_one_component_inside_its_dir(tmp_path: Path, text: str):
    stem = safe_file_stem(text)
    target = (tmp_path / f"{stem}.png").resolve()
    assert target.parent == tmp_path.resolve()
    assert "/" not in stem and "\\" not in stem and "\x00" not in stem and not stem.startswith(".")
    assert len(stem) <= 100
    if text in ("reward", "completion_length", "kl.v2"):
        assert stem == text  # names that are already safe stay readable


def test_safe_file_stem_keeps_different_texts_apart():
    texts = ["a/b", "a_b", "a\\b", "a b", "../a_b", ".a_b"]
    assert len({safe_file_stem(t) for t in texts}) == len(texts)


@pytest.mark.parametrize("name", ["../x", "/tmp/x", ".", "..", "a/b", "a\\b", "a\x00b", "-rf", ".x", "", "x" * 129])
def test_plain_name_problem_refuses_paths(name: str):
    assert plain_name_problem(name)


@pytest.mark.parametrize("name", ["r1", "007", "_x", "attack_m_lr1e-05_kl0.1_s0", "a+b=c,d@e", "x" * 128])
def test_plain_name_problem_accepts_plain_names(name: str):
    assert plain_name_problem(name) is None


def test_unicode_problem_finds_lone_surrogates():
    assert unicode_problem("caf\u00e9 \u2028 \U0001f600") is None
    assert unicode_problem("ab\ud800c").startswith("holds '\\ud800' at character 3, a lone surrogate")


def _record_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What is fsynced and renamed, in order: the path each fsync'd fd names, "RENAME <dst>" per rename."""
    events: list[str] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def renaming(real):
        def rename(src, dst) -> None:
            events.append(f"RENAME {dst}")
            real(src, dst)
        return rename

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", renaming(real_replace))
    monkeypatch.setattr(os, "rename", renaming(real_rename))
    return events


def test_write_durably_replaces_the_content_and_leaves_no_temporary(tmp_path: Path):
    path = tmp_path / "summary.json"
    write_durably(path, "old")
    write_durably(path, b"new \xff bytes")
    assert path.read_bytes() == b"new \xff bytes"
    write_durably(path, "caf\u00e9\n")
    assert path.read_bytes() == "caf\u00e9\n".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_write_durably_gives_a_new_file_the_permissions_open_would(tmp_path: Path):
    write_durably(tmp_path / "a", "x")
    (tmp_path / "b").write_text("x")
    assert (tmp_path / "a").stat().st_mode == (tmp_path / "b").stat().st_mode


def test_a_failure_before_the_rename_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "config.yaml"
    path.write_text("old: 1\n")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_durably(path, "new: 2\n")
    assert path.read_text() == "old: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # the temporary is removed


def test_write_durably_fsyncs_the_file_then_renames_then_fsyncs_the_dir(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    events = _record_syncs(monkeypatch)
    path = tmp_path / "metrics.jsonl"
    write_durably(path, "{}\n")
    assert len(events) == 3 and events[1] == f"RENAME {path}"
    tmp = Path(events[0])
    assert tmp.parent == tmp_path and tmp.name.startswith("metrics.jsonl.") and tmp.name.endswith(".tmp")
    assert events[2] == str(tmp_path)  # the rename itself is made durable


def test_replace_dir_durably_fsyncs_every_file_and_dir_before_the_rename(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    tmp, target = tmp_path / "model.tmp", tmp_path / "model"
    (tmp / "sub").mkdir(parents=True)
    (tmp / "config.json").write_text("{}")
    (tmp / "sub" / "weights.bin").write_bytes(b"w")
    events = _record_syncs(monkeypatch)
    replace_dir_durably(tmp, target)
    rename = events.index(f"RENAME {target}")
    assert set(events[:rename]) == {f"{tmp}/config.json", f"{tmp}/sub/weights.bin", f"{tmp}/sub", str(tmp)}
    assert events[rename + 1:] == [str(tmp_path)]
    assert (target / "sub" / "weights.bin").read_bytes() == b"w" and not tmp.exists()


def test_replace_dir_durably_refuses_a_target_that_holds_something(tmp_path: Path):
    tmp, target = tmp_path / "new.tmp", tmp_path / "done"
    tmp.mkdir()
    (tmp / "a").write_text("new")
    target.mkdir()
    (target / "a").write_text("old")
    with pytest.raises(OSError):
        replace_dir_durably(tmp, target)
    assert (target / "a").read_text() == "old" and (tmp / "a").read_text() == "new"
