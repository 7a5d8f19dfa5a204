"""The loop with each advantage estimator, KL placement, PPO epochs/minibatches and Token Noiser steps."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from purplerl.config import EngineConfig, LoggingConfig, ModelConfig, RLTrainingConfig, RunConfig, SamplingConfig
from purplerl.data import PromptSampler
from purplerl.engines.local import LocalEngine
from purplerl.errors import ExperimentError
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import AttackSettings
from purplerl.recipes.defend import DefendConfig, DefendSettings
from purplerl.recipes.defend.step import defend_update, is_noiser_step
from purplerl.rewards import combine
from purplerl.train.loop import (
    KLPlacement,
    LoopParts,
    RecipeHooks,
    UpdateFn,
    kl_placement,
    policy_loss,
    reward_kl_beta,
    rl_update,
    run_loop,
)
from purplerl.train.runner import engine_settings
from purplerl.train.sinks import read_jsonl
from purplerl.types import PromptRecord
from tests.conftest import make_tiny_tokenizer

RECORDS = [PromptRecord(messages=({"role": "user", "content": text},), uid=f"p{i}")
           for i, text in enumerate(["hello world", "tell me a joke", "roast my friend", "say goodbye"])]



def _config(model_dir: Path, steps: int = 2, reward: dict | None = None, defend: dict | None = None,
            **training: object) -> AttackSettings | DefendSettings:
    """The attack's settings tree; the defend tree when `defend` sets its Token Noiser fields."""
    sections = dict(model=ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"),
                    sampling=SamplingConfig(group_size=2, max_new_tokens=5),
                    training=RLTrainingConfig(steps=steps, batch_size=2, lr=1e-2, **training),
                    engine=EngineConfig(micro_batch_tokens=128), reward=reward or {},
                    run=RunConfig(save_every=100, keep_last=1), logging=LoggingConfig(progress=False))
    if defend is not None:
        return DefendSettings(defend=DefendConfig(**defend), **sections)
    return AttackSettings(**sections)


def _reward_fn(config: AttackSettings | DefendSettings):
    def reward_fn(prompts, completions, kl_N):
        # any reward that differs within a group: a pseudo-random function of the sampled tokens
        score = torch.tensor([float(sum(c.tokens) % 11) / 11 for c in completions])
        return combine({"score": (1.0, score), "kl": (-reward_kl_beta(config), kl_N)})
    return reward_fn


def _run(config: AttackSettings | DefendSettings, tmp_path: Path, update: UpdateFn = rl_update) -> list[dict]:
    engine = LocalEngine(config.model, seed=config.training.seed, settings=engine_settings(config))
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)
    hooks = RecipeHooks(reward=_reward_fn(config), update=update)
    parts = LoopParts(engine, PromptSampler(RECORDS, 2, 0), render, hooks)
    run_loop(config, parts, tmp_path)
    return read_jsonl(tmp_path / "metrics.jsonl")


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_each_advantage_estimator_trains(tiny_model_dir: Path, tmp_path: Path, advantage: str) -> None:
    agg = "seq_mean_token_sum_norm" if advantage == "dr_grpo" else "token_mean"
    metrics = _run(_config(tiny_model_dir, advantage=advantage, loss_agg=agg), tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["train/grad_norm"] > 0 for m in metrics)


def test_kl_in_loss_reports_the_loss_term_and_drops_it_from_the_reward(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir, steps=2, reward={"kl_in": "loss", "kl_beta": 0.5, "kl_estimator": "k3"})
    assert reward_kl_beta(config) == 0.0
    metrics = _run(config, tmp_path)
    assert "train/kl_loss" in metrics[0]
    assert metrics[0]["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == base


def test_reinforce_pp_takes_kl_per_token_not_in_the_scalar_reward(tiny_model_dir: Path) -> None:
    assert reward_kl_beta(_config(tiny_model_dir, advantage="reinforce_pp")) == 0.0
    assert reward_kl_beta(_config(tiny_model_dir, advantage="grpo")) == 0.1


@pytest.mark.parametrize(("kl_in", "advantage", "expected"), [
    ("reward", "grpo", KLPlacement(reward_beta=0.3)), ("reward", "rloo", KLPlacement(reward_beta=0.3)),
    ("reward", "reinforce_pp", KLPlacement(token_beta=0.3)), ("loss", "grpo", KLPlacement(loss_beta=0.3)),
    ("loss", "reinforce_pp", KLPlacement(loss_beta=0.3))])
def test_kl_is_placed_in_exactly_one_place(tiny_model_dir: Path, kl_in: str, advantage: str,
                                           expected: KLPlacement) -> None:
    config = _config(tiny_model_dir, advantage=advantage, reward={"kl_in": kl_in, "kl_beta": 0.3})
    assert kl_placement(config) == expected
    assert policy_loss(config).params.kl_beta == expected.loss_beta


def test_ppo_epochs_and_minibatches_count_optimizer_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    metrics = _run(_config(tiny_model_dir, steps=1, loss="ppo_clip", ppo_epochs=2, mini_batches=2), tmp_path)
    assert metrics[0]["train/updates"] == 4.0
    assert "train/clip_frac" in metrics[0]


def test_too_many_minibatches_are_refused_with_the_settings_and_at_the_step(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="training.mini_batches=5 exceeds the 4 sequences a step trains on"):
        _config(tiny_model_dir, steps=1, mini_batches=5)
    config = _config(tiny_model_dir, steps=1, mini_batches=4)  # past the settings' check: the step still refuses
    config = config.model_copy(update={"training": config.training.model_copy(update={"mini_batches": 5})})
    with pytest.raises(ExperimentError, match="mini_batches=5 exceeds the 4 sequences"):
        _run(config, tmp_path)


def test_noiser_schedule() -> None:
    config = DefendSettings(defend=DefendConfig(noiser=True, noiser_warmup=3, noiser_every=2))
    assert [s for s in range(1, 10) if is_noiser_step(s, config)] == [5, 7, 9]
    assert not any(is_noiser_step(s, DefendSettings(defend=DefendConfig(noiser=False))) for s in range(1, 50))


def test_noiser_steps_run_supervised_updates(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir, steps=4, defend={"noiser": True, "noiser_warmup": 1, "noiser_every": 2})
    metrics = _run(config, tmp_path, update=defend_update)
    assert [m.get("train/noiser_step", 0.0) for m in metrics] == [0.0, 0.0, 1.0, 0.0]
    noiser = metrics[2]
    assert 1 <= noiser["train/noiser_sequences"] <= 4  # responses with advantage >= 0
    # the noise term is a cross-entropy against ~uniform random targets: about log V for this near-uniform tiny
    # model (its expectation is >= log V); the NLL of the policy's own samples is positive and no larger
    # than that, up to sampling noise
    log_vocab = math.log(len(make_tiny_tokenizer()))
    assert noiser["train/noiser_noise_ce"] == pytest.approx(log_vocab, abs=0.1)
    assert 0 < noiser["train/noiser_nll"] < noiser["train/noiser_noise_ce"] + 0.1
