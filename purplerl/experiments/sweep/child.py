"""`python -m purplerl.experiments.sweep.child PROGRAM ARGS...`: run PROGRAM in this process, to be ended with
SIGTERM when the process that started it dies.

A sweep's run is a subprocess of a Ray worker. When the sweep is stopped (Ctrl-C, `ray stop`, a cancelled task,
the driver killed) Ray ends its workers, and a run left orphaned would go on holding cores that the next sweep is
counting on. Linux's PR_SET_PDEATHSIG does it; elsewhere the run goes on after its worker (said in the README).
Set here rather than in `subprocess.Popen(preexec_fn=...)`, which may deadlock in a process with threads as a Ray
worker has.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the parent exits; exit now when the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the request was in place
        sys.exit(143)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m purplerl.experiments.sweep.child PROGRAM ARGS...")
    die_with_parent()
    os.execv(argv[0], argv)  # the request survives exec: the kernel keeps it for the new program


if __name__ == "__main__":
    main(sys.argv[1:])
