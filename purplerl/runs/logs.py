"""Reading and cutting back a run's step logs (metrics.jsonl, samples.jsonl, evals.jsonl) on resume."""

from __future__ import annotations

import json
from pathlib import Path

from purplerl.errors import ExperimentError
from purplerl.files import write_durably


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

    The kept lines replace the old file in one rename, so a kill during the cut leaves either the old log or
    the cut one. Only the last line may be torn (a kill mid-write); any other line that is not a record with a
    step means the file was damaged by something else, and stops the resume."""
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
    write_durably(path, "".join(line + "\n" for line in kept))
