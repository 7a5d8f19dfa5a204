"""The recipe config -> veRL overrides translation, setting by setting, and Hydra's value syntax."""

from __future__ import annotations

import pytest

from purplerl.cli import _verl_command
from purplerl.config import load_command_config
from purplerl.verl.hydra import format_override, format_value, parse_override, parse_value
from purplerl.verl.mapping import NOT_TRANSLATED, WRITTEN_BY_EXPORT, leaf_settings, translate


def _translate(*args: str, rows: int = 72, recipe: str = "attack"):
    cfg = load_command_config(_verl_command(recipe), None, ["--model", "m/x", *args])
    return cfg, translate(cfg, rows)


def _named(translation) -> dict[str, str]:
    return {u.setting: u.why for u in translation.unmapped}


def test_every_setting_is_translated_written_or_named():
    cfg, out = _translate("--engine.procs", "2", "--model.dtype", "float32", "--model.autocast_bf16", "true",
                          "--model.lora_dropout", "0.1", "--model.revision", "abc", "--model.device", "cuda",
                          "--model.quantize", "4bit", "--data.template", "base",
                          "--zscore", "true", "--training.collapse_stop", "true", "--training.adam_eps", "1.0e-6")
    named = _named(out)
    for setting in leaf_settings(cfg):
        assert setting in out.used or setting in named or setting.startswith(WRITTEN_BY_EXPORT), setting
    # every field of today's config is handled by name: the catch-all is for fields added later
    assert NOT_TRANSLATED not in named.values()
    # model.autocast_bf16 (then engine.autocast_bf16) is model.dtype autocast_bf16 now (the old name still works)
    assert cfg.model.dtype == "autocast_bf16"
    for setting in ("engine.procs", "model.dtype", "model.lora_dropout", "model.revision", "model.quantize",
                    "data.template", "reward.zscore", "training.collapse_stop", "training.optimizer.eps"):
        assert setting in named
    # the Token Noiser steps are the defend recipe's own (defend.noiser, no longer training.noiser)
    cfg, out = _translate("--reward.terms", "{toxicity: 1}", recipe="defend")
    named = _named(out)
    for setting in leaf_settings(cfg):
        assert setting in out.used or setting in named or setting.startswith(WRITTEN_BY_EXPORT), setting
    assert NOT_TRANSLATED not in named.values()
    assert "defend.noiser" in named


def test_defaults_name_only_what_changes_the_run():
    _, out = _translate()
    assert set(_named(out)) == {"reward.kl_in", "attack.early_stop_toxicity", "training.early_stop_repetition"}


def test_sampling_batches_and_optimizer():
    _, out = _translate("--group_size", "8", "--batch_size", "16", "--training.mini_batches", "2", "--top_k", "0",
                        "--top_p", "0.9", "--temperature", "0.7", "--max_new_tokens", "64", "--lr", "3e-6",
                        "--training.adam_beta2", "0.95", "--micro_batch_tokens", "1000", "--verl.gpus_per_node", "4")
    o = out.overrides
    assert o["actor_rollout_ref.rollout.n"] == 8
    assert o["actor_rollout_ref.rollout.top_k"] == -1  # veRL's "off"
    assert (o["actor_rollout_ref.rollout.top_p"], o["actor_rollout_ref.rollout.temperature"]) == (0.9, 0.7)
    assert o["data.max_response_length"] == 64
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == 8  # 16 prompts in 2 mini-batches
    # a mini-batch of 8 x 8 = 64 sequences is 16 per GPU on 4 GPUs; 1000 tokens hold 3 of the longest
    # sequences (256 prompt + 64 completion tokens), and the largest divisor of 16 <= 3 is 2
    assert o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 2
    assert o["actor_rollout_ref.actor.optim.lr"] == 3e-6
    assert o["actor_rollout_ref.actor.optim.betas"] == [0.9, 0.95]
    assert o["trainer.total_epochs"] == 15  # 72 prompts // 16 = 4 steps per epoch; 60 steps / 4
    # two updates per rollout batch: veRL's only ratio loss clips, purplerl's importance_sampling does not
    assert "training.loss" in _named(out)


