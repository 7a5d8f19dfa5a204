"""A checkpoint is prompted the way its run was trained, in `sample`, `eval` and `tamper-test` alike: all three
load it through engines.loading.resolve_policy, which reads runs/<run>/config.yaml.

The run here is a real one-step attack on the tiny model, trained with `--data.template base` and a system
prompt; a spy on every engine a policy loads records the prompt token ids it is asked to sample from, which
must be the plain-text rendering "<system>\\n\\n<user>\\n", never ChatML.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from purplerl import engines
from purplerl.config import EvalDataConfig, ModelLoadConfig, PromptFormatConfig, load_command_config
from purplerl.data.sources import load_prompts
from purplerl.errors import UserError
from purplerl.eval.utility import load_utility_set
from purplerl.runs.policy import resolve_policy
from tests.conftest import make_tiny_tokenizer

SYSTEM = "Answer in one word."


def _base_text(user: str) -> str:
    """The base template by hand: the system prompt and the user's message as paragraphs, then a newline."""
    return f"{SYSTEM}\n\n{user}\n"


@pytest.fixture(scope="module")
def run_checkpoint(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/plain/checkpoints/step_000001 of a one-step attack trained on plain-text prompts with SYSTEM."""
    runs = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PURPLERL_CACHE", str(runs / "cache"))
        _cli("attack", "--model", tiny_model_dir, "--data.template", "base", "--system_prompt", SYSTEM,
             "--steps", "1", "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "4", "--lora_rank", "4",
             "--device", "cpu", "--dtype", "float32", "--output_dir", runs, "--name", "plain",
             "--logging.progress", "false")
    return runs / "plain" / "checkpoints" / "step_000001"


@pytest.fixture
def prompts_seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every prompt an engine built by engines.make_engine is asked to sample from, in order."""
    seen: list[str] = []
    make_engine, tokenizer = engines.make_engine, make_tiny_tokenizer()

    def spying_make_engine(config, *args, **kwargs):
        engine = make_engine(config, *args, **kwargs)
        sample = engine.sample

        def recording_sample(prompt_tokens, n, params):
            seen.extend(tokenizer.decode(ids) for ids in prompt_tokens)
            assert all(tokenizer.encode(tokenizer.decode(ids)) == list(ids) for ids in prompt_tokens)
            return sample(prompt_tokens, n, params)

        engine.sample = recording_sample
        return engine

    monkeypatch.setattr(engines, "make_engine", spying_make_engine)
    return seen


def _cli(*args: str | Path):
    from purplerl.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def test_the_run_was_trained_on_plain_text_with_a_system_prompt(run_checkpoint: Path) -> None:
    saved = yaml.safe_load((run_checkpoint.parent.parent / "config.yaml").read_text())
    assert (saved["data"]["template"], saved["data"]["system_prompt"]) == ("base", SYSTEM)


def test_sample_prompts_a_run_checkpoint_as_it_was_trained(run_checkpoint: Path, prompts_seen: list[str]) -> None:
    result = _cli("sample", "--checkpoint", run_checkpoint, "--prompt", "hi", "--prompt", "and you?",
                  "--max_new_tokens", "2", "--device", "cpu")
    assert prompts_seen == [_base_text("hi"), _base_text("and you?")]
    assert "not a checkpoint of a run" not in result.stderr


def test_what_the_user_sets_wins_over_the_run(run_checkpoint: Path, prompts_seen: list[str]) -> None:
    _cli("sample", "--checkpoint", run_checkpoint, "--prompt", "hi", "--template", "chat", "--max_new_tokens", "2",
         "--device", "cpu")
    # the template is the user's, the system prompt still the run's
    assert prompts_seen == [f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                            "<|im_start|>assistant\n"]


def test_eval_prompts_the_checkpoint_and_its_base_as_the_run_was_trained(
        run_checkpoint: Path, prompts_seen: list[str], tmp_path: Path) -> None:
    out = tmp_path / "eval"
    # no --model: the base model is the run's, prompted the run's way too
    _cli("eval", "--checkpoint", run_checkpoint, "--suite", "diversity,utility", "--limit", "2",
         "--max_new_tokens", "2", "--utility_limit", "1", "--utility_tokens", "8", "--choice_source", "none",
         "--device", "cpu", "--out", out)
    harm = [_base_text(r.messages[-1]["content"]) for r in load_prompts(EvalDataConfig(split="test", limit=2))]
    (item,) = load_utility_set(limit=1)
    utility = _base_text(f"Question: {item['question']}\nAnswer:")
    assert prompts_seen == [*harm, utility, *harm, utility]  # base target, then the checkpoint
    policies = json.loads((out / "eval.json").read_text())["config"]["policies"]
    for label in ("base", "step_000001"):
        assert (policies[label]["template"], policies[label]["system_prompt"]) == ("base", SYSTEM)
        assert policies[label]["run_config"] == str((run_checkpoint.parent.parent / "config.yaml").absolute())
    assert policies["base"]["adapter"] is None and policies["step_000001"]["adapter"] == str(run_checkpoint)


def test_tamper_test_attacks_and_checks_utility_as_the_defense_was_trained(
        run_checkpoint: Path, prompts_seen: list[str], tmp_path: Path) -> None:
    from purplerl.experiments.tamper import run_tamper_test
    from purplerl.experiments.tamper.settings import TAMPER

    out = tmp_path / "tamper"
    # no --model, no template: both attacks start from the defended run's base model and prompt format
    config = load_command_config(TAMPER, None, [
        "--adapter", str(run_checkpoint), "--out", str(out), "--device", "cpu", "--dtype", "float32",
        "--lora_rank", "4", "--steps", "1", "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "2",
        "--logging.progress", "false", "--utility_limit", "1", "--utility_tokens", "8", "--seeds", "1",
        "--eval_prompts", "2"])
    notes: list[str] = []
    run_tamper_test(config, announce=notes.append)
    assert notes == ["tamper-test: rl_base_s0", "tamper-test: rl_merged_s0"]  # no note about the checkpoint
    run = yaml.safe_load((run_checkpoint.parent.parent / "config.yaml").read_text())
    for name in ("rl_base_s0", "rl_merged_s0"):
        attack = yaml.safe_load((out / "runs" / name / "config.yaml").read_text())
        assert (attack["data"]["template"], attack["data"]["system_prompt"]) == ("base", SYSTEM)
    assert yaml.safe_load((out / "runs" / "rl_base_s0" / "config.yaml").read_text())["model"]["name"] == \
        run["model"]["name"]
    (item,) = load_utility_set(limit=1)
    utility = _base_text(f"Question: {item['question']}\nAnswer:")
    assert prompts_seen.count(utility) == 2  # the base and the defended model, before any attack
    assert all(text.startswith(f"{SYSTEM}\n\n") and "<|im_start|>" not in text for text in prompts_seen)


def test_a_bare_adapter_takes_its_base_from_adapter_config_and_says_so(
        tiny_model_dir: Path, trained_adapter_dir: Path, prompts_seen: list[str]) -> None:
    result = _cli("sample", "--checkpoint", trained_adapter_dir, "--prompt", "hi", "--max_new_tokens", "2",
                  "--device", "cpu")
    assert prompts_seen == ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]
    assert f"{trained_adapter_dir} is not a checkpoint of a run" in result.stderr
    policy = resolve_policy(trained_adapter_dir, ModelLoadConfig(), PromptFormatConfig())
    assert policy.model.name == str(tiny_model_dir) and policy.run_config is None  # adapter_config.json's base


