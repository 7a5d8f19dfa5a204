"""The RL loop: sample -> score -> advantages -> batch -> train -> log -> checkpoint.

`rl_step` is one step, read top to bottom; `run_loop` repeats it, logs, checkpoints and stops early.
Recipes differ only in what they pass in `LoopParts` (reward function, early-stop rule, prompts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from purplerl.algorithms.advantages import compute_advantages
from purplerl.algorithms.kl import get_kl_estimator, sequence_kl
from purplerl.config import Config, TrainingConfig
from purplerl.data import PromptSampler
from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError
from purplerl.train.batch import sequence_tensors
from purplerl.train.checkpoint import save_checkpoint
from purplerl.train.progress import StepProgress
from purplerl.train.sinks import JsonlSink
from purplerl.types import AdamParams, Completion, LossSpec, PromptRecord, RewardBreakdown, SamplingParams, TrainBatch


class RewardFn(Protocol):
    def __call__(self, prompts: list[PromptRecord], completions: list[Completion],
                 kl_N: torch.Tensor) -> RewardBreakdown:
        """Score N completions (prompts[i] is the prompt of completions[i])."""
        ...


@dataclass
class LoopParts:
    engine: Engine
    sampler: PromptSampler
    render: Callable[[PromptRecord], list[int]]  # prompt -> token ids for the engine
    reward_fn: RewardFn
    early_stop: Callable[[dict[str, float]], str | None]  # step metrics -> reason to stop, or None


def _sampling_seed(seed: int, step: int) -> int:
    # a pure function of (seed, step): a resumed run draws exactly what the uninterrupted run drew
    return (seed * 1_000_003 + step) % (2**63 - 1)


def _check_finite(name: str, step: int, values: torch.Tensor) -> None:
    if not torch.isfinite(values).all():
        raise ExperimentError(f"step {step}: non-finite values in {name}")


def reward_kl_beta(config: Config) -> float:
    """Weight of the sequence KL inside the scalar reward: zero when the KL goes into the loss, or into
    REINFORCE++'s per-token rewards instead (never counted twice)."""
    r = config.reward
    return r.kl_beta if r.kl_in == "reward" and config.training.advantage != "reinforce_pp" else 0.0


def is_noiser_step(step: int, t: TrainingConfig) -> bool:
    """After `noiser_warmup` RL steps, every `noiser_every`-th step is a Token Noiser step."""
    return t.noiser and step > t.noiser_warmup and (step - t.noiser_warmup) % t.noiser_every == 0


def _adam(t: TrainingConfig) -> AdamParams:
    return AdamParams(lr=t.lr, beta1=t.adam_beta1, beta2=t.adam_beta2, eps=t.adam_eps,
                      weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm)


def _mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for row in rows for k in row}
    return {k: sum(row[k] for row in rows if k in row) / sum(k in row for row in rows) for k in keys}


def old_logprobs_mode(t: TrainingConfig) -> str:
    """'auto' -> 'current' when the rollout batch gets exactly one update (on-policy), else 'sampler'."""
    if t.old_logprobs != "auto":
        return t.old_logprobs
    return "current" if t.ppo_epochs == 1 and t.mini_batches == 1 else "sampler"


def rl_update(engine: Engine, batch: TrainBatch, config: Config, step: int) -> dict[str, float]:
    """ppo_epochs passes over the rollout batch, each split into mini_batches optimizer steps.

    The sampling logprobs stay the importance-sampling denominator for every pass: they are the behaviour
    policy's, which is what the ratio must correct for after the first update."""
    t, s = config.training, config.sampling
    n = batch.num_sequences
    if t.mini_batches > n:
        raise ExperimentError(f"step {step}: training.mini_batches={t.mini_batches} exceeds the {n} sequences")
    spec = LossSpec(name=t.loss, clip_low=t.clip_low, clip_high=t.clip_high, temperature=s.temperature,
                    kl_beta=config.reward.kl_beta if config.reward.kl_in == "loss" else 0.0,
                    kl_estimator=config.reward.kl_estimator, micro_batch_size=t.micro_batch_size,
                    micro_batch_tokens=t.micro_batch_tokens,
                    aggregation=t.loss_agg, length_norm=float(s.max_new_tokens), old_logprobs=old_logprobs_mode(t))
    rows: list[dict[str, float]] = []
    for epoch in range(t.ppo_epochs):
        order = torch.arange(n)
        if t.mini_batches > 1 or t.ppo_epochs > 1:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(_sampling_seed(t.seed, step) + epoch))
        for rows_idx in torch.tensor_split(order, t.mini_batches):
            metrics = engine.forward_backward(batch.select(rows_idx), spec)
            rows.append({**metrics, **engine.optim_step(_adam(t))})
    return {**_mean_metrics(rows), "updates": float(len(rows))}


