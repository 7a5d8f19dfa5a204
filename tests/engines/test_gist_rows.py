"""Gist rows on the local engine (dialogue.gist_tokens): `gist_logprobs` scores each token as the compressed-cache
forward does (only the last gist block's keys kept), and a gist row packed beside another sequence gives the same
cross-entropy loss and gradient as alone. The bounds are fp32's over the reduction chain (tests/tolerances.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from purplerl.algorithms.logprobs import selective_log_softmax
from purplerl.algorithms.registry import CrossEntropyParams, Loss
from purplerl.config import ModelConfig
from purplerl.data.gist import compressed_logits, first_keys
from purplerl.data.packing import pack_batch
from purplerl.data.sft import Encoded, pad_batch
from purplerl.engines.local import LocalEngine
from tests.tolerances import gradient_atol, logprob_atol

PAD, K, BLOCKS = 2, 2, (5, 12)


def gist_row() -> Encoded:
    ids = list(range(5, 23))
    for start in BLOCKS:
        ids[start:start + K] = [0] * K
    mask = tuple(0.0 if any(s <= i < s + K for s in BLOCKS) or i < 2 else 1.0 for i in range(len(ids)))
    return Encoded(tuple(ids), mask, "g", 14, BLOCKS, tuple(first_keys(len(ids), BLOCKS, K)))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LocalEngine:
    return LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=0)


def test_gist_logprobs_are_the_compressed_cache_forward(engine: LocalEngine) -> None:
    row = gist_row()
    batch = pad_batch([row], PAD)
    got = engine.gist_logprobs(batch.input_ids_NT, batch.attention_mask_NT, batch.first_key_NT,
                               targets_NT=batch.loss_mask_NT)[0]
    logits = compressed_logits(engine.trainer.causal_lm, row.ids, BLOCKS, K)
    ids = torch.tensor(row.ids)
    expected = torch.nn.functional.pad(selective_log_softmax(logits[None, :-1], ids[None, 1:])[0], (1, 0))
    expected = expected * batch.loss_mask_NT[0]
    atol = logprob_atol(torch.float32, engine.trainer.causal_lm.config, len(ids), float(expected.abs().max()))
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)
    plain = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)[0]
    assert float((plain - got)[14:].abs().max()) > 100 * atol  # the last segment reads another context


def test_a_packed_gist_row_trains_as_alone(engine: LocalEngine) -> None:
    loss = Loss("cross_entropy", CrossEntropyParams(), aggregation="seq_mean_token_mean")
    other = Encoded(tuple(range(30, 37)), (0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0), "o")

    def grads(batch) -> tuple[float, torch.Tensor]:
        metrics = engine.forward_backward(batch, loss)
        flat = torch.cat([p.grad.flatten() for p in engine.trainer.master])
        engine.trainer.optimizer.zero_grad(set_to_none=True)
        return metrics["loss"], flat

    alone_loss, alone = grads(pad_batch([gist_row(), other], PAD))
    packed = pack_batch(pad_batch([other, gist_row()], PAD), 64, PAD)
    assert packed.input_ids_NT.shape[0] == 1 and packed.first_key_NT is not None
    packed_loss, together = grads(packed)
    config = engine.trainer.causal_lm.config
    assert packed_loss == pytest.approx(alone_loss, abs=logprob_atol(torch.float32, config, 25, 10.0))
    atol = gradient_atol(torch.float32, config, 25, 25, float(alone.abs().max()))
    torch.testing.assert_close(together, alone, rtol=0, atol=atol)
