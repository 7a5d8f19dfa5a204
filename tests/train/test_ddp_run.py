"""`purplerl attack --engine.procs 2` end to end on the tiny model: two ranks under torchrun, rank 0 alone
writing logs, samples and checkpoints; `--resume` relaunches and continues."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddp_cli import BATCH, GROUP, attack_cmd, cli_env

pytestmark = pytest.mark.process


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_two_process_attack_logs_once_checkpoints_on_rank_zero_and_resumes(tiny_model_dir: Path, tmp_path: Path):
    env = cli_env(tmp_path / "cache")
    run = tmp_path / "runs" / "dp"
    first = subprocess.run(attack_cmd(tiny_model_dir, tmp_path / "runs", "dp", 2, "--engine.procs", "2"), env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("run dir:") == 1  # rank 0 alone reports
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1, 2]
    samples = rows(run / "samples.jsonl")
    # every completion of the global batch once: both ranks' prompts, gathered by rank 0
    assert [r["step"] for r in samples] == [1] * BATCH * GROUP + [2] * BATCH * GROUP
    assert len({r["uid"] for r in samples if r["step"] == 1}) == BATCH
    step2 = run / "checkpoints" / "step_000002"
    rng = torch.load(step2 / "rng_ranks.pt", weights_only=True)["ranks"]
    assert len(rng) == 2 and not torch.equal(rng[0]["cpu"], rng[1]["cpu"])  # each rank its own RNG
    assert "procs: 2" in (run / "config.yaml").read_text()

    resumed = subprocess.run([sys.executable, "-m", "purplerl", "attack", "--resume", str(run), "--steps", "3"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in rows(run / "metrics.jsonl")] == [1, 2, 3]
    assert len(rows(run / "samples.jsonl")) == 3 * BATCH * GROUP
    summary = json.loads((run / "summary.json").read_text())
    assert summary["last_step"] == 3 and summary["resumed_from"] == str(step2)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002", "step_000003"]


def test_a_batch_the_processes_cannot_share_is_one_line(tiny_model_dir: Path, tmp_path: Path):
    proc = subprocess.run(attack_cmd(tiny_model_dir, tmp_path, "x", 1, "--engine.procs", "2", "--batch_size", "3"),
                          env=cli_env(tmp_path / "cache"), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "error: training.batch_size=3 does not divide by engine.procs=2"
    assert not (tmp_path / "x").exists()
