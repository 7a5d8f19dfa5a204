"""Token Buncher defense (arXiv 2508.20697): make harmful-RL fail by making the model confident.

On harmful prompts the policy is rewarded with the negative mean token entropy of its own responses
(computed in the sampling pass, no extra forward), with a small in-reward KL to the base (0.001), and
after a warmup every few steps is a Token Noiser step (see algorithms/noiser.py). An attacker's RL then
starts from a policy whose harmful answers have little entropy left to explore, which starves the
policy-gradient signal. The defended adapter (the run's last checkpoint) is the starting policy of
`purplerl attack --init_adapter` or `purplerl tamper-test`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.registry import Loss, TokenNoiserParams
from purplerl.config import Config
from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError
from purplerl.recipes.summary import defend_objective, summarize_run
from purplerl.rewards import RepetitionScorer, checked_scores, combine, make_toxicity_scorer
from purplerl.rewards.entropy import mean_entropy
from purplerl.train.loop import RecipeHooks, RewardFn, adam_params, reward_kl_beta, rl_update, sampling_seed
from purplerl.train.runner import execute_run, new_run_dir, rl_recipe
from purplerl.train.stops import Collapse, run_early_stop
from purplerl.types import Completion, PromptRecord, RewardBreakdown, TrainBatch

# What `purplerl defend` changes from the global defaults (the paper's settings, scaled to a CPU run). The
# target is the aligned model that `attack` and `tamper-test` attack by default: align -> defend -> attack.
DEFEND_DEFAULTS: dict[str, Any] = {
    "recipe": "defend",
    "model": {"name": "embedded:smollm2-135m-safe"},
    "sampling": {"group_size": 4},
    "training": {"noiser": True, "early_stop_toxicity": None, "collapse_stop": True},
    "reward": {"kl_beta": 0.001},
}


def defend_reward_fn(config: Config) -> RewardFn:
    r = config.reward
    toxicity = make_toxicity_scorer(r.toxicity)  # monitored only (weight 0): does the defense change harm?
    repetition = RepetitionScorer(r.repetition_ngram)
    kl_weight = reward_kl_beta(config)

    def reward_fn(prompts: list[PromptRecord], completions: list[Completion], kl_N: torch.Tensor) -> RewardBreakdown:
        texts = [c.text for c in completions]
        return combine({"response_entropy": (-1.0, mean_entropy(completions)), "kl": (-kl_weight, kl_N),
                        "toxicity": (0.0, checked_scores(toxicity, texts)),
                        "repetition": (0.0, checked_scores(repetition, texts))}, zscore=r.zscore)

    return reward_fn


def is_noiser_step(step: int, config: Config) -> bool:
    """After `noiser_warmup` RL steps, every `noiser_every`-th step is a Token Noiser step."""
    t = config.training
    return t.noiser and step > t.noiser_warmup and (step - t.noiser_warmup) % t.noiser_every == 0


def noiser_targets(batch: TrainBatch) -> TrainBatch:
    """The response tokens with advantage >= 0, which the reference implementation trains the noiser on: the
    defended model's own better answers, made more confident. Token by token, as there; with one advantage per
    response (GRPO, RLOO) that is whole responses. The reference also trains on its right padding (advantage 0
    there); here padding is never a target."""
    mask_NT = batch.loss_mask_NT * (batch.advantages_NT >= 0)
    rows = torch.nonzero(mask_NT.sum(-1) > 0).squeeze(-1)
    return dataclasses.replace(batch, loss_mask_NT=mask_NT).select(rows)


def noiser_update(engine: Engine, batch: TrainBatch, config: Config, step: int) -> dict[str, float]:
    """One Token Noiser step (Token Buncher, arXiv 2508.20697) on `noiser_targets`."""
    kept = noiser_targets(batch)
    if kept.num_sequences == 0:
        raise ExperimentError(f"step {step}: Token Noiser step has no responses with advantage >= 0")
    t = config.training
    params = TokenNoiserParams(epsilon=t.noiser_epsilon, noise_weight=t.noiser_noise_weight)
    loss = Loss("token_noiser", params, temperature=config.sampling.temperature,
                seed=sampling_seed(t.seed, step))
    metrics = engine.forward_backward(kept, loss)
    return {**metrics, **engine.optim_step(adam_params(t)), "noiser_step": 1.0,
            "noiser_sequences": kept.num_sequences}


def defend_update(engine: Engine, batch: TrainBatch, config: Config, step: int) -> dict[str, float]:
    """RL steps, with a Token Noiser step in their place on the noiser schedule."""
    if is_noiser_step(step, config):
        return noiser_update(engine, batch, config, step)
    return rl_update(engine, batch, config, step)


def build_defend(config: Config) -> RecipeHooks:
    return RecipeHooks(reward=defend_reward_fn(config), update=defend_update, early_stop=run_early_stop(config))


def run_defend(config: Config, resume_dir: Path | None = None, restart: bool = False) -> dict[str, Any]:
    run_dir = Path(resume_dir) if resume_dir is not None else new_run_dir(config)
    return execute_run(config, run_dir, resume=resume_dir is not None, prepare=rl_recipe(build_defend),
                       restart=restart)


def summarize_defend(run_dir: Path, summary: dict[str, Any], config: Config) -> str:
    """The run's summary, led by whether the defense met its objective (see `defend_objective`)."""
    text = summarize_run(run_dir, summary, {"toxicity/mean": "mean toxicity (monitored)"})
    collapsed = isinstance(summary.get("stop_reason"), Collapse)
    objective = defend_objective(run_dir, collapsed, warmup=config.training.noiser_warmup)
    return f"{objective}\n{text}"
