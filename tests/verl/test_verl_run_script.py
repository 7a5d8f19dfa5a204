"""run_verl.sh in an export dir whose path holds characters special to the shell, sed or Hydra: the trainer gets
every override with the exact path, and a failing step fails the script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_script import run_script

from purplerl.cli import _verl_command
from purplerl.config import load_command_config
from purplerl.verl.export import export_verl
from purplerl.verl.hydra import parse_override

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# '|' was sed's delimiter and '&' its match; "'" closes a Hydra quoted value; '${' starts an OmegaConf interpolation
NAMES = ["pipe|dir", "amp&dir", "it's", "with space", "dollar$HOME", "brace${x}", "all |&' $${y}"]


def _export(out: Path) -> None:
    export_verl(load_command_config(_verl_command(), None, ["--model", MODEL, "--out", str(out)]))


def _overrides(argv: list[str]) -> dict:
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    return dict(parse_override(arg) for arg in argv[2:])


def _expected(out: Path) -> dict:
    lines = (out / "overrides.txt").read_text().splitlines()
    return {key: value.replace("@EXPORT_DIR@", str(out)) if isinstance(value, str) else value
            for key, value in map(parse_override, lines)}


@pytest.mark.parametrize("name", NAMES)
def test_the_trainer_gets_the_exact_dir(tmp_path, name):
    out = tmp_path / name / "exp"
    _export(out)
    launch = run_script(out, "trainer.total_training_steps=3", work=tmp_path)
    assert launch.returncode == 0, launch.stderr
    overrides = _overrides(launch.argv)
    assert overrides["data.train_files"] == f"{out}/train.parquet"
    assert overrides["reward.custom_reward_function.path"] == f"{out}/purplerl_reward.py"
    assert overrides == {**_expected(out), "trainer.total_training_steps": 3}


def test_cli_export_into_such_a_dir_runs(tmp_path):
    out = tmp_path / "a|b&c'd e$f${g}" / "exp"
    done = subprocess.run([sys.executable, "-m", "purplerl", "verl", "export", "--model", MODEL, "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    launch = run_script(out, work=tmp_path)
    assert launch.returncode == 0, launch.stderr
    assert _overrides(launch.argv)["data.val_files"] == f"{out}/test.parquet"


def test_the_trainer_failing_fails_the_script(tmp_path):
    _export(tmp_path / "exp")
    assert run_script(tmp_path / "exp", work=tmp_path, python_rc=3).returncode == 3


def test_unreadable_overrides_stop_the_script_before_the_trainer(tmp_path):
    _export(tmp_path / "exp")
    (tmp_path / "exp" / "overrides.txt").unlink()
    launch = run_script(tmp_path / "exp", work=tmp_path)
    assert launch.returncode != 0
    assert launch.argv is None
    assert "overrides.txt" in launch.stderr


def test_a_dir_with_a_backslash_is_refused_in_one_line(tmp_path):
    out = tmp_path / "back\\slash" / "exp"
    _export(out)
    launch = run_script(out, work=tmp_path)
    assert (launch.returncode, launch.argv) == (2, None)
    assert launch.stderr == (f"run_verl.sh: the export dir '{out}' holds a backslash, which Hydra's quoted values "
                             "cannot carry as is: move the dir to a path without one\n")
