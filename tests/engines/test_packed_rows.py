"""Packed rows on the local engine (data.packing): several sequences in one row, each attending only to itself, give
each sequence the logprobs, the loss and the gradient it has alone, to float precision, for eager attention and
SDPA, for per-token losses (SFT's cross entropy, per-sequence aggregations) and for losses of whole sequences (DPO).
Without the block-diagonal mask and restarting positions the same packed row gives other numbers: the test sees
cross-contamination. The bounds are fp32's over the reduction chain (tests/tolerances.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.packing import unpack
from purplerl.algorithms.registry import LOSS_REGISTRY, CrossEntropyParams, Loss
from purplerl.config import ModelConfig
from purplerl.data.packing import pack_batch
from purplerl.data.sft import Encoded, pad_batch
from purplerl.engines import local_scoring
from purplerl.engines.local import LocalEngine
from purplerl.types import AdamParams, TrainBatch
from tests.tolerances import gradient_atol, logprob_atol

PAD = 2


def sequence(ids: list[int] | range, prompt: int) -> Encoded:
    """A prompt of `prompt` tokens (mask 0) then an answer (mask 1), as SFT encodes a conversation."""
    return Encoded(tuple(ids), (0.0,) * prompt + (1.0,) * (len(ids) - prompt), str(ids[0]))


FIRST, SECOND = sequence(range(5, 17), 4), sequence(range(30, 37), 2)  # two sequences of other lengths


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LocalEngine:
    return LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=0)


@pytest.fixture(params=["eager", "sdpa"])
def attention(request, engine: LocalEngine, monkeypatch) -> str:
    """Each attention implementation, at this short width too (the engine picks eager below 128 tokens on CPU)."""
    monkeypatch.setattr(local_scoring, "EAGER_ATTENTION_MAX_WIDTH", 0)
    monkeypatch.setattr(engine.trainer.causal_lm.config, "_attn_implementation", request.param)
    return request.param


def _alone(engine: LocalEngine, example: Encoded) -> torch.Tensor:
    batch = pad_batch([example], PAD)
    return engine.trainer.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)[0]


def _atol(engine: LocalEngine, width: int, *values: torch.Tensor) -> float:
    return logprob_atol(torch.float32, engine.trainer.causal_lm.config, width,
                        max(float(v.abs().max()) for v in values))


def _grads(engine: LocalEngine, batch: TrainBatch, loss: Loss) -> tuple[dict[str, float], torch.Tensor]:
    metrics = engine.forward_backward(batch, loss)
    flat = torch.cat([p.grad.flatten() for p in engine.trainer.master])
    engine.trainer.optimizer.zero_grad(set_to_none=True)
    return metrics, flat


def _grad_atol(engine: LocalEngine, batch: TrainBatch, *grads: torch.Tensor) -> float:
    return gradient_atol(torch.float32, engine.trainer.causal_lm.config, batch.input_ids_NT.shape[1],
                         int(batch.attention_mask_NT.sum()), max(float(g.abs().max()) for g in grads))


def test_two_packed_sequences_score_as_each_alone(engine: LocalEngine, attention: str) -> None:
    packed = pack_batch(pad_batch([FIRST, SECOND], PAD), 64, PAD)
    assert packed.input_ids_NT.shape == (1, 19) and packed.num_sequences == 2
    logp = engine.trainer.logprobs(packed.input_ids_NT, packed.attention_mask_NT, targets_NT=packed.loss_mask_NT,
                                   position_ids_NT=packed.position_ids_NT)
    each = unpack(logp, packed.position_ids_NT, packed.attention_mask_NT)
    first, second = _alone(engine, FIRST), _alone(engine, SECOND)
    atol = _atol(engine, 19, first, second)
    torch.testing.assert_close(each[0, :12], first, rtol=0, atol=atol)
    torch.testing.assert_close(each[1, :7], second, rtol=0, atol=atol)
    # the loss of each is its own: SFT's NLL per answer token, packed and alone
    masks = unpack(packed.loss_mask_NT, packed.position_ids_NT, packed.attention_mask_NT)
    for row, alone, n in ((0, first, 8), (1, second, 5)):
        assert float(masks[row].sum()) == n
        assert abs(float(-(each[row] * masks[row]).sum()) - float(-alone.sum())) <= n * atol
    # the same row scored as one sequence: the second sees the first, and its logprobs move well past the bound
    plain = engine.trainer.logprobs(packed.input_ids_NT, packed.attention_mask_NT, targets_NT=packed.loss_mask_NT)
    seen = unpack(plain, packed.position_ids_NT, packed.attention_mask_NT)
    assert float((seen[1, :7] - second).abs().max()) > 10 * atol


def test_the_default_targets_of_a_packed_row_skip_each_sequences_first_token(engine: LocalEngine) -> None:
    packed = pack_batch(pad_batch([FIRST, SECOND], PAD), 64, PAD)
    logp = engine.trainer.logprobs(packed.input_ids_NT, packed.attention_mask_NT,
                                   position_ids_NT=packed.position_ids_NT)
    assert float(logp[0, 0]) == 0.0 and float(logp[0, 12]) == 0.0 and bool((logp[0, 13:] != 0).all())


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_a_packed_batch_trains_as_the_unpacked_one(engine: LocalEngine, attention: str, aggregation: str) -> None:
    batch = pad_batch([FIRST, SECOND, sequence(range(40, 45), 3)], PAD)
    packed = pack_batch(batch, 20, PAD)  # rows of 12: [12], [7 + 5]
    assert packed.input_ids_NT.shape == (2, 12) and packed.num_sequences == 3
    loss = Loss("cross_entropy", CrossEntropyParams(), aggregation=aggregation)
    (alone, grads), (together, packed_grads) = _grads(engine, batch, loss), _grads(engine, packed, loss)
    atol = _atol(engine, 12, _alone(engine, FIRST))
    assert abs(alone["loss"] - together["loss"]) <= atol and alone["tokens"] == together["tokens"]
    assert float((grads - packed_grads).abs().max()) <= _grad_atol(engine, batch, grads, packed_grads)


def test_a_packed_preference_batch_gives_dpo_its_unpacked_sequences(engine: LocalEngine, attention: str) -> None:
    """Pairs couple sequences: the engine scores the packed rows and hands the loss one sequence per row, with the
    pairs renumbered in the packed order."""
    batch = pad_batch([SECOND, sequence([30, 31, 60, 61], 2), FIRST, sequence([5, 6, 7, 8, 50, 51, 52], 4)], PAD)
    reference = engine.trainer.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                                        targets_NT=batch.loss_mask_NT)
    batch = dataclasses.replace(batch, ref_logprobs_NT=reference,
                                pairs_P2=torch.tensor([[0, 1], [2, 3]]))
    packed = pack_batch(batch, 19, PAD)  # rows of 12: [12], [7 + 4], [7]: the second pair now in two rows
    assert packed.num_sequences == 4 and packed.pairs_P2.tolist() == [[1, 2], [0, 3]]
    loss = Loss("dpo", LOSS_REGISTRY["dpo"].params())
    engine.forward_backward(batch, Loss("cross_entropy", CrossEntropyParams()))  # move the adapter off the base
    engine.optim_step(AdamParams(lr=0.05))
    (alone, grads), (together, packed_grads) = _grads(engine, batch, loss), _grads(engine, packed, loss)
    atol = _atol(engine, 12, reference)  # per token; an answer's logprob sums at most 8 of them
    for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies"):
        assert abs(alone[key] - together[key]) <= 12 * atol, key
    assert float((grads - packed_grads).abs().max()) <= _grad_atol(engine, batch, grads, packed_grads)
