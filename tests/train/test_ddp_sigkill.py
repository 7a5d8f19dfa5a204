"""A SIGKILL of one rank of `purplerl attack --engine.procs 2` stops the run (one line, no hang, non-zero exit);
`--resume` then continues it to the very adapter and logs of the same run left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ddp_cli import attack_cmd, cli_env
from safetensors.torch import load_file

pytestmark = pytest.mark.process
STEPS = 6


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the worker of `rank` among `parent`'s children (torchrun's agent runs in the parent)."""
    children = Path(f"/proc/{parent}/task/{parent}/children")
    for pid in children.read_text().split() if children.exists() else []:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def _metrics(run: Path) -> list[tuple[int, float]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [(row["step"], row["reward/mean"]) for row in map(json.loads, lines)]


def test_killed_rank_stops_the_run_and_resume_finishes_it(tiny_model_dir: Path, tmp_path: Path):
    env, out = cli_env(tmp_path / "cache"), tmp_path / "runs"
    extra = ("--engine.procs", "2", "--save_every", "2")
    proc = subprocess.Popen(attack_cmd(tiny_model_dir, out, "killed", STEPS, *extra), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run = out / "killed"
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and not (run / "checkpoints/step_000002").is_dir():
        time.sleep(0.05)
    victim = _rank_pid(proc.pid, 1)
    assert victim is not None, "no rank 1 worker found"
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)  # bounded: the survivor must not wait in a collective for its peer
    assert proc.returncode != 0
    assert "Traceback" not in err, err[-3000:]
    assert err.count(f"error: rank 1 was killed by SIGKILL; the other processes were stopped; continue with "
                     f"--resume {run}") == 1, err[-3000:]
    assert len([line for line in err.splitlines() if line.startswith("error:")]) <= 2  # + at most rank 0's own
    assert (run / "checkpoints/step_000002").is_dir()
    assert not (run / "checkpoints" / f"step_{STEPS:06d}").exists(), "the run finished before the kill"

    resumed = subprocess.run(attack_cmd(tiny_model_dir, out, "killed", STEPS, *extra)[:4] + ["--resume", str(run)],
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    alone = subprocess.run(attack_cmd(tiny_model_dir, out, "alone", STEPS, *extra), env=env, capture_output=True,
                           text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]

    assert _metrics(run) == _metrics(out / "alone")  # same prompts, same samples, same rewards at every step
    final = f"checkpoints/step_{STEPS:06d}/adapter_model.safetensors"
    got, want = load_file(run / final), load_file(out / "alone" / final)
    assert got.keys() == want.keys()
    assert all(got[k].equal(want[k]) for k in want)
