"""The defense's own step (Token Buncher, arXiv 2508.20697): RL steps, and after a warm-up every few steps a Token
Noiser step in their place (see algorithms/noiser.py) on the defended model's own better answers."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from purplerl.errors import ExperimentError

# The engine, loss and tensors are imported where the step runs: the recipe's row imports this module only then.
if TYPE_CHECKING:
    from purplerl.engines.base import Engine
    from purplerl.types import TrainBatch


def is_noiser_step(step: int, config: Any) -> bool:
    """After `noiser_warmup` RL steps, every `noiser_every`-th step is a Token Noiser step."""
    d = config.defend
    return d.noiser and step > d.noiser_warmup and (step - d.noiser_warmup) % d.noiser_every == 0


def noiser_targets(batch: TrainBatch) -> TrainBatch:
    """The response tokens with advantage >= 0, which the reference implementation trains the noiser on: the
    defended model's own better answers, made more confident. Token by token, as there; with one advantage per
    response (GRPO, RLOO) that is whole responses. The reference also trains on its right padding (advantage 0
    there); here padding is never a target."""
    import torch

    mask_NT = batch.loss_mask_NT * (batch.advantages_NT >= 0)
    rows = torch.nonzero(mask_NT.sum(-1) > 0).squeeze(-1)
    return dataclasses.replace(batch, loss_mask_NT=mask_NT).select(rows)


def noiser_update(engine: Engine, batch: TrainBatch, config: Any, step: int) -> dict[str, float]:
    """One Token Noiser step (Token Buncher, arXiv 2508.20697) on `noiser_targets`."""
    from purplerl.algorithms.registry import Loss, TokenNoiserParams
    from purplerl.train.loop import adam_params, sampling_seed

    kept = noiser_targets(batch)
    if kept.num_sequences == 0:
        raise ExperimentError(f"step {step}: Token Noiser step has no responses with advantage >= 0")
    d, t = config.defend, config.training
    params = TokenNoiserParams(epsilon=d.noiser_epsilon, noise_weight=d.noiser_noise_weight)
    loss = Loss("token_noiser", params, temperature=config.sampling.temperature,
                seed=sampling_seed(t.seed, step))
    metrics = engine.forward_backward(kept, loss)
    return {**metrics, **engine.optim_step(adam_params(t)), "noiser_step": 1.0,
            "noiser_sequences": kept.num_sequences}


def defend_update(engine: Engine, batch: TrainBatch, config: Any, step: int) -> dict[str, float]:
    """RL steps, with a Token Noiser step in their place on the noiser schedule."""
    from purplerl.train.loop import rl_update

    if is_noiser_step(step, config):
        return noiser_update(engine, batch, config, step)
    return rl_update(engine, batch, config, step)
