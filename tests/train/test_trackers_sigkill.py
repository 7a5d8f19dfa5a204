"""A run SIGKILLed while it logs to W&B, TensorBoard and MLflow, then resumed: each tracker shows every step once.

A kill loses what W&B's service and tensorboardX's writer thread still held in memory, and can leave MLflow with
rows trackers.json does not list; the resume gives W&B and MLflow a new run with the whole log and makes
TensorBoard purge its events from step 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tracker_files import mlflow_client, tensorboard_events, wandb_history
from typer.testing import CliRunner

from purplerl.cli import app
from purplerl.train.sinks import read_jsonl

pytestmark = pytest.mark.process


def test_a_sigkilled_run_resumed_shows_each_step_once_in_every_tracker(tiny_model_dir: Path, tmp_path: Path,
                                                                        monkeypatch) -> None:
    env = {**os.environ, "PURPLERL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    args = ["--model", str(tiny_model_dir), "--model.device", "cpu", "--lora_rank", "4", "--steps", "20",
            "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "12", "--logging.progress", "false",
            "--output_dir", str(tmp_path), "--name", "run", "--save_every", "3", "--seed", "7",
            "--training.early_stop_toxicity", "null", "--training.early_stop_repetition", "null",
            "--logging.trackers", "wandb,tensorboard,mlflow"]
    proc = subprocess.Popen([sys.executable, "-m", "purplerl.cli", "attack", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "run"
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and not (run_dir / "checkpoints/step_000006").is_dir():
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it could be killed: {err[-2000:]}"
    killed = json.loads((run_dir / "trackers.json").read_text())
    assert not any(t["closed"] for t in killed.values())

    result = CliRunner().invoke(app, ["attack", "--resume", str(run_dir)], env=env)
    assert result.exit_code == 0, result.output
    state = json.loads((run_dir / "trackers.json").read_text())
    assert state["wandb"]["id"] != killed["wandb"]["id"] and state["mlflow"]["id"] != killed["mlflow"]["id"]
    assert f"warning: wandb run {killed['wandb']['id']} was not closed" in result.output
    steps = list(range(1, 21))
    rows = wandb_history(run_dir, state["wandb"]["id"])[0]
    assert [r["_step"] for r in rows] == steps
    assert [e.step for e in tensorboard_events(run_dir).Scalars("reward/mean")] == steps
    client = mlflow_client(run_dir, monkeypatch)
    assert sorted(m.step for m in client.get_metric_history(state["mlflow"]["id"], "reward/mean")) == steps
    rewards = [m["reward/mean"] for m in read_jsonl(run_dir / "metrics.jsonl")]
    assert [r["reward/mean"] for r in rows] == pytest.approx(rewards, rel=1e-12)
