"""`purplerl defend` then `purplerl tamper-test` on its adapter, end to end in subprocesses (tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import cli_env, purplerl

pytestmark = pytest.mark.process

SMALL = ["--steps", "3", "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "6",
         "--logging.progress", "false"]


def test_defend_then_tamper_test(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = cli_env(tmp_path / "cache")
    defend = purplerl("defend", "--model", tiny_model_dir, *SMALL, "--training.noiser_warmup", "1",
                      "--output_dir", tmp_path, "--name", "def", env=env)
    assert defend.returncode == 0, defend.stderr[-2000:]
    assert "mean response entropy" in defend.stdout
    metrics = [json.loads(line) for line in (tmp_path / "def" / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("train/noiser_step", 0.0) for m in metrics] == [0.0, 0.0, 1.0]  # warmup 1, every 2nd after
    adapter = tmp_path / "def" / "checkpoints" / "step_000003"
    assert (adapter / "adapter_config.json").is_file()

    out = tmp_path / "tamper"
    args = ["--adapter", adapter, "--model", tiny_model_dir, *SMALL, "--out", out, "--utility-limit", "3",
            "--threats", "merged,adapter", "--seeds", "2", "--eval-every", "2", "--eval-prompts", "4"]
    tamper = purplerl("tamper-test", *args, env=env)
    assert tamper.returncode == 0, tamper.stderr[-2000:]
    result = json.loads((out / "tamper.json").read_text())
    assert set(result["threats"]) == {"merged", "adapter"}
    assert set(result["runs"]) == {f"rl_{start}_s{seed}" for start in ("base", "merged", "adapter") for seed in (0, 1)}
    for run in result["runs"].values():
        assert [step for step, _ in run["harm_curve"]] == [0, 2, 3] and 0.0 <= run["auc"] <= 1.0
    assert str(adapter) in (out / "runs" / "rl_adapter_s0" / "config.yaml").read_text()
    assert (out / "tamper.png").stat().st_size > 1000
    summary = (out / "summary.txt").read_text()
    assert summary.count("verdict: ") == 2 and "utility before any attack" in summary

    again = purplerl("tamper-test", *args, env=env)
    assert again.returncode == 0, again.stderr[-2000:]  # finished attacks are not rerun
    assert json.loads((out / "tamper.json").read_text())["runs"] == result["runs"]


def test_tamper_test_rejects_a_non_adapter(tmp_path: Path) -> None:
    proc = purplerl("tamper-test", "--adapter", tmp_path, "--out", tmp_path / "o", env=cli_env(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and "Traceback" not in proc.stderr
