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


def gist_prompt(length: int) -> tuple[list[int], list[int]]:
    """A prompt of `length` tokens with gist blocks at BLOCKS (the last segment from column 14 on), its first keys."""
    ids = list(range(40, 40 + length))
    for start in BLOCKS:
        ids[start:start + K] = [0] * K
    return ids, first_keys(length, BLOCKS, K)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gist_sampling_draws_from_the_masked_forward(engine: LocalEngine, temperature: float) -> None:
    """Each drawn token's logprob is the gist-masked forward's of the whole sequence (prompts of two lengths, so
    the left padding differs, two rows each), and differs from the plain causal forward's."""
    from purplerl.train.batch import sequence_tensors
    from purplerl.types import SamplingParams

    prompts = [gist_prompt(17), gist_prompt(21)]
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=3)
    groups = engine.gist_sample([p for p, _ in prompts], [keys for _, keys in prompts], 2, params)
    rows = [c for group in groups for c in group]
    tensors = sequence_tensors(rows, PAD)
    first_NT = torch.zeros_like(tensors["input_ids_NT"])
    for i, c in enumerate(rows):
        keys = prompts[i // 2][1]
        first_NT[i, :len(keys) + len(c.tokens)] = torch.tensor(keys + [keys[-1]] * len(c.tokens))
    mask_NT = tensors["loss_mask_NT"]
    scored = engine.gist_logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], first_NT,
                                  targets_NT=mask_NT)
    sampled = tensors["sampling_logprobs_NT"]
    atol = logprob_atol(torch.float32, engine.trainer.causal_lm.config, 27, float(sampled.abs().max()))
    torch.testing.assert_close(scored * mask_NT, sampled, rtol=0, atol=atol)
    plain = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], targets_NT=mask_NT)
    assert float((plain - sampled).abs().max()) > 100 * atol  # without the mask the history is read whole


def test_the_gist_decode_keeps_only_the_last_block_of_history(engine: LocalEngine) -> None:
    """After the prefill the cache holds, per row, the keys from its last gist block on: the decode reads K keys of
    history plus its own segment, not the whole prompt."""
    from purplerl.engines.decoding import DynamicDecoder
    from purplerl.engines.local_scoring import model_inputs

    ids, keys = gist_prompt(21)
    model = engine.trainer.causal_lm
    ids_BP, attn_BP = torch.tensor([ids]), torch.ones((1, 21), dtype=torch.long)
    position_BP = torch.arange(21)[None]
    decoder = DynamicDecoder(model, engine.sampler.cache_kwarg, attn_BP)
    mask = model_inputs(model.config, ids_BP, attn_BP, position_BP, torch.tensor([keys]))["attention_mask"]
    decoder.prefill(ids_BP, position_BP, mask=mask)
    decoder.keep_from(torch.tensor([keys[-1]]))
    assert keys[-1] == BLOCKS[-1] and decoder.cache.get_seq_length() == 21 - BLOCKS[-1]
    assert decoder.attn.shape == (1, 21 - BLOCKS[-1]) and bool(decoder.attn.all())
