"""`purplerl ppo`: PPO with a critic on the tiny model learns a synthetic reward while its value loss falls, resumes
to the same adapters, and refuses settings that make no sense in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from purplerl.config import load_command_config
from purplerl.errors import UserError
from purplerl.recipes import RECIPES
from purplerl.rewards.registry import REWARD_TERMS, RewardTerm
from purplerl.runs.layout import METRICS_FILE
from purplerl.train.runner import run_recipe, saved_settings

PPO = RECIPES["ppo"]
TARGETS = set(range(150, 190))  # 40 of the tiny vocabulary's ~400 ids: about one sampled token in ten at first


def _target_share(_params):
    # 1 + the share of target tokens: the constant 1 is what an untrained critic (values ~0) must learn first, so
    # its loss starts high; the share is what the policy must learn
    return lambda batch: torch.tensor([1.0 + sum(t in TARGETS for t in c.tokens) / len(c.tokens)
                                       for c in batch.completions])


@pytest.fixture
def target_share(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(REWARD_TERMS, "target_share",
                        RewardTerm("target_share", "1 + the share of target tokens", "tokens", None, _target_share))
    return "target_share"


def _args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model_dir), "--output_dir", str(out), "--batch_size", "2", "--logging.progress", "false",
            "--training.early_stop_repetition", "null", *extra]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_ppo_learns_the_reward_while_its_value_loss_falls(tiny_model_dir: Path, tmp_path: Path,
                                                          target_share: str) -> None:
    # the tiny model's hidden layers barely move its logits: the policy's LoRA sits on lm_head (see test_loop's
    # test_policy_learns_to_emit_rewarded_tokens); the critic's head learns on the frozen hidden states
    args = _args(tiny_model_dir, tmp_path, "--steps", "30", "--group_size", "8", "--max_new_tokens", "8",
                 "--model.lora_targets", "lm_head", "--lr", "2e-2", "--training.ppo_epochs", "2",
                 "--training.lam", "1.0", "--kl_beta", "0.01", "--critic.lr", "0.1", "--critic.cliprange_value", "1",
                 "--reward.terms", f"{{{target_share}: 1}}", "--name", "learn", "--save_every", "100")
    summary = run_recipe(PPO, load_command_config(PPO.command(), None, args))
    metrics = _metrics(Path(summary["run_dir"]))
    assert [m["step"] for m in metrics] == list(range(1, 31))
    rewards, value_losses = [m["reward/mean"] for m in metrics], [m["train/value_loss"] for m in metrics]
    assert _mean(rewards[-5:]) > _mean(rewards[:5]) + 0.1, rewards  # about one target token more in eight
    assert _mean(value_losses[-5:]) < 0.3 * _mean(value_losses[:5]), value_losses
    for key in ("adv/explained_variance", "adv/return_mean", "adv/adv_mean", "adv/adv_std", "kl/mean",
                "train/clip_frac", "train/value_clip_frac", "train/critic_grad_norm"):
        assert all(key in m for m in metrics), key
    assert _mean([m["adv/return_mean"] for m in metrics[-5:]]) > 1.0  # the returns carry the reward


def test_a_resumed_run_ends_as_the_unbroken_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    common = ("--group_size", "2", "--max_new_tokens", "4", "--training.ppo_epochs", "2",
              "--training.mini_batches", "2", "--save_every", "3", "--critic.lr", "0.01")
    whole = run_recipe(PPO, load_command_config(PPO.command(), None, _args(
        tiny_model_dir, tmp_path, "--steps", "6", "--name", "whole", *common)))
    part_args = _args(tiny_model_dir, tmp_path, "--steps", "3", "--name", "part", *common)
    run_recipe(PPO, load_command_config(PPO.command(), None, part_args))
    part_dir = tmp_path / "part"
    resumed = load_command_config(PPO.command(), None, ["--steps", "6"], saved=saved_settings(PPO, part_dir))
    run_recipe(PPO, resumed, resume_dir=part_dir)
    final = "checkpoints/step_000006"
    for name in ("adapter_model.safetensors", "critic/adapter_model.safetensors", "critic/scalar_head.safetensors"):
        a, b = load_file(str(Path(whole["run_dir"]) / final / name)), load_file(str(part_dir / final / name))
        assert a.keys() == b.keys()
        for key, tensor in a.items():
            torch.testing.assert_close(b[key], tensor, rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
    keys = ("reward/mean", "train/value_loss", "adv/explained_variance")
    assert [m[k] for m in _metrics(part_dir) for k in keys] == pytest.approx(
        [m[k] for m in _metrics(Path(whole["run_dir"])) for k in keys], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("args, says", [
    (["--training.advantage_std", "true"], "removed: the estimator grpo_std is GRPO divided by the group std"),
    (["--critic.vf_coef", "0"], "vf_coef"),
])
def test_settings_that_make_no_sense_are_refused_in_one_line(args: list[str], says: str) -> None:
    with pytest.raises(UserError, match=says) as err:
        load_command_config(PPO.command(), None, args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("recipe, args, says", [
    ("ppo", ["--engine", "vllm"], r"^recipe ppo needs scalar heads on named adapters \(a reward model, a critic\); "
                                  "engine.kind vllm does not have them: use engine.kind local$"),
    ("ppo", ["--engine", "tinker"], "engine.kind tinker does not have them: use engine.kind local$"),
    ("ppo", ["--model.finetune", "full"], "model.finetune full trains no adapters over a frozen base: use "
                                          "model.finetune lora$"),
    ("ppo", ["--training.advantage", "grpo"], "this recipe trains a critic for an estimator that takes its values "
                                              r"\(gae\), not training.advantage 'grpo'"),
    ("attack", ["--training.advantage", "gae"], "training.advantage 'gae' needs a critic's values and this recipe "
                                                "trains none"),
    ("ppo", ["--critic.init", "/nonexistent/critic"], "critic.init /nonexistent/critic is not a PEFT adapter dir"),
])
def test_a_critic_without_its_estimator_and_back_is_refused_before_the_model_loads(
        recipe: str, args: list[str], says: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_command_config(RECIPES[recipe].command(), None, _args(tiny_model_dir, tmp_path, *args))
    with pytest.raises(UserError, match=says) as err:
        run_recipe(RECIPES[recipe], config)
    assert "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())  # no run dir claimed
