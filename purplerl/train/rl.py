"""The parts every RL recipe is built from: its reward from the registered terms its settings name, and its prompts
and hooks made before the engine exists. The stop rules every RL recipe has are train/stops.py's `rl_stops`: a
recipe's row names them without importing the loop."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.advantages import ADVANTAGE_ESTIMATORS, CRITIC_ESTIMATORS, takes_values
from purplerl.config.sections import RLSettings
from purplerl.data import PromptSampler, load_prompts
from purplerl.engines.base import Engine
from purplerl.errors import UserError
from purplerl.prompting import render_prompt
from purplerl.rewards.compose import Reward
from purplerl.rewards.registry import READS, ScoringInput, get_term
from purplerl.train.loop import LoopParts, RecipeHooks, RewardFn, UpdateFn, ValuesFn, reward_kl_beta, rl_step, rl_update
from purplerl.train.recipe import Bind, Prepare
from purplerl.train.steps import EarlyStop, StepFn
from purplerl.types import Completion, PromptRecord, RewardBreakdown


def registered_reward(config: RLSettings) -> RewardFn:
    """The reward `config.reward` names: each term of `reward.terms` with its weight and parameters, minus
    `kl_beta` x KL when the KL acts in the reward. Every term is built now, before the engine loads."""
    r = config.reward
    # each term carries its own parameters; the KL's weight is kl_beta, where the KL acts in the reward
    reward = Reward({**r.terms, "kl": -reward_kl_beta(config)}, zscore=r.zscore)

    def reward_fn(prompts: list[PromptRecord], completions: list[Completion], kl_N: torch.Tensor) -> RewardBreakdown:
        return reward(ScoringInput(texts=[c.text for c in completions],
                                   prompts=[p.messages[-1]["content"] for p in prompts],
                                   completions=completions, kl_N=kl_N,
                                   ground_truths=[p.ground_truth for p in prompts]))

    return reward_fn


def check_ground_truths(config: RLSettings, records: list[PromptRecord]) -> None:
    """A reward term that reads each row's ground truth (the `ground_truth` term, in any named use) refuses, in one
    line and before the engine loads, prompts without one."""
    readers = [name for name, entry in config.reward.terms.items()
               if get_term(entry.fn).needs == "ground_truth"]
    lacking = [r for r in records if r.ground_truth is None]
    if readers and lacking:
        raise UserError(f"reward term '{readers[0]}' reads {READS['ground_truth']}, and {len(lacking)} of the "
                        f"{len(records)} prompts of data.source {config.data.source} have none (first: uid "
                        f"{lacking[0].uid!r}); prepare the data with one (data prepare gsm8k) or drop the term")


def check_critic(config: RLSettings, values: ValuesFn | None) -> None:
    """A recipe with a critic (a `values` hook) needs an estimator that takes its values, and such an estimator a
    critic: refused in one line before the engine loads (the critic's scalar head is the recipe's `needs`)."""
    advantage = config.training.advantage
    if takes_values(advantage) and values is None:
        raise UserError(f"training.advantage '{advantage}' needs a critic's values and this recipe trains none: "
                        f"choose an estimator without one ({', '.join(ADVANTAGE_ESTIMATORS)})")
    if values is not None and not takes_values(advantage):
        raise UserError(f"this recipe trains a critic for an estimator that takes its values "
                        f"({', '.join(CRITIC_ESTIMATORS)}), not training.advantage '{advantage}'")


def rl_prepare(reward: Callable[[Any], RewardFn], stops: Callable[[Any], EarlyStop],
               update: UpdateFn = rl_update, values: ValuesFn | None = None) -> Prepare:
    """`prepare` for an RL recipe: its prompts, reward and stop rules are made (and checked) before the engine
    exists, so a bad scorer fails in seconds, not minutes. `values`: the recipe's critic (GAE's values)."""

    def prepare(config: RLSettings) -> Bind:
        check_critic(config, values)
        records = load_prompts(config.data)
        check_ground_truths(config, records)
        sampler = PromptSampler(records, config.training.batch_size, config.training.seed,
                                shuffle=config.data.shuffle)
        hooks = RecipeHooks(reward=reward(config), update=update, early_stop=stops(config), values=values)

        def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
            d = config.data
            render = partial(render_prompt, engine.tokenizer, template=d.template, system_prompt=d.system_prompt,
                             max_prompt_tokens=d.max_prompt_tokens)
            parts = LoopParts(engine, sampler, render, hooks, engine.world)
            return partial(rl_step, config=config, parts=parts), hooks.early_stop

        return bind

    return prepare
