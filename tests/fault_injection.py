"""Run the purplerl CLI and SIGKILL it at the K-th file-system event inside one run directory.

    python tests/fault_injection.py --run-dir DIR --kill-at K --record FILE -- attack ...

An event is one write() to a file under DIR, a safetensors file written there, an fsync of a file or directory
there, a rename, a mkdir or a tree removal there. At event K the process first does half of the work where
that has a meaning (half of the bytes of a write, half of a safetensors file, one file of a tree removal),
then kills itself with SIGKILL: the state a power cut or an OOM kill leaves. Before dying it appends
"K kind path" to FILE; a process that finishes appends "done N" with its number of events. With
--kill-at 0 nothing is killed; --list-events records every event (the counting run).
"""

from __future__ import annotations

import argparse
import builtins
import io
import os
import shutil
import signal
import sys
from pathlib import Path


class Faults:
    def __init__(self, run_dir: Path, kill_at: int, record: Path, list_events: bool = False) -> None:
        self.root = str(run_dir.resolve())
        self.kill_at = kill_at
        self.record = record
        self.list_events = list_events
        self.events = 0

    def inside(self, path: object) -> bool:
        try:
            return os.path.abspath(os.fspath(path)).startswith(self.root)
        except TypeError:
            return False

    def event(self, kind: str, path: object, half_done=None) -> None:
        """Count an event; at the chosen one, do half of it and die."""
        self.events += 1
        if self.list_events:
            with builtins_open(self.record, "a") as f:
                f.write(f"{self.events} {kind} {os.path.relpath(os.fspath(path), self.root)}\n")
        if self.events != self.kill_at:
            return
        if half_done is not None:
            half_done()
        with builtins_open(self.record, "a") as f:
            f.write(f"{self.events} {kind} {os.path.relpath(os.fspath(path), self.root)}\n")
        os.kill(os.getpid(), signal.SIGKILL)

    def finish(self) -> None:
        with builtins_open(self.record, "a") as f:
            f.write(f"done {self.events}\n")


builtins_open = builtins.open


class WatchedFile:
    """A file object whose writes are events."""

    def __init__(self, faults: Faults, raw, path) -> None:
        self._faults, self._raw, self._path = faults, raw, path

    def write(self, data):
        def half() -> None:
            self._raw.write(data[: len(data) // 2])
            self._raw.flush()

        self._faults.event("write", self._path, half)
        return self._raw.write(data)

    def __enter__(self):
        self._raw.__enter__()
        return self

    def __exit__(self, *exc):
        return self._raw.__exit__(*exc)

    def __iter__(self):
        return iter(self._raw)

    def __getattr__(self, name):
        return getattr(self._raw, name)


def install(faults: Faults) -> None:
    def watched_open(file, mode="r", *args, **kwargs):
        raw = builtins_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax+") and faults.inside(file):
            return WatchedFile(faults, raw, file)
        return raw

    builtins.open = watched_open
    io.open = watched_open

    def wrap(module, name: str, kind: str, path_arg: int = 0, half=None) -> None:
        real = getattr(module, name)

        def watched(*args, **kwargs):
            path = args[path_arg] if len(args) > path_arg else None
            if path is not None and faults.inside(path):
                faults.event(kind, path, (lambda: half(real, *args, **kwargs)) if half else None)
            return real(*args, **kwargs)

        setattr(module, name, watched)

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if faults.inside(path):
            faults.event("fsync", path)
        real_fsync(fd)

    real_fsync = os.fsync
    os.fsync = fsync
    wrap(os, "rename", "rename")
    wrap(os, "replace", "replace")
    wrap(os, "mkdir", "mkdir")

    def remove_one_file(real, path, *args, **kwargs) -> None:
        first = next((p for p in Path(path).rglob("*") if p.is_file()), None)
        if first is not None:
            first.unlink()

    wrap(shutil, "rmtree", "rmtree", half=remove_one_file)

    import peft.peft_model
    import safetensors.torch

    def half_safetensors(real, tensors, filename, *args, **kwargs) -> None:
        data = safetensors.torch.save(tensors, *args, **kwargs)
        with builtins_open(filename, "wb") as f:
            f.write(data[: len(data) // 2])

    wrap(peft.peft_model, "safe_save_file", "safetensors", path_arg=1, half=half_safetensors)


def main() -> None:
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--kill-at", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--list-events", action="store_true", help="append every event to --record (counting run)")
    args = parser.parse_args(sys.argv[1:split])
    faults = Faults(args.run_dir, args.kill_at, args.record, args.list_events)
    install(faults)
    from purplerl.cli import app

    sys.argv = ["purplerl", *sys.argv[split + 1:]]
    try:
        app()
    except SystemExit as exit_:
        faults.finish()
        raise exit_


if __name__ == "__main__":
    main()
