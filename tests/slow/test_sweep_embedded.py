"""`purplerl sweep` end to end on the embedded SmolLM2-135M-Instruct (make test-slow; ~1.5 min on an idle 2-core
machine): a 2 x 2 grid of the attack, one seed, two runs at a time on a local Ray cluster with one core each, the
diversity eval of every final checkpoint, and the summary table."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["attack_lr0.0005_kl_beta0.02_s0", "attack_lr0.0005_kl_beta0.1_s0", "attack_lr0.001_kl_beta0.02_s0",
         "attack_lr0.001_kl_beta0.1_s0"]


@pytest.mark.slow
def test_a_2x2_sweep_of_the_attack_on_the_embedded_model(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "purplerl", "sweep", "--recipe", "attack", "--out", str(out),
               "--grid", "lr=5e-4,1e-3", "kl_beta=0.02,0.1",
               "--fixed", "model=embedded:smollm2-135m-instruct", "steps=2", "batch_size=4", "group_size=2",
               "max_new_tokens=8", "save_every=2", "logging.progress=false",
               "--cpus_per_run", "1", "--eval.limit", "2", "--eval.n", "2", "--eval.args", "[--max_new_tokens, '8']"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [row["configuration"] for row in summary["configurations"]] == [name[:-3] for name in NAMES]
    assert all(row["finished"] == 1 and not row["failed"] for row in summary["configurations"])
    assert summary["metrics"] == ["toxicity/mean", "refusal/mean", "reward/mean"]
    for run in summary["runs"]:
        outcome = json.loads((out / "outcomes" / f"{run['name']}.json").read_text())
        assert outcome["threads"] == 1 and outcome["checkpoint"].endswith("step_000002")
        assert 0.0 <= run["final"]["toxicity/mean"] <= 1.0
        assert 0.0 <= run["diversity"]["distinct_2"] <= 1.0 and run["collapse"] in (True, False)
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(row["training.lr"], row["reward.kl_beta"]) for row in rows] == [
        ("0.0005", "0.02"), ("0.0005", "0.1"), ("0.001", "0.02"), ("0.001", "0.1")]
    assert "collapse" in proc.stdout and "intervals: mean over seeds" in proc.stdout
    assert (out / "summary.html").read_text().startswith("<!DOCTYPE html>")
