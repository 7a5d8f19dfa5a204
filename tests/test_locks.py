"""purplerl.locks: one writer per directory. A second holder is refused in one line naming the first (flock
conflicts between two open files of one process too, so these run in-process); a lock file a killed holder left is
taken over with one note; one left by another host is refused; the file and a dir made for it go on release."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from pathlib import Path

import pytest

from purplerl.errors import UserError
from purplerl.locks import DIR_LOCK, hold, hold_dir

HOST = socket.gethostname()


def dead_pid() -> int:
    """A pid no process has now."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_a_second_holder_is_refused_in_one_line_naming_the_first(tmp_path: Path) -> None:
    lock = tmp_path / "run" / DIR_LOCK
    with hold_dir(tmp_path / "run", "run dir X"):
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == HOST
        with pytest.raises(UserError) as refused:
            with hold(lock, "run dir X"):
                pytest.fail("a second holder got the lock")
        message = str(refused.value)
        assert "\n" not in message
        assert re.fullmatch(rf"run dir X is in use by pid {os.getpid()} on {re.escape(HOST)} since \S+ "
                            rf"\(lock {re.escape(str(lock))}\): .*wait for it to end, or stop it", message), message
        assert json.loads(lock.read_text()) == holder  # the refused one wrote nothing
    assert not lock.exists()
    with hold_dir(tmp_path / "run", "run dir X"):  # released: the next writer gets it
        pass


def test_a_dir_made_for_the_lock_is_removed_when_left_empty(tmp_path: Path) -> None:
    target = tmp_path / "runs" / "new"
    with pytest.raises(RuntimeError):
        with hold_dir(target, "run dir new"):
            assert (target / DIR_LOCK).is_file()
            raise RuntimeError("setup failed")
    assert not (tmp_path / "runs").exists()  # a run that failed to start claims no name
    with hold_dir(target, "run dir new"):
        (target / "config.yaml").write_text("x")
    assert sorted(p.name for p in target.iterdir()) == ["config.yaml"]


def test_the_lock_of_a_killed_holder_on_this_host_is_taken_over_with_one_note(tmp_path: Path) -> None:
    lock = tmp_path / DIR_LOCK
    pid = dead_pid()
    lock.write_text(json.dumps({"pid": pid, "host": HOST, "since": "2026-01-01T00:00:00+0000"}))
    notes: list[str] = []
    with hold(lock, "run dir X", notify=notes.append):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert notes == [f"note: took over run dir X from pid {pid} on {HOST} since 2026-01-01T00:00:00+0000, which "
                     f"is no longer running (lock {lock})"]


def test_a_lock_file_left_on_another_host_is_refused_naming_the_file(tmp_path: Path) -> None:
    lock = tmp_path / DIR_LOCK
    left = {"pid": os.getpid(), "host": "node-elsewhere", "since": "2026-01-01T00:00:00+0000"}
    lock.write_text(json.dumps(left))
    with pytest.raises(UserError, match=rf"was locked by pid {os.getpid()} on node-elsewhere since .*this host "
                                        rf"cannot check: if that process has ended, remove {re.escape(str(lock))}"):
        with hold(lock, "pipeline dir X"):
            pass
    assert json.loads(lock.read_text()) == left  # not taken over


def test_a_waiter_locks_the_file_in_place_after_its_holder_removed_its_own(tmp_path: Path) -> None:
    """The holder removes its file on release. A waiter whose flock came on that removed file would hold a lock
    nobody else sees: it must lock the file now at the path instead (and say once that it waited)."""
    lock = tmp_path / "build.lock"
    notes: list[str] = []
    seen: list[dict] = []

    def waiter() -> None:
        with hold(lock, "the build of m", waiting="waiting for another process that is building m",
                  notify=notes.append):
            seen.append(json.loads(lock.read_text()))  # the file at the path is the one held

    with hold(lock, "the build of m"):
        thread = threading.Thread(target=waiter)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not seen
    thread.join(10)
    assert seen and seen[0]["pid"] == os.getpid() and not lock.exists()
    assert len(notes) == 1
    assert notes[0].startswith(f"waiting for another process that is building m (pid {os.getpid()} on {HOST} since ")
