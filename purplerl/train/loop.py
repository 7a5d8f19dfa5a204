"""The RL loop: sample -> score -> advantages -> batch -> train -> log -> checkpoint.

`rl_step` is one step, read top to bottom; `run_loop` repeats it through the shared driver (purplerl.train.steps:
log, evaluate, checkpoint, stop early).
Recipes differ only in their hooks (`RecipeHooks`: reward, update, early stop, a critic's values) and prompts;
where the KL penalty acts is decided once (`kl_placement`) from the config and the advantage estimator's declared
needs, and an estimator that takes a critic's values (GAE) gets them from the recipe's `values` hook.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from purplerl.algorithms.advantages import estimate_advantages, takes_token_kl, takes_values
from purplerl.algorithms.kl import get_kl_estimator, sequence_kl
from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import TrainingConfig
from purplerl.config.sections import RLSettings
from purplerl.data import PromptSampler
from purplerl.engines.base import Engine
from purplerl.engines.distributed import SINGLE, World
from purplerl.errors import ExperimentError, UserError
from purplerl.train.batch import sequence_tensors
from purplerl.train.shards import StepShard, merge_shards
from purplerl.train.steps import EarlyStop, never_stop, run_steps
from purplerl.types import AdamParams, Completion, PromptRecord, RewardBreakdown, SamplingParams, TrainBatch


class RewardFn(Protocol):
    def __call__(self, prompts: list[PromptRecord], completions: list[Completion],
                 kl_N: torch.Tensor) -> RewardBreakdown:
        """Score N completions (prompts[i] is the prompt of completions[i])."""
        ...


class UpdateFn(Protocol):
    def __call__(self, engine: Engine, batch: TrainBatch, config: RLSettings, step: int) -> dict[str, float]:
        """Train on the step's batch: forward_backward + optim_step calls; returns their metrics."""
        ...


class ValuesFn(Protocol):
    def __call__(self, engine: Engine, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """A critic's value of each completion token's state [N, T] (aligned to targets, 0 off the loss mask) for
        the rollout's sequence tensors (input_ids_NT, attention_mask_NT, loss_mask_NT, ...)."""
        ...


@dataclass(frozen=True)
class KLPlacement:
    """Where the KL(policy || base) penalty acts, decided once per run (never counted twice)."""

    reward_beta: float = 0.0  # weight of the sequence KL inside the scalar reward
    token_beta: float = 0.0  # weight of the per-token KL in the estimator's token rewards (REINFORCE++)
    loss_beta: float = 0.0  # weight of the per-token KL term inside the loss


def kl_placement(config: RLSettings) -> KLPlacement:
    r = config.reward
    if r.kl_in == "loss":
        return KLPlacement(loss_beta=r.kl_beta)
    if takes_token_kl(config.training.advantage):
        return KLPlacement(token_beta=r.kl_beta)
    return KLPlacement(reward_beta=r.kl_beta)


def reward_kl_beta(config: RLSettings) -> float:
    """Weight of the sequence KL inside the scalar reward (the recipes' reward functions use it)."""
    return kl_placement(config).reward_beta


def sampling_seed(seed: int, step: int) -> int:
    # a pure function of (seed, step): a resumed run draws exactly what the uninterrupted run drew
    return (seed * 1_000_003 + step) % (2**63 - 1)


def _check_finite(name: str, step: int, values: torch.Tensor) -> None:
    if not torch.isfinite(values).all():
        raise ExperimentError(f"step {step}: non-finite values in {name}")


def adam_params(t: TrainingConfig) -> AdamParams:
    o = t.optimizer
    return AdamParams(lr=t.lr, beta1=o.betas[0], beta2=o.betas[1], eps=o.eps, weight_decay=o.weight_decay,
                      max_grad_norm=t.max_grad_norm)


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for row in rows for k in row}
    return {k: sum(row[k] for row in rows if k in row) / sum(k in row for row in rows) for k in keys}


def old_logprobs_mode(t: Any) -> str:
    """'auto' -> 'current' when the rollout batch gets exactly one update (on-policy), else 'sampler'."""
    if t.old_logprobs != "auto":
        return t.old_logprobs
    return "current" if t.ppo_epochs == 1 and t.mini_batches == 1 else "sampler"


def policy_loss(config: RLSettings) -> Loss:
    """The run's policy-gradient loss, with its KL term when the KL is placed in the loss."""
    t, s = config.training, config.sampling
    params = PolicyGradientParams(clip_low=t.clip_low, clip_high=t.clip_high, kl_beta=kl_placement(config).loss_beta,
                                  kl_estimator=config.reward.kl_estimator, old_logprobs=old_logprobs_mode(t))
    return Loss(t.loss, params, temperature=s.temperature, aggregation=t.loss_agg,
                length_norm=float(s.max_new_tokens))


