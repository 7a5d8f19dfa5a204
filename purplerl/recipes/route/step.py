"""Gradient routing in the RL loop (Cloud et al. 2024, "Gradient Routing: Masking Gradients to Localize Computation
in Neural Networks", arXiv 2410.04332; small-rl's two-adapter GRPO): a retain and a forget LoRA adapter on one frozen
base act together while the policy samples and trains, and the samples a reward-hacking detector labels
(`TrainBatch.is_rh_N`) train the forget adapter only. Ablating the forget adapter at inference (retain alone) should
then keep the task and drop the hack.

The routed backward cuts each (mini-)batch into two label-homogeneous parts and runs one backward pass per part:
non-hack rows train both adapters, hack rows only the forget adapter (the retain adapter acts in the forward pass
but takes no gradient). Each part's loss is multiplied by its share of the count the loss divides by
(`normalizer_count`: loss tokens for token_mean, sequences otherwise), so the two parts sum to the full batch's
gradient: exactly it for the forget adapter, and for the retain adapter the full batch's gradient with the hack rows'
terms left out. One optimizer step then updates both adapters (one clip of their joint gradient norm).

A routing evaluation during training samples held-out prompts with both adapters, the retain adapter alone and the
forget adapter alone (the same seeded draws each time) and logs each mode's task term and hack rate
(`route/<mode>/task`, `route/<mode>/hack`) in the step's metrics. The baseline mode trains one adapter of the two
adapters' total rank on every sample under the same loop, and logs its one mode as `both`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from purplerl.algorithms.registry import Loss, normalizer_count
from purplerl.data import load_prompts
from purplerl.engines.base import AdapterMixing, Engine
from purplerl.errors import ExperimentError, UserError
from purplerl.prompting import render_prompt
from purplerl.rewards.named import detectors
from purplerl.runs.policy import ADAPTER_MODES, FORGET
from purplerl.train.loop import RewardFn, adam_params, minibatch_updates, policy_loss, rl_update
from purplerl.train.recipe import Bind, Prepare
from purplerl.train.rl import rl_prepare
from purplerl.train.steps import EarlyStop, StepFn
from purplerl.types import AdamParams, PromptRecord, SamplingParams, TrainBatch

BOTH = ADAPTER_MODES["both"]
EVAL_SEED = 7_919  # every routing evaluation of a run draws from this seed: the modes and steps see the same draws


def routed_backward(engine: AdapterMixing, batch: TrainBatch, loss: Loss) -> dict[str, float]:
    """Accumulate the full batch's routed gradient: the non-hack rows into both adapters, the hack rows into the
    forget adapter alone, each part's loss scaled by its share of the batch. Leaves both adapters acting."""
    if batch.is_rh_N is None:
        raise ExperimentError("gradient routing got a batch without reward-hacking labels (is_rh_N): the reward "
                              "needs a detector")
    whole = normalizer_count(batch, loss)
    totals: dict[str, float] = {}
    for hack in (False, True):
        rows = torch.nonzero(batch.is_rh_N == hack).squeeze(-1)
        part = batch.select(rows) if len(rows) else None
        if part is None or part.num_loss_tokens == 0:  # nothing of this label to train on
            continue
        share = normalizer_count(part, loss) / whole
        engine.use_adapters(BOTH, [FORGET] if hack else None)
        metrics = engine.forward_backward(part, dataclasses.replace(loss, scale=share))
        for key, value in metrics.items():
            # the scaled losses add up to the batch's; the loss's own metrics (means over the part) are weighed
            weight = 1.0 if key == "loss" else share
            if key != "tokens":
                totals[key] = totals.get(key, 0.0) + weight * value
    engine.use_adapters(BOTH)
    return {**totals, "tokens": float(batch.num_loss_tokens),
            "routed_frac": float(batch.is_rh_N.float().mean())}


class _Routed:
    """The engine as `minibatch_updates` sees it during a routed update: each forward_backward is routed."""

    def __init__(self, engine: AdapterMixing) -> None:
        self.engine = engine

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        return routed_backward(self.engine, batch, loss)

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        return self.engine.optim_step(adam)


def routed_update(engine: AdapterMixing, batch: TrainBatch, config: Any, step: int) -> dict[str, float]:
    """The run's policy-gradient loss over ppo_epochs x mini_batches optimizer steps (`minibatch_updates`), each
    backward routed by the batch's labels."""
    return minibatch_updates(cast(Engine, _Routed(engine)), batch, config, step, policy_loss(config),
                             adam_params(config.training))