def noiser_update(engine: Engine, batch: TrainBatch, config: Config, step: int) -> dict[str, float]:
    """One Token Noiser step (Token Buncher, arXiv 2508.20697) on the given responses."""
    t = config.training
    if batch.num_sequences == 0:
        raise ExperimentError(f"step {step}: Token Noiser step has no responses with advantage >= 0")
    spec = LossSpec(name="token_noiser", temperature=config.sampling.temperature, epsilon=t.noiser_epsilon,
                    noise_seed=_sampling_seed(t.seed, step), micro_batch_size=t.micro_batch_size,
                    micro_batch_tokens=t.micro_batch_tokens)
    metrics = engine.forward_backward(batch, spec)
    return {**metrics, **engine.optim_step(_adam(t)), "noiser_step": 1.0, "noiser_sequences": batch.num_sequences}


def rl_step(step: int, config: Config, parts: LoopParts) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One RL step (1-based). Returns the step's metrics and one sample row per completion."""
    s, t, G = config.sampling, config.training, config.sampling.group_size
    timer = time.perf_counter()

    # sample: B prompts x G completions
    records = parts.sampler.batch(step - 1)
    if not records:
        raise ExperimentError(f"step {step}: the prompt sampler returned an empty batch")
    groups = parts.engine.sample([parts.render(r) for r in records], G, SamplingParams(
        max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
        seed=_sampling_seed(t.seed, step)))
    completions = [c for group in groups for c in group]
    prompts = [r for r in records for _ in range(G)]
    if len(completions) != len(records) * G:
        raise ExperimentError(f"step {step}: engine returned {len(completions)} completions, "
                              f"expected {len(records) * G}")
    tensors = sequence_tensors(completions, int(parts.engine.tokenizer.pad_token_id))
    _check_finite("sampling logprobs", step, tensors["sampling_logprobs_NT"])
    t_sample = time.perf_counter()

    # KL to the frozen base: on-policy, the sampling logprobs are the policy's, so one base pass suffices
    ref_NT = parts.engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], reference=True,
                                   temperature=s.temperature, micro_batch_size=t.micro_batch_size,
                                   micro_batch_tokens=t.micro_batch_tokens,
                                   targets_NT=tensors["loss_mask_NT"])
    t_reference = time.perf_counter()
    kl_N = sequence_kl(tensors["sampling_logprobs_NT"], ref_NT, tensors["loss_mask_NT"],
                       config.reward.kl_estimator)

    # score
    rewards = parts.reward_fn(prompts, completions, kl_N)
    for name, values in {"reward": rewards.total_N, **rewards.components}.items():
        _check_finite(f"reward component '{name}'", step, values)
        if values.shape != (len(completions),):
            raise ExperimentError(f"step {step}: reward component '{name}' has shape {tuple(values.shape)}")
    t_score = time.perf_counter()

    # advantages: per group of G, or per token for REINFORCE++ (whose KL enters the token rewards)
    mask_NT = tensors["loss_mask_NT"]
    token_kl = t.advantage == "reinforce_pp" and config.reward.kl_in == "reward"
    kl_NT = get_kl_estimator(config.reward.kl_estimator)(tensors["sampling_logprobs_NT"], ref_NT) * mask_NT
    advantages_NT, adv_metrics = compute_advantages(
        t.advantage, rewards.total_N.view(len(records), G), mask_NT, kl_NT=kl_NT if token_kl else None,
        kl_beta=config.reward.kl_beta if token_kl else 0.0, scale_by_std=t.advantage_std)
    advantages_N = (advantages_NT * mask_NT).sum(-1) / mask_NT.sum(-1)

    # train: RL updates, or on a Token Noiser step one supervised update on the responses with advantage >= 0
    batch = TrainBatch(advantages_NT=advantages_NT,
                       ref_logprobs_NT=ref_NT if config.reward.kl_in == "loss" else None, **tensors)
    if is_noiser_step(step, t):
        train_metrics = noiser_update(parts.engine, batch.select(torch.nonzero(advantages_N >= 0).squeeze(-1)),
                                      config, step)
    else:
        train_metrics = rl_update(parts.engine, batch, config, step)
    _check_finite("loss", step, torch.tensor([train_metrics["loss"], train_metrics["grad_norm"]]))
    t_train = time.perf_counter()

    mask = mask_NT
    entropy_mean = float(sum(float(c.entropies_C.sum()) for c in completions) / mask.sum())
    metrics: dict[str, float] = {
        "reward/mean": float(rewards.total_N.mean()), "reward/std": float(rewards.total_N.std(unbiased=False)),
        **{f"{name}/mean": float(v.mean()) for name, v in rewards.components.items()},
        "kl/mean": float(kl_N.mean()), "entropy/mean": entropy_mean,
        "completion/len_mean": float(mask.sum(-1).mean()),
        "completion/stop_frac": sum(c.finish_reason == "stop" for c in completions) / len(completions),
        **{f"adv/{k}": float(v) for k, v in adv_metrics.items()},
        **{f"train/{k}": float(v) for k, v in train_metrics.items()},
        "time/sample_s": t_sample - timer, "time/score_s": t_score - t_sample, "time/train_s": t_train - t_score,
        "time/reference_s": t_reference - t_sample,
        "tokens/prompt": float(sum(len(c.prompt_tokens) for c in completions)), "tokens/completion": float(mask.sum()),
    }
    samples = [{
        "step": step, "uid": p.uid, "category": p.category, "prompt": p.messages[-1]["content"],
        "completion": c.text, "finish_reason": c.finish_reason, "num_tokens": len(c.tokens),
        "advantage": float(advantages_N[i]), "reward": float(rewards.total_N[i]),
        **{name: float(v[i]) for name, v in rewards.components.items()},
    } for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    return metrics, samples


def run_loop(config: Config, parts: LoopParts, run_dir: Path, start_step: int = 1) -> dict[str, Any]:
    """Run steps start_step..training.steps; checkpoint every run.save_every steps and at the end."""
    run_dir = Path(run_dir)
    metrics_sink, samples_sink = JsonlSink(run_dir / "metrics.jsonl"), JsonlSink(run_dir / "samples.jsonl")
    stop_reason: str | None = None
    last_step = start_step - 1
    with StepProgress(config.training.steps, start_step - 1, enabled=config.logging.progress) as progress:
        for step in range(start_step, config.training.steps + 1):
            started = time.perf_counter()
            try:
                metrics, samples = rl_step(step, config, parts)
            except ExperimentError as err:  # every failure names the step it happened in
                message = str(err)
                raise ExperimentError(message if message.startswith(f"step {step}") else f"step {step}: {message}"
                                      ) from err
            metrics["time/step_s"] = time.perf_counter() - started
            stop_reason = parts.early_stop(metrics)
            metrics_sink.write([{"step": step, **metrics, **({"early_stop": stop_reason} if stop_reason else {})}])
            samples_sink.write(samples)
            progress.update(step, metrics, samples[: config.logging.print_samples])
            last_step = step
            finished = stop_reason is not None or step == config.training.steps
            if finished or step % config.run.save_every == 0:
                metrics_sink.sync()  # on disk before the checkpoint that claims these steps
                samples_sink.sync()
                save_checkpoint(run_dir, step, parts.engine, {"finished": finished, "stop_reason": stop_reason},
                                config.run.keep_last)
            if stop_reason is not None:
                break
    return {"last_step": last_step, "stop_reason": stop_reason or "completed all steps"}
