"""One writer per run dir, pipeline dir and sweep dir (issue 34, HIGH-2): a resume of a run still training, a second
start of one run, a second pipeline or sweep into one --out each end in one line naming the holder (exit 2) and
leave the dir alone; once the holder is SIGKILLed, a resume takes its lock over with one note and continues.

A flock conflicts between two open files of one process too, so the refusals are shown in-process with the lock
held by the test; the process tier shows them between two real processes, the first one training."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from purplerl.locks import DIR_LOCK, hold_dir
from tests.conftest import invoke_cli

HOST = socket.gethostname()
ARGS = ["--batch_size", "2", "--group_size", "2", "--max_new_tokens", "6", "--seed", "3", "--save_every", "2",
        "--logging.progress", "false"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refusal(stderr: str, owner: str, pid: int) -> None:
    """`stderr` is the one line refusing a second writer of `owner`, naming holder `pid` on this host."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert re.fullmatch(rf"error: {re.escape(owner)} is in use by pid {pid} on {re.escape(HOST)} since \S+ \(lock "
                        rf".*{re.escape(DIR_LOCK)}\): a second writer would interleave its files with the first; "
                        r"wait for it to end, or stop it", lines[0]), lines[0]


def test_a_resume_or_a_second_start_of_a_locked_run_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    first = invoke_cli("attack", "--model", tiny_model_dir, "--steps", "2", *ARGS, "--output_dir", tmp_path,
                       "--name", "r")
    assert first.returncode == 0, first.stderr
    run = tmp_path / "r"
    with hold_dir(run, "run dir (the test)"):
        before = snapshot(run)
        resumed = invoke_cli("attack", "--resume", run, "--steps", "4")
        assert resumed.returncode == 2
        refusal(resumed.stderr, f"run dir {run}", os.getpid())
        again = invoke_cli("attack", "--model", tiny_model_dir, "--steps", "2", *ARGS, "--output_dir", tmp_path,
                           "--name", "r")
        assert again.returncode == 2
        refusal(again.stderr, f"run dir {run}", os.getpid())
        assert snapshot(run) == before
    assert invoke_cli("attack", "--resume", run, "--steps", "4").returncode == 0  # released: it resumes


def test_a_second_pipeline_or_sweep_into_one_out_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"prompt": "hello", "completion": "thanks again"}) + "\n")
    pipeline, out = tmp_path / "pipeline.yaml", tmp_path / "pipeline"
    pipeline.write_text(yaml.safe_dump({"model": str(tiny_model_dir), "stages": [
        {"name": "sft", "kind": "sft", "config": {"data": {"source": str(data)}}}]}))
    with hold_dir(out, "pipeline dir (the test)"):
        result = invoke_cli("pipeline", pipeline, "--out", out)
        assert result.returncode == 2
        refusal(result.stderr, f"pipeline dir {out.resolve()}", os.getpid())
        assert sorted(p.name for p in out.iterdir()) == [DIR_LOCK]  # no history.json: nothing read or written

    sweep = tmp_path / "sweep"
    with hold_dir(sweep, "sweep dir (the test)"):
        result = invoke_cli("sweep", "--recipe", "attack", "--out", sweep, "--grid", "lr=1e-5,3e-5",
                            "--fixed", f"model.name={tiny_model_dir}")
        assert result.returncode == 2
        refusal(result.stderr, f"sweep dir {sweep.resolve()}", os.getpid())
        assert sorted(p.name for p in sweep.iterdir()) == [DIR_LOCK]  # no sweep.json, configs/, runs/


def cli_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PURPLERL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def steps(run: Path) -> list[int]:
    """The logged steps (of whole lines: the last one may be mid-write)."""
    lines = (run / "metrics.jsonl").read_text().split("\n")[:-1]
    return [json.loads(line)["step"] for line in lines if line.strip()]


def wait_for_training(proc: subprocess.Popen, run: Path, timeout: float = 240) -> None:
    """Until `proc` has saved its first checkpoint and logged a step past it: a resume would have work to cut."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        logged = steps(run) if (run / "metrics.jsonl").is_file() else []
        if (run / "checkpoints" / "step_000002").is_dir() and len(logged) >= 3:
            return
        time.sleep(0.2)
    raise AssertionError(f"the first run did not get past step 3 (exit {proc.poll()})")


@pytest.mark.process
def test_a_second_writer_of_a_training_run_is_refused_until_the_first_is_killed(tiny_model_dir: Path,
                                                                                tmp_path: Path) -> None:
    env, run = cli_env(tmp_path / "cache"), tmp_path / "r"
    start = [sys.executable, "-m", "purplerl", "attack", "--model", str(tiny_model_dir), "--steps", "100000", *ARGS,
             "--output_dir", str(tmp_path), "--name", "r"]
    first = subprocess.Popen(start, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_training(first, run)
        settings = {name: (run / name).read_bytes() for name in ("config.yaml", "config_history.jsonl")}
        for second in ([sys.executable, "-m", "purplerl", "attack", "--resume", str(run)], start):
            done = subprocess.run(second, env=env, capture_output=True, text=True, timeout=180)
            assert done.returncode == 2, done.stderr
            refusal(done.stderr, f"run dir {run}", first.pid)
        assert first.poll() is None  # still training, its files its own
        assert {name: (run / name).read_bytes() for name in settings} == settings
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    logged = steps(run)
    assert logged == list(range(1, len(logged) + 1))  # no step cut or logged twice
    # the newest whole checkpoint (a kill mid-rotation may leave a step_N.del or a step_N.tmp beside them)
    last = max(int(m[1]) for p in (run / "checkpoints").iterdir() if (m := re.fullmatch(r"step_(\d+)", p.name)))
    resumed = subprocess.run([sys.executable, "-m", "purplerl", "attack", "--resume", str(run), "--steps",
                              str(last + 1)], env=env, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    notes = [line for line in resumed.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith(f"note: took over run dir {run} from pid {first.pid} on {HOST}")
    assert notes[0].endswith(f"which is no longer running (lock {run / DIR_LOCK})")
    assert steps(run) == list(range(1, last + 2)) and not (run / DIR_LOCK).exists()
