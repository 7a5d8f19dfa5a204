"""JSONL sinks and the resume-time truncation of metrics.jsonl / samples.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purplerl.errors import ExperimentError
from purplerl.runs.logs import truncate_after_step
from purplerl.train.sinks import JsonlSink, read_jsonl


def test_sink_appends_rows_and_stringifies_non_finite(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "metrics.jsonl"
    sink = JsonlSink(path)  # creates the parent dir
    sink.write([{"step": 1, "reward/mean": 0.5}])
    sink.write([{"step": 2, "reward/mean": float("nan"), "kl/mean": float("inf")}, {"step": 2, "x": "y"}])
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[1]) == {"step": 2, "reward/mean": "nan", "kl/mean": "inf"}
    assert read_jsonl(path) == [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": "nan", "kl/mean": "inf"},
                                {"step": 2, "x": "y"}]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_truncate_after_step_drops_later_steps_and_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    rows = [{"step": s, "i": i} for s in (1, 2, 3, 4) for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "compl')  # killed mid-write
    truncate_after_step(path, 2)
    assert read_jsonl(path) == [r for r in rows if r["step"] <= 2]
    assert path.read_text().endswith("\n")


def test_truncate_keeps_every_complete_step_but_not_the_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 2, "rew')
    truncate_after_step(path, 10)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    truncate_after_step(path, 0)
    assert path.read_text() == ""
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_a_damaged_line_before_the_last_stops_the_cut_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    text = '{"step": 1}\n{"no_step": true}\n{"step": 2}\n'
    path.write_text(text)
    with pytest.raises(ExperimentError, match="metrics.jsonl line 2 is not a log record"):
        truncate_after_step(path, 1)
    assert path.read_text() == text


def test_truncate_of_a_missing_file_is_a_no_op(tmp_path: Path) -> None:
    truncate_after_step(tmp_path / "metrics.jsonl", 3)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_line_separator_inside_a_value_is_not_a_line_break(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    rows = [{"step": 1, "completion": "a\u2028b\u0085c"}, {"step": 2, "completion": "d"}]
    # written unescaped, as a log edited or produced by another tool may be
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert read_jsonl(path) == rows
    truncate_after_step(path, 1)
    assert read_jsonl(path) == rows[:1]
