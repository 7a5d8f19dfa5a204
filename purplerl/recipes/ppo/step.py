"""A critic for the RL loop: PPO with a value function, the classic RLHF loop (Ziegler et al. 2019; InstructGPT,
Ouyang et al. 2022; veRL's PPO with a critic). The critic is its own LoRA adapter with a scalar head (`critic`) over the
policy's frozen base: the policy is the `default` adapter, the KL reference the base with adapters off, so the
three roles share one copy of the weights.

Each step the critic values the rollout's completion tokens (`critic_values`, the loop's `values` hook) before the
advantages, which GAE computes from them (algorithms.critic); the update then trains the policy (the run's
policy-gradient loss, e.g. ppo_clip) and the critic (the clipped value loss `ppo_value` against the GAE returns)
on the same ppo_epochs x mini_batches split. The two adapters never share a gradient: each loss trains only the
active adapter, and the critic's loss does not depend on the policy's weights nor the policy's on the critic's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.critic import ValueLossParams, state_values
from purplerl.algorithms.registry import Loss
from purplerl.engines.adapter_fit import check_adapter_fits, model_skeleton
from purplerl.engines.adapters import HEAD_FILE, adapter_dir, head_shapes
from purplerl.engines.base import Engine, ScalarHeads
from purplerl.errors import UserError
from purplerl.runs.reward_model import looks_like_run, reward_model_checkpoint
from purplerl.train.loop import RewardFn, adam_params, minibatch_updates, rl_update
from purplerl.train.recipe import Bind, Prepare
from purplerl.train.rl import rl_prepare
from purplerl.train.steps import EarlyStop, StepFn
from purplerl.types import TrainBatch

POLICY, CRITIC = "default", "critic"  # the adapters: the policy (every engine's first) and its critic


def critic_values(engine: ScalarHeads, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The critic's value of each completion token's state [N, T] (its head read at the position before the token),
    0 off the completion: the loop's `values` hook."""
    engine.use_adapter(CRITIC)
    try:
        values_NT = engine.values(tensors["input_ids_NT"], tensors["attention_mask_NT"])
    finally:
        engine.use_adapter(POLICY)
    return state_values(values_NT, tensors["loss_mask_NT"])


def critic_update(engine: ScalarHeads, batch: TrainBatch, config: Any, step: int) -> dict[str, float]:
    """The clipped value loss on the critic, on the policy's mini-batches: value_loss, value_clip_frac,
    value_mean (its predictions), critic_grad_norm."""
    c, t = config.critic, config.training
    loss = Loss("ppo_value", ValueLossParams(clip_range=c.cliprange_value, coef=c.vf_coef))
    adam = dataclasses.replace(adam_params(t), lr=c.lr if c.lr is not None else t.lr)
    engine.use_adapter(CRITIC)
    try:
        metrics = minibatch_updates(engine, batch, config, step, loss, adam)
    finally:
        engine.use_adapter(POLICY)
    return {"value_loss": metrics["value_loss"], "value_clip_frac": metrics["value_clip_frac"],
            "value_mean": metrics["value_mean"], "critic_grad_norm": metrics["grad_norm"]}


def policy_and_critic_update(engine: ScalarHeads, batch: TrainBatch, config: Any, step: int) -> dict[str, float]:
    """The policy's update (`rl_update`), then the critic's on the same mini-batches."""
    return {**rl_update(engine, batch, config, step), **critic_update(engine, batch, config, step)}


def check_critic_init(path: str, model: str, revision: str | None) -> None:
    """critic.init must be one adapter with its scalar head, both fitting `model` (a reward model's member dir);
    else one UserError naming what the dir holds. A reward-model checkpoint dir itself holds an untrained
    top-level adapter and no head, and a policy's adapter no head: either started the critic silently from an
    untrained adapter or a fresh head."""
    where, head = Path(path), Path(path) / HEAD_FILE
    if not head.is_file() and looks_like_run(where):  # a reward-model run dir or one of its checkpoints
        checkpoint, members = reward_model_checkpoint(where)
        raise UserError(f"critic.init {where} holds {', '.join(f'{m}/' for m in members)}: give one member, e.g. "
                        f"{adapter_dir(checkpoint, members[0])}")
    check_adapter_fits(where, model, revision, "critic.init")  # no adapter, or one that does not fit
    if not head.is_file():
        raise UserError(f"critic.init {where} holds a LoRA adapter but no scalar head ({HEAD_FILE}): give a reward "
                        "model's member dir (RUN/checkpoints/step_N/member0), whose adapter and head start the critic")
    hidden = model_skeleton(model, revision).config.hidden_size
    shapes = head_shapes(head)
    if shapes != {"weight": (1, hidden), "bias": (1,)}:
        held = ", ".join(f"{name} {shape}" for name, shape in sorted(shapes.items()))
        raise UserError(f"critic.init {where}: its scalar head holds {held}, where model '{model}' takes weight "
                        f"{(1, hidden)} and bias (1,)")


def critic_prepare(reward: Callable[[Any], RewardFn], stops: Callable[[Any], EarlyStop]) -> Prepare:
    """`prepare` for an RL recipe with a critic: `rl_prepare` with the critic's values and update; binding adds the
    critic's adapter and head (a resumed run's came with its checkpoint)."""
    prepare_rl = rl_prepare(reward, stops, policy_and_critic_update, values=critic_values)

    def prepare(config: Any) -> Bind:
        if config.critic.init is not None:  # a misfit fails in one line now, not after the model loaded
            check_critic_init(config.critic.init, config.model.name, config.model.revision)
        bind_rl = prepare_rl(config)

        def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
            if CRITIC not in engine.adapters:
                engine.create_adapter(CRITIC, init=config.critic.init, head=True)
            return bind_rl(engine, run_dir)

        return bind

    return prepare
