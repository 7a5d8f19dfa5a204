"""Atomic rolling checkpoints: `checkpoints/step_NNNNNN/` = a standard PEFT adapter dir + optimizer + loop state.

A checkpoint is written into `step_NNNNNN.tmp/`, every file is fsynced, a manifest of every file's size and
SHA-256 is written last, and only then is the directory renamed into place (with the directory fsynced before
and after the rename). A run killed, or a machine losing power, at any moment leaves the previous complete
checkpoints and at most one temporary directory, which the next start removes. On resume the manifest is
checked, so a checkpoint whose files were cut, emptied or edited afterwards is never loaded: the newest
checkpoint that passes is used, and the ones skipped are named with the reason.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError, UserError, first_line

CHECKPOINTS = "checkpoints"
STATE_FILE = "loop_state.json"
MANIFEST_FILE = "manifest.json"
_NAME = re.compile(r"^step_(\d{6,})$")
# leftovers of an interrupted save (.tmp) or removal (.del); never checkpoints, removed at the next start
_STALE = re.compile(r"^step_\d{6,}\.(tmp|del)$")


def _step_of(path: Path) -> int:
    return int(_NAME.match(path.name).group(1))


def checkpoint_candidates(run_dir: Path) -> list[Path]:
    """Directories named like a checkpoint, oldest first, whether intact or not."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _NAME.match(p.name) and p.is_dir()), key=_step_of)


def _sha256(path: Path) -> str:
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
        if _sha256(path) != expected.get("sha256"):
            return f"{name} does not match its checksum"
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
    except ValueError:
        return f"{STATE_FILE} is not JSON"
    if not isinstance(state, dict) or state.get("step") != _step_of(checkpoint):
        return f"{STATE_FILE} does not hold step {_step_of(checkpoint)}"
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


def remove_stale(run_dir: Path, keep_last: int | None = None) -> list[Path]:
    """Delete what interrupted saves and removals left behind and return it: temporaries, and, given
    `keep_last`, the intact checkpoints beyond the newest `keep_last` (a kill between a save and its rotation
    leaves one; a finished run saves nothing more, so only this would ever remove it)."""
    root = Path(run_dir) / CHECKPOINTS
    stale = [p for p in root.iterdir() if _STALE.match(p.name)] if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale + (prune_checkpoints(run_dir, keep_last) if keep_last is not None else [])


def prune_checkpoints(run_dir: Path, keep_last: int) -> list[Path]:
    """Remove every intact checkpoint but the newest `keep_last`; return the removed ones."""
    doomed = checkpoint_dirs(run_dir)[:-keep_last]
    for old in doomed:
        discard_checkpoint(old)
    return doomed


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entries to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it: errors (ENOSPC included) surface here as OSError, not later."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def discard_checkpoint(path: Path) -> None:
    """Remove a checkpoint dir so that no reader ever sees it half-deleted: rename first, then delete."""
    doomed = path.with_name(path.name + ".del")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _write_manifest(tmp: Path) -> None:
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for path in files:
        fsync_path(path)
    manifest = {"files": {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}}
    write_bytes_durably(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1).encode())
    for directory in sorted({p.parent for p in files} | {tmp}, key=lambda d: len(d.parts), reverse=True):
        fsync_path(directory)


def _is_disk_full(err: BaseException) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(err) for s in ("No space left", "StorageFull", "os error 28", "Disk quota")):
            return True
        err = err.__cause__ or err.__context__
    return False


def _save_failed(err: BaseException, root: Path, step: int) -> ExperimentError:
    free = shutil.disk_usage(root).free / 2**20
    previous = latest_checkpoint(root.parent)
    cause = "the disk is full" if _is_disk_full(err) else f"{type(err).__name__}: {first_line(err)}"
    kept = f"the newest intact checkpoint {previous.name} is kept" if previous else "no earlier checkpoint exists"
    return ExperimentError(f"step {step}: cannot write a checkpoint into {root} ({cause}; {free:.0f} MiB free): "
                           f"{kept}; free space, then continue with --resume {root.parent}")


def save_checkpoint(run_dir: Path, step: int, engine: Engine, state: dict[str, Any], keep_last: int,
                    writer: bool = True) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep_last` intact ones. Every process of a
    data-parallel run calls it: the engine's save is then a collective, and only the `writer` writes."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    if not writer:
        engine.save(tmp)  # hands this process's state to the writer; writes nothing
        return final
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        engine.save(tmp)
        write_bytes_durably(tmp / STATE_FILE, json.dumps({**state, "step": step}, indent=1).encode())
        _write_manifest(tmp)
    except Exception as err:  # cleanup first: a failed save must not leave its temp dir filling the disk
        shutil.rmtree(tmp, ignore_errors=True)
        # torch reports a failed write as RuntimeError, safetensors with its own error type
        if isinstance(err, (OSError, RuntimeError)) or _is_disk_full(err):
            raise _save_failed(err, root, step) from err
        raise
    if final.exists():  # a resume that fell back past a damaged checkpoint rewrites its step
        discard_checkpoint(final)
    os.rename(tmp, final)
    fsync_path(root)
    prune_checkpoints(run_dir, keep_last)
    return final


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


def describe_skipped(skipped: list[tuple[Path, str]]) -> str:
    return "; ".join(f"{path.name}: {reason}" for path, reason in skipped)