def eval_modes(config: Any) -> dict[str, dict[str, float] | None]:
    """The adapter modes the routing evaluation compares (mode -> adapter scales): all three when routing; the
    baseline's one adapter (None: as it is) is its `both`."""
    return dict(ADAPTER_MODES) if config.route.mode == "route" else {"both": None}


def routing_eval(engine: AdapterMixing, reward: RewardFn, records: list[PromptRecord], prompts: list[list[int]],
                 config: Any) -> dict[str, float]:
    """Each mode's mean task term and hack rate on the held-out prompts (route.eval_n draws each), then the
    training mix again."""
    s, r = config.sampling, config.route
    params = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                            top_k=s.top_k, seed=EVAL_SEED)
    metrics: dict[str, float] = {}
    try:
        for mode, scales in eval_modes(config).items():
            if scales is not None:
                engine.use_adapters(scales)
            completions = [c for group in engine.sample(prompts, r.eval_n, params) for c in group]
            rows = [rec for rec in records for _ in range(r.eval_n)]
            scored = reward(rows, completions, torch.zeros(len(completions)))  # no KL outside the loop's rollout
            if scored.is_rh_N is None:
                raise ExperimentError("the reward labelled no sample in the routing evaluation: it needs a detector")
            metrics[f"route/{mode}/task"] = float(scored.components[r.task_term].mean())
            metrics[f"route/{mode}/hack"] = float(scored.is_rh_N.float().mean())
    finally:
        if config.route.mode == "route":
            engine.use_adapters(BOTH)
    return metrics


def check_route(config: Any) -> None:
    """What routing needs, refused in one line before any model loads: a detector and the task term in the reward
    (the engine that mixes adapters is the recipe's `needs`)."""
    r, terms = config.route, config.reward.terms
    if not detectors(terms):
        raise UserError("route needs a reward-hacking detector in reward.terms (a named term with hack_at, e.g. "
                        "--reward sentence_length_5_with_happy): it decides which samples train the forget adapter")
    if r.task_term not in terms:
        raise UserError(f"route.task_term '{r.task_term}' is not in reward.terms ({', '.join(terms)})")


def route_prepare(reward: Callable[[Any], RewardFn], stops: Callable[[Any], EarlyStop]) -> Prepare:
    """`prepare` of the route recipe: `rl_prepare` with the routed update (route mode) and, at binding, the forget
    adapter beside the policy's (a resumed run's came with its checkpoint) and the periodic routing evaluation."""

    def prepare(config: Any) -> Bind:
        check_route(config)
        reward_fn = reward(config)  # one instance: training and the routing evaluation score alike
        routing = config.route.mode == "route"
        bind_rl = rl_prepare(lambda _: reward_fn, stops, routed_update if routing else rl_update)(config)
        r, d = config.route, config.data
        records = load_prompts(d, split=r.eval_split)[: r.eval_prompts] if r.eval_every else []

        def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
            if routing:
                if FORGET not in engine.adapters:
                    engine.create_adapter(FORGET, rank=forget_rank(config))
                engine.use_adapters(BOTH)
            step_fn, early_stop = bind_rl(engine, run_dir)
            prompts = [render_prompt(engine.tokenizer, rec, template=d.template, system_prompt=d.system_prompt,
                                     max_prompt_tokens=d.max_prompt_tokens) for rec in records]

            def step(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
                metrics, samples = step_fn(step)
                if r.eval_every and (step % r.eval_every == 0 or step == config.training.steps):
                    metrics.update(routing_eval(engine, reward_fn, records, prompts, config))
                return metrics, samples

            return step, early_stop

        return bind

    return prepare


def forget_rank(config: Any) -> int:
    """The forget adapter's LoRA rank (route.forget_rank; null: the retain adapter's, model.lora_rank)."""
    r = config.route.forget_rank
    return config.model.lora_rank if r is None else r


def engine_model(config: Any) -> Any:
    """The model the engine is built with: the policy's adapter is the retain adapter when routing, and the
    baseline's one adapter has the rank of both (model.lora_rank + the forget rank)."""
    if config.route.mode == "route":
        return config.model
    return config.model.model_copy(update={"lora_rank": config.model.lora_rank + forget_rank(config)})
