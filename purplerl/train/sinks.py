"""Append-only JSONL sinks for metrics.jsonl and samples.jsonl."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from purplerl import files
from purplerl.errors import ExperimentError


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN; the loop already stopped on it, this keeps the record readable
    return value


class JsonlSink:
    """One JSON object per line, flushed after every write so a killed run loses nothing it logged.

    A kill in the middle of a write leaves at most a torn last line; a resume drops it together with every
    row after the checkpoint it continues from (`truncate_after_step`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, rows: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n" for row in rows)
        try:
            with open(self.path, "a") as f:
                f.write(text)
        except OSError as err:
            raise ExperimentError(f"cannot append to {self.path}: {err.strerror or err}") from None

    def sync(self) -> None:
        """fsync the file: called before a checkpoint, so no checkpoint is ever newer than the logs on disk."""
        if self.path.is_file():
            with open(self.path, "rb") as f:
                os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's log ([] when it does not exist yet); a torn last line is dropped."""
    path = Path(path)
    return files.read_jsonl(path, cut_tail=True) if path.is_file() else []


def _lines(path: Path) -> list[str]:
    # split on "\n" only: json.dumps escapes every other line break, and str.splitlines would also cut U+2028
    return [line for line in path.read_bytes().decode("utf-8", errors="replace").split("\n") if line.strip()]


def _step_of(line: str) -> int | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def last_logged_step(path: Path) -> int:
    """The highest step recorded in a log (0 when there is none)."""
    path = Path(path)
    if not path.is_file():
        return 0
    steps = [_step_of(line) for line in _lines(path)]
    return max((s for s in steps if s is not None), default=0)


def truncate_after_step(path: Path, step: int) -> None:
    """Drop records of steps after `step`: on resume they are recomputed, exactly as before the kill.

    The kept lines go to a new file that replaces the old one in one rename, so a kill during the cut leaves
    either the old log or the cut one. Only the last line may be torn (a kill mid-write); any other line
    that is not a record with a step means the file was damaged by something else, and stops the resume."""
    path = Path(path)
    if not path.is_file():
        return
    lines = _lines(path)
    kept = []
    for i, line in enumerate(lines):
        row_step = _step_of(line)
        if row_step is None:
            if i == len(lines) - 1:
                break  # a line cut by the kill mid-write
            raise ExperimentError(f"{path} line {i + 1} is not a log record; repair or remove the line to resume")
        if row_step <= step:
            kept.append(line)
    new = path.with_name(path.name + ".tmp")
    with open(new, "w") as f:
        f.write("".join(line + "\n" for line in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(new, path)
