"""purplerl.files: one-line errors naming file and line, cut tails, and file names that stay in their dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from purplerl.errors import UserError
from purplerl.files import (
    plain_name_problem,
    read_json,
    read_json_object,
    read_jsonl,
    read_text,
    safe_file_stem,
    unicode_problem,
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