@pytest.mark.parametrize(("args", "expected"), [
    ([], {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False}),
    (["--training.advantage", "grpo_std"],
     {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True}),
    (["--training.advantage_std", "true"], {"algorithm.norm_adv_by_std_in_grpo": True}),  # the older spelling
    (["--training.advantage", "dr_grpo", "--training.loss_agg", "seq_mean_token_sum_norm"],
     {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False,
      "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm"}),
    (["--training.advantage", "rloo"], {"algorithm.adv_estimator": "rloo"}),
    (["--training.advantage", "reinforce_pp"], {"algorithm.adv_estimator": "reinforce_plus_plus"}),
    (["--reward.kl_in", "loss", "--reward.kl_estimator", "k3", "--kl_beta", "0.02"],
     {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.02,
      "actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "algorithm.use_kl_in_reward": False}),
    (["--reward.kl_estimator", "k2"], {"algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "mse",
                                       "algorithm.kl_ctrl.kl_coef": 0.1}),
    (["--kl_beta", "0"], {"algorithm.use_kl_in_reward": False, "actor_rollout_ref.actor.use_kl_loss": False}),
    (["--training.old_logprobs", "sampler"], {"algorithm.rollout_correction.bypass_mode": True}),
    (["--model.finetune", "full"], {"actor_rollout_ref.model.lora_rank": 0}),
    (["--model.lora_targets", "q_proj, v_proj", "--lora_rank", "8", "--lora_alpha", "16"],
     {"actor_rollout_ref.model.target_modules": ["q_proj", "v_proj"], "actor_rollout_ref.model.lora_rank": 8,
      "actor_rollout_ref.model.lora_alpha": 16}),
    (["--model.init_adapter", "/ckpt/step_000010"], {"actor_rollout_ref.model.lora_adapter_path": "/ckpt/step_000010"}),
    (["--training.loss", "ppo_clip", "--training.clip_high", "0.28"],
     {"actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla", "actor_rollout_ref.actor.clip_ratio_high": 0.28}),
])
def test_algorithm_kl_and_lora(args, expected):
    _, out = _translate(*args)
    assert {key: out.overrides.get(key) for key in expected} == expected


def test_kl_semantics_named_only_where_they_differ():
    # REINFORCE++ puts the per-token KL into its token rewards in both systems
    assert "reward.kl_in" not in _named(_translate("--training.advantage", "reinforce_pp")[1])
    assert "reward.kl_in" in _named(_translate()[1])


def test_non_integer_lora_alpha_is_rounded_and_named():
    _, out = _translate("--lora_alpha", "12.5")
    assert out.overrides["actor_rollout_ref.model.lora_alpha"] == 12
    assert "model.lora_alpha" in _named(out)


@pytest.mark.parametrize("value", [None, True, False, 0, -1, 3e-6, 0.1, 1.0, "grpo", "HuggingFaceTB/SmolLM2-135M",
                                   "true", "1e-3", "null", "with space", "it's", "a,b", "@EXPORT_DIR@/x y.parquet",
                                   "a\\b", "a\\'b", "ends\\", "${x}", "a\\${x}", "$HOME|&", ["it's\\", "${y}"],
                                   [0.9, 0.999], ["q_proj", "v_proj"], ["console"], []])
def test_hydra_values_read_back_as_written(value):
    assert parse_value(format_value(value)) == value
    key, parsed = parse_override(format_override("a.b_c", value))
    assert (key, parsed) == ("a.b_c", value)


def test_hydra_formats():
    assert format_override("x.y", True) == "x.y=true"
    assert format_override("x.y", "1e-3") == "x.y='1e-3'"  # a number-looking string stays a string
    assert format_override("x.y", ["console"]) == "x.y=[console]"
    assert format_override("x.y", "@EXPORT_DIR@/a") == "x.y='@EXPORT_DIR@/a'"
    # Hydra halves only the backslashes before a quote; OmegaConf only those before '${' (checked against both in
    # tests/verl/test_verl_wheel.py)
    assert format_override("x.y", "a\\b\\") == "x.y='a\\b\\\\'"
    assert format_override("x.y", "it's ${HOME}") == "x.y='it\\'s \\${HOME}'"
