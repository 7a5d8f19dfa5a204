"""Mistakes in the settings and the environment that ended in a traceback, or only after a run dir was written:
each is one line and exit 2, before any work or any file written (the commands run in this process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import invoke_cli

from purplerl.config import load_command_config
from purplerl.errors import UserError
from purplerl.recipes import RECIPES
from purplerl.runs.resume import resume_changes


def _one_line(result) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("kind", ["file", "dangling symlink", "file as a parent"])
def test_a_model_cache_that_is_no_directory_is_one_line(tmp_path: Path, kind: str) -> None:
    """PURPLERL_CACHE naming a file or a dangling symlink gave a 70-line traceback at the first mkdir under it."""
    file, dangling = tmp_path / "file", tmp_path / "dangling"
    file.write_text("")
    dangling.symlink_to(tmp_path / "nowhere")
    cache, why = {"file": (file, "it is a file"),
                  "dangling symlink": (dangling, f"it is a symlink to {tmp_path / 'nowhere'}, which leads nowhere"),
                  "file as a parent": (file / "cache", f"{file} is a file")}[kind]
    result = invoke_cli("attack", "--steps", "1", "--output_dir", tmp_path / "runs", env={"PURPLERL_CACHE": str(cache)})
    assert _one_line(result) == f"error: PURPLERL_CACHE {cache} cannot hold the model cache ({why}): name a directory"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("command", "option"), [("attack", "--engine.fast_paths"), ("attack", "--logging.trackers"),
                                                 ("eval", "--eval.adapters"), ("tamper-test", "--threats")])
def test_an_empty_list_setting_is_one_line(command: str, option: str) -> None:
    """An empty value of a comma-list setting was read as null and failed inside the list splitter."""
    assert _one_line(invoke_cli(command, option, "")) == (
        f"error: option {option} is empty: give its items ('a,b', or {option} once per item), or [] for none")


def test_mini_batches_past_a_steps_sequences_are_refused_with_the_settings(tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    """training.mini_batches larger than the batch was refused at step 1, after the run dir was written."""
    args = ["--model", str(tiny_model_dir), "--batch_size", "2", "--group_size", "2", "--output_dir",
            str(tmp_path / "runs")]
    assert _one_line(invoke_cli("attack", *args, "--training.mini_batches", "5")) == (
        "error: config: training.mini_batches=5 exceeds the 4 sequences a step trains on (training.batch_size x "
        "sampling.group_size): give at most 4")
    assert not (tmp_path / "runs").exists()
    config = load_command_config(RECIPES["ppo"].command(), None, [*args, "--training.mini_batches", "4"])
    assert config.training.mini_batches == 4  # one sequence per mini-batch


def _rows(path: Path, row: dict) -> Path:
    path.write_text(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize(("recipe", "args", "bound"), [
    ("attack", ["--max_prompt_tokens", "2000", "--max_new_tokens", "100"],
     "data.max_prompt_tokens + sampling.max_new_tokens is 2100 tokens"),
    ("sft", ["--sft.max_tokens", "4096"], "sft.max_tokens is 4096 tokens"),
    ("prefs", ["--data.max_answer_tokens", "1800"], "data.max_prompt_tokens + data.max_answer_tokens is 2056 tokens"),
])
def test_sequences_longer_than_the_models_context_are_one_line(tiny_model_dir: Path, tmp_path: Path, recipe: str,
                                                                args: list[str], bound: str) -> None:
    """Prompt and answer lengths were never checked against the model's context (the tiny model's: 2048)."""
    data = {"sft": _rows(tmp_path / "sft.jsonl", {"prompt": "Say hi", "completion": "Hi"}),
            "prefs": _rows(tmp_path / "pairs.jsonl", {"prompt": "Say hi", "chosen": "Hi", "rejected": "No"})}
    given = ["--data", data[recipe]] if recipe in data else []
    result = invoke_cli(recipe, "--model", tiny_model_dir, *given, *args, "--output_dir", tmp_path / "runs")
    assert _one_line(result) == (f"error: {bound}, more than model '{tiny_model_dir}' reads (its "
                                 "max_position_embeddings is 2048): lower them")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("recipe", "setting", "value"), [
    ("sft", "sft.eval_fraction", "0.5"), ("sft", "sft.eval_split", "test"), ("prefs", "prefs.eval_fraction", "0.5"),
    ("prefs", "prefs.eval_split", "test"), ("reward-model", "reward_model.eval_fraction", "0.5"),
    ("reward-model", "reward_model.ensemble", "3"), ("prm", "prm.eval_fraction", "0.5"), ("prm", "prm.separator", "|"),
])
def test_a_resume_keeps_the_held_out_examples_and_the_ensemble(recipe: str, setting: str, value: str) -> None:
    """The held-out split's settings could change on resume, moving examples between training and evaluation (the
    reward model's resume refusals are shown end to end in tests/recipes/test_reward_model.py)."""
    command = RECIPES[recipe].command()
    saved, resumed = load_command_config(command, None, []), load_command_config(command, None, [f"--{setting}", value])
    with pytest.raises(UserError, match=f"^--{setting} cannot change when resuming"):
        resume_changes(saved, resumed, RECIPES[recipe].fixed_on_resume)


@pytest.mark.parametrize(("args", "refused"), [
    (["--judge", "toxicity"], "adversarial.judge.fn"),
    (["--adversarial.judge.params.threshold", "0.5"], "adversarial.judge.params.threshold"),
])
def test_a_resume_keeps_the_adversarial_judge_and_each_of_its_parameters(args: list[str], refused: str) -> None:
    """A fixed mapping-valued setting (the judge's parameters) is fixed in each of its keys; what counts as a
    success (judge.unsafe_at) may change, as it only reads the logged P(unsafe)."""
    command = RECIPES["adversarial"].command()
    saved, resumed = load_command_config(command, None, []), load_command_config(command, None, args)
    with pytest.raises(UserError, match=f"^--{refused} cannot change when resuming"):
        resume_changes(saved, resumed, RECIPES["adversarial"].fixed_on_resume)
    changed = resume_changes(saved, load_command_config(command, None, ["--adversarial.judge.unsafe_at", "0.7"]),
                             RECIPES["adversarial"].fixed_on_resume)
    assert changed == {"adversarial.judge.unsafe_at": [0.5, 0.7]}
