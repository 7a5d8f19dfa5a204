"""Reading a run's checkpoints: which exist, which are intact, and the loop state one holds.

A checkpoint is trusted only when every file matches the manifest written last into it (`train.checkpoint`
writes them), so a checkpoint whose files were cut, emptied or edited afterwards is never loaded: the newest
one that passes is used, and the ones skipped are named with the reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from purplerl.errors import UserError
from purplerl.runs.layout import CHECKPOINTS_DIR, MANIFEST_FILE, STATE_FILE

_NAME = re.compile(r"^step_(\d{6,})$")


def step_of(path: Path) -> int:
    """The step of a checkpoint dir named step_NNNNNN."""
    return int(_NAME.match(path.name).group(1))


def checkpoint_candidates(run_dir: Path) -> list[Path]:
    """Directories named like a checkpoint, oldest first, whether intact or not."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _NAME.match(p.name) and p.is_dir()), key=step_of)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be trusted (one phrase), or None when every file matches its manifest."""
    checkpoint = Path(checkpoint)
    try:
        manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST_FILE} (its write never finished)"
    except (OSError, ValueError):
        return f"{MANIFEST_FILE} is unreadable"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or STATE_FILE not in files:
        return f"{MANIFEST_FILE} does not list the checkpoint's files"
    for name, expected in files.items():
        path = checkpoint / name
        if not isinstance(expected, dict) or Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{MANIFEST_FILE} has a bad entry for {name!r}"
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected.get("size"):
            return f"{name} is {size} bytes, the manifest says {expected.get('size')}"
        if sha256_of(path) != expected.get("sha256"):
            return f"{name} does not match its checksum"
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
    except ValueError:
        return f"{STATE_FILE} is not JSON"
    if not isinstance(state, dict) or state.get("step") != step_of(checkpoint):
        return f"{STATE_FILE} does not hold step {step_of(checkpoint)}"
    return None


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Intact checkpoints of a run, oldest first."""
    return [p for p in checkpoint_candidates(run_dir) if verify_checkpoint(p) is None]


def latest_checkpoint(run_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def newest_intact(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest intact checkpoint, and every newer one that was skipped with the reason."""
    skipped: list[tuple[Path, str]] = []
    for path in reversed(checkpoint_candidates(run_dir)):
        reason = verify_checkpoint(path)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def describe_skipped(skipped: list[tuple[Path, str]]) -> str:
    return "; ".join(f"{path.name}: {reason}" for path, reason in skipped)


def read_state(checkpoint: Path) -> dict[str, Any]:
    path = Path(checkpoint) / STATE_FILE
    if not path.is_file():
        raise UserError(f"{checkpoint} is not a purplerl checkpoint (no {STATE_FILE})")
    try:
        state = json.loads(path.read_text())
    except ValueError:
        raise UserError(f"{path} is not JSON") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise UserError(f"{path} does not hold a step number")
    return state
