"""LocalEngine runs any registered loss by what it declares, and a user's loss through the linearized backward.

The linearized backward (`consumes="sequences"` losses and `forward_backward_custom`) takes logprobs without
gradient, differentiates the loss with respect to them, then back-propagates sum(dloss/dlogprobs * logprobs)
micro-batch by micro-batch. These tests hold it to plain autograd through one full forward pass, and to the
engine's per-token path on a loss both can express.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.pairwise import DPOParams
from purplerl.algorithms.registry import CustomLoss, Loss, get_loss_def
from purplerl.config import ModelConfig
from purplerl.engines.local import LocalEngine
from purplerl.errors import ExperimentError
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, SamplingParams, TrainBatch
from tests.tolerances import gradient_atol

PROMPTS = [[1, 10, 20, 30, 40, 50, 60], [1, 11], [1, 12, 22, 32]]
PAD = 2
ADVANTAGES_N = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
PAIRS_P2 = torch.tensor([[0, 1], [3, 2], [4, 5]])  # (chosen, rejected): two completions of each prompt


def _engine(model_dir: Path) -> LocalEngine:
    return LocalEngine(ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=0)


def _tensors(engine: LocalEngine, seed: int) -> dict[str, torch.Tensor]:
    engine.stop_ids = list(range(0, 400, 5))  # completions of varied lengths: micro-batches reorder rows
    comps = [c for g in engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=seed)) for c in g]
    engine.stop_ids = [PAD]
    return sequence_tensors(comps, PAD)


def _trained(model_dir: Path) -> LocalEngine:
    """An engine whose adapter has moved (LoRA B != 0), so the policy differs from the base."""
    engine = _engine(model_dir)
    engine.forward_backward(build_train_batch(_tensors(engine, seed=1), ADVANTAGES_N), Loss("importance_sampling"))
    engine.optim_step(AdamParams(lr=5e-2))
    return engine


def _pair_batch(engine: LocalEngine, tensors: dict[str, torch.Tensor], temperature: float = 1.0) -> TrainBatch:
    mask = tensors["loss_mask_NT"]
    ref = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], reference=True,
                          temperature=temperature, targets_NT=mask)
    return TrainBatch(tensors["input_ids_NT"], tensors["attention_mask_NT"], mask, ref_logprobs_NT=ref,
                      pairs_P2=PAIRS_P2)


def _take_grads(engine: LocalEngine) -> torch.Tensor:
    flat = torch.cat([p.grad.flatten() for p in engine.master])
    engine.optimizer.zero_grad(set_to_none=True)
    return flat


def _close(got: torch.Tensor, want: torch.Tensor, engine: LocalEngine, batch: TrainBatch) -> bool:
    """Equal up to fp32 rounding of a gradient computed along two paths (other micro-batches and kernels, and other
    CPUs' kernels): within the bound of its reduction chain, measured against the larger tensor's largest entry
    (tests/tolerances.py), not a tolerance that one CPU's kernels happen to meet."""
    scale = max(float(got.abs().max()), float(want.abs().max()))
    atol = gradient_atol(torch.float32, engine.model.config, batch.input_ids_NT.shape[1],
                         int(batch.attention_mask_NT.sum()), scale)
    return scale > 0 and float((got - want).abs().max()) <= atol


def _autograd_logprobs(engine: LocalEngine, batch: TrainBatch, temperature: float) -> torch.Tensor:
    """Target logprobs [N, T] with gradient, from one plain forward of the whole batch (0 off the mask)."""
    engine.model.train()
    logits = engine.model(input_ids=batch.input_ids_NT, attention_mask=batch.attention_mask_NT).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1).gather(-1, batch.input_ids_NT[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(logp, (1, 0)) * (batch.loss_mask_NT != 0)


def test_dpo_linearized_backward_equals_autograd_through_one_forward(tiny_model_dir: Path) -> None:
    engine = _trained(tiny_model_dir)
    engine.settings = dataclasses.replace(engine.settings, micro_batch_size=2)  # three micro-batches
    batch = _pair_batch(engine, _tensors(engine, seed=2), temperature=0.7)
    loss = Loss("dpo", DPOParams(beta=0.5), temperature=0.7)
    metrics = engine.forward_backward(batch, loss)
    linearized = _take_grads(engine)

    value, expected_metrics = get_loss_def("dpo").fn(_autograd_logprobs(engine, batch, 0.7), batch.inputs(),
                                                     DPOParams(beta=0.5))
    value.backward()
    direct = _take_grads(engine)
    assert _close(linearized, direct, engine, batch)
    assert metrics["loss"] == pytest.approx(float(value.detach()), abs=1e-5)
    assert metrics["reward_margin"] == pytest.approx(expected_metrics["reward_margin"], abs=1e-4)
    assert metrics["tokens"] == float(batch.loss_mask_NT.sum())


def test_dpo_starts_at_log_2_and_training_separates_the_pairs(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)  # a fresh adapter is the base: every implicit reward is 0
    batch = _pair_batch(engine, _tensors(engine, seed=3))
    loss = Loss("dpo", DPOParams(beta=0.5))
    first = engine.forward_backward(batch, loss)
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["reward_margin"] == pytest.approx(0.0, abs=1e-5)
    engine.optim_step(AdamParams(lr=5e-2))
    for _ in range(4):
        metrics = engine.forward_backward(batch, loss)
        engine.optim_step(AdamParams(lr=5e-2))
    assert metrics["pair_accuracy"] == 1.0 and metrics["reward_margin"] > 0.1
    assert metrics["loss"] < math.log(2) - 0.01
    # the chosen answers gained on the rejected ones, measured against the frozen base
    ids, attn, mask = batch.input_ids_NT, batch.attention_mask_NT, batch.loss_mask_NT
    margin_N = ((engine.logprobs(ids, attn, targets_NT=mask) - batch.ref_logprobs_NT) * mask).sum(-1)
    assert bool((margin_N[PAIRS_P2[:, 0]] > margin_N[PAIRS_P2[:, 1]]).all())


def test_custom_loss_gives_the_registered_cross_entropy_gradient(tiny_model_dir: Path) -> None:
    engine = _trained(tiny_model_dir)
    engine.settings = dataclasses.replace(engine.settings, micro_batch_size=2)
    batch = build_train_batch(_tensors(engine, seed=4), ADVANTAGES_N)
    seen: dict[str, tuple[int, ...]] = {}

    def token_mean_nll(logp_NT: torch.Tensor, inputs) -> tuple[torch.Tensor, dict[str, float]]:
        seen.update({name: tuple(t.shape) for name, t in inputs.items()})
        mask_NT = inputs["loss_mask_NT"]
        return (-logp_NT * mask_NT).sum() / mask_NT.sum(), {"custom_metric": 3.0}

    registered = engine.forward_backward(batch, Loss("cross_entropy", temperature=0.7))
    per_token = _take_grads(engine)
    custom = engine.forward_backward_custom(batch, CustomLoss(token_mean_nll, temperature=0.7))
    linearized = _take_grads(engine)
    assert float(per_token.abs().max()) > 0
    assert _close(linearized, per_token, engine, batch)
    assert custom["loss"] == pytest.approx(registered["loss"], abs=1e-5)
    assert custom["loss"] == pytest.approx(registered["nll"], abs=1e-5)  # token mean with unit weights
    assert custom["custom_metric"] == 3.0 and custom["tokens"] == registered["tokens"]
    shape = tuple(batch.input_ids_NT.shape)
    assert seen == {"loss_mask_NT": shape, "sampling_logprobs_NT": shape, "advantages_NT": shape}


def test_linearized_backward_refuses_what_it_cannot_differentiate(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    batch = build_train_batch(_tensors(engine, seed=5), ADVANTAGES_N)
    with pytest.raises(ExperimentError, match="the loss must be one finite number"):
        engine.forward_backward_custom(batch, CustomLoss(lambda lp, inputs: (lp.sum(-1), {})))
    with pytest.raises(ExperimentError, match="the loss must be one finite number"):
        engine.forward_backward_custom(batch, CustomLoss(lambda lp, inputs: (lp.sum() * math.nan, {})))
    with pytest.raises(ExperimentError, match="does not depend on the logprobs"):
        engine.forward_backward_custom(batch, CustomLoss(lambda lp, inputs: (torch.ones((), requires_grad=True), {})))
    # a pairwise loss on a batch without pairs (or without its reference) is refused before any pass
    with pytest.raises(ExperimentError, match="loss 'dpo' needs ref_logprobs_NT"):
        engine.forward_backward(batch, Loss("dpo"))
    assert all(p.grad is None for p in engine.trainable)
