"""Writing atomic rolling checkpoints: `checkpoints/step_NNNNNN/` = a standard PEFT adapter dir + optimizer + loop
state.

A checkpoint is written into `step_NNNNNN.tmp/`, every file is fsynced, a manifest of every file's size and
SHA-256 is written last, and only then is the directory renamed into place (`files.replace_dir_durably`: the
directories fsynced before and after the rename). A run killed, or a machine losing power, at any moment leaves
the previous complete checkpoints and at most one temporary directory, which the next start removes. Reading
them back, manifest checked, is `runs.checkpoints`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError, first_line
from purplerl.files import fsync_path, replace_dir_durably, write_synced
from purplerl.runs.checkpoints import checkpoint_dirs, latest_checkpoint, sha256_of
from purplerl.runs.layout import CHECKPOINTS_DIR, MANIFEST_FILE, STATE_FILE, checkpoint_name

# leftovers of an interrupted save (.tmp) or removal (.del); never checkpoints, removed at the next start
_STALE = re.compile(r"^step_\d{6,}\.(tmp|del)$")


def remove_stale(run_dir: Path, keep_last: int | None = None) -> list[Path]:
    """Delete what interrupted saves and removals left behind and return it: temporaries, and, given
    `keep_last`, the intact checkpoints beyond the newest `keep_last` (a kill between a save and its rotation
    leaves one; a finished run saves nothing more, so only this would ever remove it)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
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


def discard_checkpoint(path: Path) -> None:
    """Remove a checkpoint dir so that no reader ever sees it half-deleted: rename first, then delete."""
    doomed = path.with_name(path.name + ".del")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _write_manifest(tmp: Path) -> None:
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for path in files:  # here, not only at the rename: a full disk fails the save while its cleanup runs
        fsync_path(path)
    manifest = {"files": {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in files}}
    write_synced(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1))


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
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / checkpoint_name(step)
    tmp = root / f"{checkpoint_name(step)}.tmp"
    if not writer:
        engine.save(tmp)  # hands this process's state to the writer; writes nothing
        return final
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        engine.save(tmp)
        write_synced(tmp / STATE_FILE, json.dumps({**state, "step": step}, indent=1))
        _write_manifest(tmp)
    except Exception as err:  # cleanup first: a failed save must not leave its temp dir filling the disk
        shutil.rmtree(tmp, ignore_errors=True)
        # torch reports a failed write as RuntimeError, safetensors with its own error type
        if isinstance(err, (OSError, RuntimeError)) or _is_disk_full(err):
            raise _save_failed(err, root, step) from err
        raise
    if final.exists():  # a resume that fell back past a damaged checkpoint rewrites its step
        discard_checkpoint(final)
    replace_dir_durably(tmp, final)
    prune_checkpoints(run_dir, keep_last)
    return final
