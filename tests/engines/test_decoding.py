"""The static-KV-cache decoder (the CUDA-graph path's model side) against the growing cache, on CPU: same tokens,
same logprobs and entropies, whatever the padding, truncation or stopping."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from purplerl.config import ModelConfig
from purplerl.engines.decoding import DynamicDecoder, StaticDecoder
from purplerl.engines.local import LocalEngine
from purplerl.types import SamplingParams
from tests.tolerances import decoder_reductions, logprob_atol, reduction_atol

PROMPTS = [[1, 10, 20, 30, 40, 50, 60], [1, 11], [1, 12, 22, 32]]


def _engine(model_dir: Path, **kw) -> LocalEngine:
    lora = {"lora_rank": 4} if kw.get("finetune", "lora") == "lora" else {}  # LoRA fields only where LoRA trains
    return LocalEngine(ModelConfig(name=str(model_dir), device="cpu", dtype="float32", **lora, **kw), seed=0)


def _draws(engine: LocalEngine, mode: str | None, sampling: SamplingParams):
    engine.sampler.decode_static = mode
    return [c for g in engine.sample(PROMPTS, 3, sampling) for c in g]


def _logprob_atol(engine: LocalEngine, sampling: SamplingParams, values: torch.Tensor) -> float:
    """The two caches attend over other lengths in other kernels: the fp32 bound of a logprob's (or an entropy's)
    reductions over the longest sequence drawn (tests/tolerances.py)."""
    positions = max(map(len, PROMPTS)) + sampling.max_new_tokens
    return logprob_atol(torch.float32, engine.model.config, positions, float(values.abs().max()))


def _logits_atol(model, positions: int, logits: torch.Tensor) -> float:
    """Logits of two decoders (other cache lengths, or other batch shapes): the fp32 bound of the decoder's
    reductions (tests/tolerances.py)."""
    return reduction_atol(torch.float32, decoder_reductions(model.config, positions), float(logits.abs().max()))


@pytest.mark.parametrize("sampling", [
    SamplingParams(max_new_tokens=12, seed=4),
    SamplingParams(max_new_tokens=9, seed=5, temperature=0.7, top_p=0.9, top_k=20),
    SamplingParams(max_new_tokens=10, seed=6, temperature=0.0),
], ids=["plain", "truncated", "greedy"])
def test_the_static_cache_draws_what_the_growing_cache_draws(tiny_model_dir: Path,
                                                             sampling: SamplingParams) -> None:
    engine = _engine(tiny_model_dir)
    # a policy off the base, so the merged sampler copy is what decodes
    with torch.no_grad():
        for name, p in engine.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    engine.trainer.touch()  # the LoRA weights changed by hand
    dynamic, static = _draws(engine, None, sampling), _draws(engine, "static", sampling)
    assert [c.tokens for c in dynamic] == [c.tokens for c in static]
    assert [c.finish_reason for c in dynamic] == [c.finish_reason for c in static]
    if sampling.seed == 4:  # rows of several lengths: some stopped early, and the rest decoded on past them
        assert len({len(c.tokens) for c in dynamic}) > 1
    for a, b in zip(dynamic, static, strict=True):
        torch.testing.assert_close(b.logprobs_C, a.logprobs_C, atol=_logprob_atol(engine, sampling, a.logprobs_C),
                                   rtol=0)
        torch.testing.assert_close(b.entropies_C, a.entropies_C, atol=_logprob_atol(engine, sampling, a.entropies_C),
                                   rtol=0)


def test_a_full_parameter_engine_decodes_the_same_over_a_static_cache(tiny_model_dir: Path):
    engine = _engine(tiny_model_dir, finetune="full")
    sampling = SamplingParams(max_new_tokens=8, seed=2)
    dynamic, static = _draws(engine, None, sampling), _draws(engine, "static", sampling)
    assert [c.tokens for c in dynamic] == [c.tokens for c in static]
    for a, b in zip(dynamic, static, strict=True):
        torch.testing.assert_close(b.logprobs_C, a.logprobs_C, atol=_logprob_atol(engine, sampling, a.logprobs_C),
                                   rtol=0)


def test_the_decoders_step_logits_agree_and_the_static_cache_refuses_to_overflow(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    model = engine.sampler.decoding_model()
    attn_NP = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    ids_NP = torch.tensor([[2, 2, 10, 11], [1, 12, 13, 14]])
    position_NP = (attn_NP.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        dynamic = DynamicDecoder(model, engine.sampler.cache_kwarg, attn_NP)
        static = StaticDecoder(model, engine.sampler.cache_kwarg, attn_NP, max_new_tokens=2, graphed=False)
        want = dynamic.prefill(ids_NP, position_NP)
        torch.testing.assert_close(static.prefill(ids_NP, position_NP), want, atol=_logits_atol(model, 6, want),
                                   rtol=0)
        position_N1 = position_NP[:, -1:] + 1
        for tok in ([5, 6], [7, 8]):
            tok_N = torch.tensor(tok)
            want = dynamic.step(tok_N, position_N1)
            torch.testing.assert_close(static.step(tok_N, position_N1), want, atol=_logits_atol(model, 6, want),
                                       rtol=0)
            position_N1 = position_N1 + 1
        with pytest.raises(RuntimeError, match="static KV cache full"):
            static.step(torch.tensor([1, 1]), position_N1)


def test_the_growing_cache_prefills_each_prompt_once_for_its_group(tiny_model_dir: Path) -> None:
    """A group's G rows share one prefill of their prompt: the decoder runs B rows, not B·G, computes the lm_head
    at the last prompt position only, and then decodes exactly as over a prefill of every row."""
    engine = _engine(tiny_model_dir)
    model = engine.sampler.decoding_model()
    attn_BP = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    ids_BP = torch.tensor([[2, 2, 10, 11], [1, 12, 13, 14]])
    position_BP = (attn_BP.cumsum(-1) - 1).clamp(min=0)
    G = 3
    lm_head_rows: list[tuple[int, ...]] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: lm_head_rows.append(tuple(args[0].shape[:2])))
    with torch.no_grad():
        kwarg, last = engine.sampler.cache_kwarg, engine.sampler.last_logits
        shared = DynamicDecoder(model, kwarg, attn_BP.repeat_interleave(G, 0), last)
        every_row = DynamicDecoder(model, kwarg, attn_BP.repeat_interleave(G, 0), last)
        logits_shared = shared.prefill(ids_BP, position_BP, G)
        assert lm_head_rows == [(2, 1)]  # two prompts, one position each
        logits_every = every_row.prefill(ids_BP.repeat_interleave(G, 0), position_BP.repeat_interleave(G, 0))
        assert lm_head_rows[-1] == (6, 1)
        torch.testing.assert_close(logits_shared, logits_every, atol=_logits_atol(model, 7, logits_every), rtol=0)
        assert torch.equal(logits_shared[0], logits_shared[2]) and not torch.equal(logits_shared[2], logits_shared[3])
        position_N1 = position_BP[:, -1:].repeat_interleave(G, 0) + 1
        for step in range(3):  # each row of a group now draws its own token
            tok_N = torch.arange(6) + 5 * step
            want = every_row.step(tok_N, position_N1)
            torch.testing.assert_close(shared.step(tok_N, position_N1), want, atol=_logits_atol(model, 7, want),
                                       rtol=0)
            position_N1 = position_N1 + 1
    hook.remove()


def test_a_cache_that_cannot_repeat_its_batch_prefills_every_row(tiny_model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache layer without batch_repeat_interleave (a linear-attention state) cannot share a prefill: the
    decoder then prefills all B·G rows, and decodes as before."""
    from transformers.cache_utils import DynamicLayer

    engine = _engine(tiny_model_dir)
    model = engine.sampler.decoding_model()
    attn_BP, ids_BP = torch.tensor([[0, 1, 1], [1, 1, 1]]), torch.tensor([[2, 10, 11], [1, 12, 13]])
    position_BP = (attn_BP.cumsum(-1) - 1).clamp(min=0)
    kwarg, last = engine.sampler.cache_kwarg, engine.sampler.last_logits
    with torch.no_grad():
        shared = DynamicDecoder(model, kwarg, attn_BP.repeat_interleave(2, 0), last)
        expected = shared.prefill(ids_BP, position_BP, 2)
        monkeypatch.delattr(DynamicLayer, "batch_repeat_interleave")
        rows: list[int] = []
        hook = model.get_output_embeddings().register_forward_hook(
            lambda module, args, out: rows.append(args[0].shape[0]))
        fallback = DynamicDecoder(model, kwarg, attn_BP.repeat_interleave(2, 0), last)
        torch.testing.assert_close(fallback.prefill(ids_BP, position_BP, 2), expected,
                                   atol=_logits_atol(model, 4, expected), rtol=0)
        assert rows == [2, 4]  # the distinct prompts, then every row
        tok_N, position_N1 = torch.tensor([5, 6, 7, 8]), position_BP[:, -1:].repeat_interleave(2, 0) + 1
        logits_NV = fallback.step(tok_N, position_N1)
        hook.remove()
        monkeypatch.undo()
        torch.testing.assert_close(logits_NV, shared.step(tok_N, position_N1), atol=_logits_atol(model, 4, logits_NV),
                                   rtol=0)
