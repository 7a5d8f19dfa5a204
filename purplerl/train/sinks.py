"""Append-only JSONL sinks for metrics.jsonl and samples.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN; the loop already stopped on it, this keeps the record readable
    return value


class JsonlSink:
    """One JSON object per line, flushed after every write so a killed run loses nothing it logged."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, rows: list[dict[str, Any]]) -> None:
        with open(self.path, "a") as f:
            for row in rows:
                f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_after_step(path: Path, step: int) -> None:
    """Drop records of steps after `step`: on resume they are recomputed, exactly as before the kill."""
    path = Path(path)
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError):
            continue  # a line cut by the kill mid-write
    path.write_text("".join(line + "\n" for line in kept))
