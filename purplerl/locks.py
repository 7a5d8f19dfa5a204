"""One writer per directory: a run dir, a pipeline's or a sweep's --out, a cached model's build.

Two processes writing one run dir interleave their logs and overwrite each other's checkpoints, and both exit 0
(issue 34, HIGH-2). So each writer holds an exclusive `fcntl.flock` on a lock file inside the directory, taken
before it reads or cuts anything there; a second writer is refused in one line naming the holder (a build waits
for it instead). The kernel drops a flock when its holder dies, however it dies, so a SIGKILLed run never blocks
its own resume. The holder writes its pid, host and start time into the file, for the refusal's message, and
removes the file on exit; a file left by a holder that was killed is taken over with a one-line note.

A flock may not reach other hosts on a shared file system (NFS with local locks). A lock file left by a process
on another host, which this host cannot ask about, is refused with the path to remove once that process is gone.

The file is removed while still locked, and a writer that locked a file no longer at its path (removed by the
holder it waited for) locks the one there now instead: two writers never hold two different files.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from purplerl.errors import UserError

DIR_LOCK = ".lock"  # the lock file inside a locked directory


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _holder(fd: int) -> dict[str, Any] | None:
    """The pid, host and start time a lock file holds; None when it holds none (or not in this form)."""
    data = os.pread(fd, 4096, 0)
    try:
        holder = json.loads(data) if data.strip() else None
    except ValueError:
        return None
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None


def describe(holder: dict[str, Any] | None) -> str:
    """'pid 123 on HOST since TIME', or 'another process' for a holder that wrote nothing yet."""
    if holder is None:
        return "another process"
    return f"pid {holder['pid']} on {holder.get('host', '?')} since {holder.get('since', '?')}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _lock_in_place(path: Path, owner: str, waiting: str | None, notify: Callable[[str], None]) -> int:
    """An fd of `path` holding its flock, once `path` is still the file locked."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                if waiting is None:
                    raise UserError(f"{owner} is in use by {describe(holder)} (lock {path}): a second writer would "
                                    "interleave its files with the first; wait for it to end, or stop it") from None
                held_by = f"{describe(holder)}; " if holder is not None else ""
                notify(f"{waiting} ({held_by}lock {path})")
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass  # its holder removed it on exit: lock the file now in its place
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _take_over(fd: int, path: Path, owner: str, notify: Callable[[str], None]) -> None:
    """A pid and host left in the file by a holder that did not remove it: killed, on this host (its flock is
    gone, so it no longer holds it), or on another host, which this host cannot ask about."""
    left = _holder(fd)
    if left is None:
        return
    if left.get("host") != socket.gethostname():
        raise UserError(f"{owner} was locked by {describe(left)} (lock {path}), which this host cannot check: if "
                        f"that process has ended, remove {path} and run again")
    why = "no longer holds it" if _alive(left["pid"]) else "is no longer running"
    notify(f"note: took over {owner} from {describe(left)}, which {why} (lock {path})")


@contextmanager
def hold(path: Path, owner: str, waiting: str | None = None,
         notify: Callable[[str], None] = _to_stderr) -> Iterator[None]:
    """Hold the lock file `path` guarding `owner` (e.g. "run dir runs/x") for the block. Held by another process:
    a one-line UserError naming it, or with `waiting` (what to announce), announce and wait for it."""
    path = Path(path)
    fd = _lock_in_place(path, owner, waiting, notify)
    try:
        _take_over(fd, path, owner, notify)
    except BaseException:
        os.close(fd)  # the file stays as its holder left it
        raise
    try:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        yield
    finally:
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()  # while locked: whoever locks the removed file next sees it gone and retries
        except FileNotFoundError:
            pass
        os.close(fd)


@contextmanager
def hold_dir(directory: Path, owner: str, notify: Callable[[str], None] = _to_stderr) -> Iterator[None]:
    """Hold `directory`'s lock (DIR_LOCK inside it) for the block. The directory is created for its lock file and
    removed again, with the parents made for it, when the block leaves it empty: a run that failed to start
    leaves no dir behind."""
    directory = Path(directory)
    made = [d for d in (directory, *directory.parents) if not d.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create {owner}: {err.strerror}") from err
    try:
        with hold(directory / DIR_LOCK, owner, notify=notify):
            yield
    finally:
        for d in made:  # innermost first
            try:
                d.rmdir()
            except OSError:  # not empty: the command wrote into it
                break