def rl_update(engine: Engine, batch: TrainBatch, config: RLSettings, step: int) -> dict[str, float]:
    """The policy-gradient loss for ppo_epochs passes over the rollout batch, each split into mini_batches
    optimizer steps.

    The sampling logprobs stay the importance-sampling denominator for every pass: they are the behaviour
    policy's, which is what the ratio must correct for after the first update."""
    return minibatch_updates(engine, batch, config, step, policy_loss(config), adam_params(config.training))


def minibatch_updates(engine: Engine, batch: TrainBatch, config: RLSettings, step: int, loss: Loss,
                      adam: AdamParams) -> dict[str, float]:
    """`loss` on the active adapter: ppo_epochs passes over the batch, each split into mini_batches optimizer
    steps. The split is a function of (seed, step, epoch): every loss of a step (a policy's, its critic's) sees the
    same mini-batches."""
    t = config.training
    n = batch.num_sequences
    if t.mini_batches > n:
        raise ExperimentError(f"step {step}: training.mini_batches={t.mini_batches} exceeds the {n} sequences")
    rows: list[dict[str, float]] = []
    for epoch in range(t.ppo_epochs):
        order = torch.arange(n)
        if t.mini_batches > 1 or t.ppo_epochs > 1:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(sampling_seed(t.seed, step) + epoch))
        for rows_idx in torch.tensor_split(order, t.mini_batches):
            metrics = engine.forward_backward(batch.select(rows_idx), loss)
            rows.append({**metrics, **engine.optim_step(adam)})
    return {**mean_metrics(rows), "updates": float(len(rows))}


@dataclass
class RecipeHooks:
    """What a recipe plugs into the loop."""

    reward: RewardFn
    update: UpdateFn = rl_update  # the train phase; e.g. the defense's Token Noiser steps
    early_stop: EarlyStop = never_stop  # step metrics -> reason to stop, or None
    values: ValuesFn | None = None  # a critic, for an advantage estimator that takes its values (GAE)


@dataclass
class LoopParts:
    engine: Engine
    sampler: PromptSampler
    render: Callable[[PromptRecord], list[int]]  # prompt -> token ids for the engine
    hooks: RecipeHooks
    world: World = SINGLE  # the run's processes: each samples, scores and trains on its share of the prompts


def _sample(step: int, config: RLSettings, parts: LoopParts):
    """B prompts x G completions (this rank's share of the prompts), and their token tensors."""
    s, G = config.sampling, config.sampling.group_size
    records = parts.world.shard(parts.sampler.batch(step - 1))
    if not records:
        raise ExperimentError(f"step {step}: the prompt sampler returned an empty batch")
    groups = parts.engine.sample([parts.render(r) for r in records], G, SamplingParams(
        max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
        seed=sampling_seed(config.training.seed, step)))
    completions = [c for group in groups for c in group]
    if len(completions) != len(records) * G:
        raise ExperimentError(f"step {step}: engine returned {len(completions)} completions, "
                              f"expected {len(records) * G}")
    tensors = sequence_tensors(completions, int(parts.engine.tokenizer.pad_token_id))
    _check_finite("sampling logprobs", step, tensors["sampling_logprobs_NT"])
    return records, [r for r in records for _ in range(G)], completions, tensors


def _checked(step: int, rewards: RewardBreakdown, n: int) -> RewardBreakdown:
    for name, values in {"reward": rewards.total_N, **rewards.components}.items():
        _check_finite(f"reward component '{name}'", step, values)
        if values.shape != (n,):
            raise ExperimentError(f"step {step}: reward component '{name}' has shape {tuple(values.shape)}")
    return rewards


