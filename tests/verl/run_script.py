"""Running an exported run_verl.sh where veRL is not installed: a stand-in `python3` first on PATH records the
arguments the script would launch veRL's trainer with, and exits with the code the test asks for."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# one argument a line: no test dir name holds a newline
FAKE_PYTHON = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$RECORDED_ARGV"
exit "${FAKE_PYTHON_RC:-0}"
"""


@dataclass(frozen=True)
class Launch:
    returncode: int
    stderr: str
    argv: list[str] | None  # None: the script never launched the trainer


def run_script(export_dir: Path, *args: str, work: Path, python_rc: int = 0) -> Launch:
    """Runs export_dir/run_verl.sh with `args`, the stand-in python3 in work/bin."""
    fake_bin, recorded = work / "bin", work / "argv.txt"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "python3").write_text(FAKE_PYTHON)
    (fake_bin / "python3").chmod(0o755)
    recorded.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "RECORDED_ARGV": str(recorded),
           "FAKE_PYTHON_RC": str(python_rc)}
    done = subprocess.run([str(export_dir / "run_verl.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=30)
    argv = recorded.read_text().splitlines() if recorded.exists() else None
    return Launch(done.returncode, done.stderr, argv)
