"""A run SIGKILLed mid-way and resumed with `purplerl attack --resume` equals the same run left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.process

STEPS, SAVE_EVERY = 6, 2
FINAL = f"step_{STEPS:06d}"


def cli_env(cache: Path) -> dict[str, str]:
    # one torch thread: the tiny model gains nothing from more, and the commands here run side by side
    return {**os.environ, "PURPLERL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


def attack_cmd(model_dir: Path, output_dir: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "purplerl.cli", "attack", "--model", str(model_dir), "--steps", str(STEPS),
            "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "8", "--seed", "7",
            "--save_every", str(SAVE_EVERY), "--output_dir", str(output_dir), "--name", name,
            "--logging.progress", "false"]


def resume_cmd(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "purplerl.cli", "attack", "--resume", str(run_dir)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.is_file() else 0


def kill_mid_run(proc: subprocess.Popen, run_dir: Path, timeout: float = 240) -> None:
    """SIGKILL `proc` once it is past its first checkpoint, ideally with a logged step the checkpoint lacks.

    Killing after step 3 is logged (step 2 is the latest checkpoint) makes the resume drop and redo a
    logged step; a step_000004 checkpoint also counts, in case the poll is slow. Either leaves work to do.
    """
    checkpoints = run_dir / "checkpoints"
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        past_first = (checkpoints / "step_000002").is_dir()
        if (past_first and _lines(run_dir / "metrics.jsonl") >= 3) or (checkpoints / "step_000004").is_dir():
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it could be killed: {err[-2000:]}"
    assert (checkpoints / "step_000002").is_dir(), f"killed before the first checkpoint: {err[-2000:]}"


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Run A uninterrupted; run B killed after a checkpoint, then resumed. Both start together."""
    env = cli_env(tmp_path_factory.mktemp("purplerl_cache"))
    out = tmp_path_factory.mktemp("resume_runs")
    run_a, run_b = out / "a", out / "b"
    proc_a = subprocess.Popen(attack_cmd(tiny_model_dir, out, "a"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    proc_b = subprocess.Popen(attack_cmd(tiny_model_dir, out, "b"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        kill_mid_run(proc_b, run_b)
        killed_at = sorted(p.name for p in (run_b / "checkpoints").iterdir())
        # an interrupted checkpoint write leaves a .tmp dir; a resume must not take it for a checkpoint
        fake = run_b / "checkpoints" / "step_000099.tmp"
        fake.mkdir(exist_ok=True)
        (fake / "loop_state.json").write_text(json.dumps({"step": 99, "finished": True, "stop_reason": None}))
        resumed = subprocess.run(resume_cmd(run_b), env=env, capture_output=True, text=True, timeout=300)
        out_a, err_a = proc_a.communicate(timeout=300)
    finally:
        for proc in (proc_a, proc_b):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc_a.returncode == 0, err_a
    assert resumed.returncode == 0, resumed.stderr
    again = subprocess.run(resume_cmd(run_a), env=env, capture_output=True, text=True, timeout=120)
    return {"a": run_a, "b": run_b, "killed_at": killed_at, "resumed": resumed, "again": again}


def test_kill_left_work_to_do(runs):
    latest = [name for name in runs["killed_at"] if not name.endswith(".tmp")][-1]
    assert latest in ("step_000002", "step_000004")
    assert FINAL not in runs["killed_at"]
    summary = json.loads((runs["b"] / "summary.json").read_text())
    assert summary["resumed_from"].endswith(latest)
    assert summary["last_step"] == STEPS


def test_resumed_metrics_equal_uninterrupted(runs):
    metrics_a, metrics_b = read_jsonl(runs["a"] / "metrics.jsonl"), read_jsonl(runs["b"] / "metrics.jsonl")
    assert [m["step"] for m in metrics_a] == list(range(1, STEPS + 1))
    assert [m["step"] for m in metrics_b] == [m["step"] for m in metrics_a]
    for row_a, row_b in zip(metrics_a, metrics_b, strict=True):
        keys = {k for k in row_a if not k.startswith("time/")}
        assert keys == {k for k in row_b if not k.startswith("time/")}
        for key in sorted(keys):
            expected = row_a[key]
            if isinstance(expected, float):
                expected = pytest.approx(expected, rel=1e-5, abs=1e-6)
            assert row_b[key] == expected, f"step {row_a['step']} {key}"


def test_resumed_samples_equal_uninterrupted(runs):
    samples_a, samples_b = read_jsonl(runs["a"] / "samples.jsonl"), read_jsonl(runs["b"] / "samples.jsonl")
    assert len(samples_a) == STEPS * 2 * 2
    assert [(s["step"], s["uid"], s["completion"]) for s in samples_b] == \
        [(s["step"], s["uid"], s["completion"]) for s in samples_a]


def test_resumed_adapter_equals_uninterrupted(runs):
    weights_a = load_file(str(runs["a"] / "checkpoints" / FINAL / "adapter_model.safetensors"))
    weights_b = load_file(str(runs["b"] / "checkpoints" / FINAL / "adapter_model.safetensors"))
    assert weights_a.keys() == weights_b.keys() and weights_a
    for name, tensor in weights_a.items():
        torch.testing.assert_close(weights_b[name], tensor, rtol=1e-6, atol=1e-6, msg=name)
    # the run really trained: LoRA B starts at zero and must have moved
    assert any(float(t.abs().max()) > 0 for name, t in weights_a.items() if "lora_B" in name)


def test_tmp_checkpoint_dir_is_ignored(runs):
    state = json.loads((runs["b"] / "checkpoints" / FINAL / "loop_state.json").read_text())
    assert state["step"] == STEPS
    assert "step 99" not in runs["resumed"].stdout + runs["resumed"].stderr


def test_resuming_a_finished_run_has_nothing_to_do(runs):
    again = runs["again"]
    assert again.returncode == 0, again.stderr
    assert "nothing to resume" in again.stdout
    assert len(read_jsonl(runs["a"] / "metrics.jsonl")) == STEPS  # nothing was redone or appended
