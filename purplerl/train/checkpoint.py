"""Atomic rolling checkpoints: `checkpoints/step_NNNNNN/` = a standard PEFT adapter dir + optimizer + loop state.

A checkpoint is written into `step_NNNNNN.tmp/` and renamed into place, so a run killed at any moment
leaves either the previous complete checkpoint or the new complete one, never a half-written one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from purplerl.engines.base import Engine
from purplerl.errors import UserError

CHECKPOINTS = "checkpoints"
STATE_FILE = "loop_state.json"
_NAME = re.compile(r"^step_(\d{6,})$")


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (a `.tmp` dir is an interrupted write, ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(run_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def save_checkpoint(run_dir: Path, step: int, engine: Engine, state: dict[str, Any], keep_last: int) -> Path:
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    engine.save(tmp)
    with open(tmp / STATE_FILE, "w") as f:
        json.dump({**state, "step": step}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in checkpoint_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(checkpoint: Path) -> dict[str, Any]:
    path = Path(checkpoint) / STATE_FILE
    if not path.is_file():
        raise UserError(f"{checkpoint} is not a purplerl checkpoint (no {STATE_FILE})")
    return json.loads(path.read_text())