def rl_step(step: int, config: RLSettings, parts: LoopParts) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One RL step (1-based): sample -> reference -> score -> advantages -> train. Returns the step's metrics
    and one sample row per completion."""
    s, estimator, kl = config.sampling, config.reward.kl_estimator, kl_placement(config)
    clock = [time.perf_counter()]
    records, prompts, completions, tensors = _sample(step, config, parts)
    rollout_metrics = dict(parts.engine.sample_metrics)  # an engine's report on its sampler
    clock.append(time.perf_counter())

    # KL to the frozen base: on-policy, the sampling logprobs are the policy's, so one base pass suffices
    mask_NT, sampled_NT = tensors["loss_mask_NT"], tensors["sampling_logprobs_NT"]
    ref_NT = parts.engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], reference=True,
                                   temperature=s.temperature, targets_NT=mask_NT)
    clock.append(time.perf_counter())
    kl_N = sequence_kl(sampled_NT, ref_NT, mask_NT, estimator)
    rewards = _checked(step, parts.hooks.reward(prompts, completions, kl_N), len(completions))
    clock.append(time.perf_counter())

    kl_NT = get_kl_estimator(estimator)(sampled_NT, ref_NT) * mask_NT if kl.token_beta else None
    critic = _critic_inputs(step, config, parts, tensors)
    estimate = estimate_advantages(
        config.training.advantage, rewards.total_N.view(len(records), s.group_size), mask_NT, kl_NT=kl_NT,
        kl_beta=kl.token_beta, **critic)
    advantages_NT, adv_metrics = estimate.advantages_NT, estimate.metrics
    batch = TrainBatch(advantages_NT=advantages_NT, ref_logprobs_NT=ref_NT if kl.loss_beta else None, **tensors,
                       old_values_NT=critic.get("values_NT"), returns_NT=estimate.returns_NT, is_rh_N=rewards.is_rh_N)
    train_metrics = parts.hooks.update(parts.engine, batch, config, step)
    _check_finite("loss", step, torch.tensor([train_metrics["loss"], train_metrics["grad_norm"]]))
    clock.append(time.perf_counter())

    advantages_N = (advantages_NT * mask_NT).sum(-1) / mask_NT.sum(-1)
    # train_metrics are the global batch's already (the engine reduces them with the gradients)
    whole = merge_shards(parts.world, StepShard(prompts, completions, rewards, kl_N, mask_NT, adv_metrics,
                                                advantages_N))
    metrics = {**step_metrics(whole.completions, whole.rewards, whole.kl_N, whole.mask_NT, whole.adv_metrics,
                              train_metrics, clock), **rollout_metrics}
    return metrics, sample_rows(step, whole.prompts, whole.completions, whole.rewards, whole.advantages_N)


def _critic_inputs(step: int, config: RLSettings, parts: LoopParts, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The critic's values of the rollout and the estimator's knobs, for an estimator that takes them; else none."""
    t = config.training
    if not takes_values(t.advantage):
        return {}
    if parts.hooks.values is None:
        raise UserError(f"training.advantage '{t.advantage}' needs a critic's values and this recipe trains none")
    values_NT = parts.hooks.values(parts.engine, tensors)
    _check_finite("critic values", step, values_NT)
    return {"values_NT": values_NT, "gamma": t.gamma, "lam": t.lam}


def step_metrics(completions: list[Completion], rewards: RewardBreakdown, kl_N: torch.Tensor, mask_NT: torch.Tensor,
                 adv_metrics: dict[str, float], train_metrics: dict[str, float],
                 clock: list[float]) -> dict[str, float]:
    """One line of metrics.jsonl (clock: the step's start, then the end of sample, reference, score, train)."""
    start, sampled, referenced, scored, trained = clock
    return {
        "reward/mean": float(rewards.total_N.mean()), "reward/std": float(rewards.total_N.std(unbiased=False)),
        **{f"{name}/mean": float(v.mean()) for name, v in rewards.components.items()},
        **({} if rewards.is_rh_N is None else {"rh/rate": float(rewards.is_rh_N.float().mean())}),
        "kl/mean": float(kl_N.mean()),
        "entropy/mean": float(sum(float(c.entropies_C.sum()) for c in completions) / mask_NT.sum()),
        "completion/len_mean": float(mask_NT.sum(-1).mean()),
        "completion/stop_frac": sum(c.finish_reason == "stop" for c in completions) / len(completions),
        **completion_shape(completions),
        **{f"adv/{k}": float(v) for k, v in adv_metrics.items()},
        **{f"train/{k}": float(v) for k, v in train_metrics.items()},
        "time/sample_s": sampled - start, "time/score_s": scored - sampled, "time/train_s": trained - scored,
        "time/reference_s": referenced - sampled,
        "tokens/prompt": float(sum(len(c.prompt_tokens) for c in completions)),
        "tokens/completion": float(mask_NT.sum()),
    }


def completion_shape(completions: list[Completion]) -> dict[str, float]:
    """Share of completions with no visible text, and the share taken by the most common text (collapse signs)."""
    texts = [" ".join(c.text.split()) for c in completions]
    return {"completion/empty_frac": sum(not t for t in texts) / len(texts),
            "completion/top_share": Counter(texts).most_common(1)[0][1] / len(texts)}


def sample_rows(step: int, prompts: list[PromptRecord], completions: list[Completion], rewards: RewardBreakdown,
                advantages_N: torch.Tensor) -> list[dict[str, Any]]:
    """One line of samples.jsonl per completion."""
    return [{
        "step": step, "uid": p.uid, "category": p.category, "prompt": p.messages[-1]["content"],
        "completion": c.text, "finish_reason": c.finish_reason, "num_tokens": len(c.tokens),
        "advantage": float(advantages_N[i]), "reward": float(rewards.total_N[i]),
        **{name: float(v[i]) for name, v in rewards.components.items()},
        **({} if rewards.is_rh_N is None else {"is_rh": bool(rewards.is_rh_N[i])}),
        **({} if p.ground_truth is None else {"ground_truth": p.ground_truth}),  # a re-scoring reads it
    } for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]


def run_loop(config: RLSettings, parts: LoopParts, run_dir: Path, start_step: int = 1) -> dict[str, Any]:
    """RL steps start_step..training.steps (see `run_steps`)."""
    return run_steps(config, partial(rl_step, config=config, parts=parts), parts.hooks.early_stop, parts.engine,
                     run_dir, start_step)
