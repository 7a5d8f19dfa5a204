"""Append-only JSONL sinks for metrics.jsonl and samples.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from purplerl import files
from purplerl.errors import ExperimentError
from purplerl.files import fsync_path


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN; the loop already stopped on it, this keeps the record readable
    return value


class JsonlSink:
    """One JSON object per line, flushed after every write so a killed run loses nothing it logged.

    A kill in the middle of a write leaves at most a torn last line; a resume drops it together with every
    row after the checkpoint it continues from (`runs.logs.truncate_after_step`)."""

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
            fsync_path(self.path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's log ([] when it does not exist yet); a torn last line is dropped."""
    path = Path(path)
    return files.read_jsonl(path, cut_tail=True) if path.is_file() else []