def test_resolve_policy_reads_only_what_the_run_decides(run_checkpoint: Path, tmp_path: Path) -> None:
    policy = resolve_policy(run_checkpoint, ModelLoadConfig(device="cpu"), PromptFormatConfig())
    run = yaml.safe_load((run_checkpoint.parent.parent / "config.yaml").read_text())
    assert (policy.model.name, policy.model.dtype, policy.model.device) == (run["model"]["name"], "float32", "cpu")
    assert (policy.prompt.template, policy.prompt.system_prompt, policy.prompt.max_prompt_tokens) == (
        "base", SYSTEM, 256)
    assert policy.without_adapter().model.init_adapter is None
    mine = resolve_policy(run_checkpoint, ModelLoadConfig(name="other/model"), PromptFormatConfig(system_prompt=None))
    assert (mine.model.name, mine.prompt.system_prompt, mine.prompt.template) == ("other/model", None, "base")
    # a run config whose prompt settings are broken is named, with the field
    broken = tmp_path / "run" / "checkpoints" / "step_000001"
    broken.parent.mkdir(parents=True)
    (broken.parent.parent / "config.yaml").write_text("data:\n  template: qwen\n")
    (broken.parent / "step_000001").symlink_to(run_checkpoint.absolute(), target_is_directory=True)
    with pytest.raises(UserError, match=r"config.yaml: config field 'data.template': Input should be 'chat' or 'base'"):
        resolve_policy(broken, ModelLoadConfig(), PromptFormatConfig())
