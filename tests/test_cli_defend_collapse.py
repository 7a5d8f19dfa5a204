"""`purplerl defend` stopped by collapse detection: one error line, a non-zero exit, COLLAPSED in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import cli_env, purplerl

pytestmark = pytest.mark.process

SMALL = ["--steps", "4", "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "6",
         "--logging.progress", "false", "--run.save_every", "1"]


def test_defend_collapse_exits_nonzero_with_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    # a bound no run can meet: any change of mean entropy between steps 1 and 2 counts as a collapse
    result = purplerl("defend", "--model", tiny_model_dir, *SMALL, "--training.collapse_entropy_swing", "1e-9",
                      "--output_dir", tmp_path, "--name", "def", env=cli_env(tmp_path / "cache"))
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: defend collapsed at step 2: mean token entropy jumped ")
    assert "Traceback" not in result.stderr
    assert "defense: COLLAPSED" in result.stdout and "objective met" not in result.stdout
    metrics = [json.loads(line) for line in (tmp_path / "def" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and metrics[1]["early_stop"].startswith("collapsed: ")
    # step 2 sampled from the weights saved after step 1: set aside, so no checkpoint claims a defended model
    assert not (tmp_path / "def" / "checkpoints" / "step_000001").exists()
    assert (tmp_path / "def" / "collapsed_checkpoints" / "step_000001" / "adapter_config.json").is_file()


def test_attack_with_collapse_detection_on_exits_nonzero_too(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = purplerl("attack", "--model", tiny_model_dir, *SMALL, "--training.collapse_stop", "true",
                      "--training.collapse_entropy_swing", "1e-9", "--output_dir", tmp_path, "--name", "att",
                      env=cli_env(tmp_path / "cache"))
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: attack collapsed at step 2: mean token entropy jumped ")
    assert "Traceback" not in result.stderr
