"""The local engine's fast paths against its plain ones, on tiny random Llamas.

- the merged sampler (a plain model copy with the LoRA delta written in) samples what the PEFT model would;
- LM-head-only-at-scored-positions gives the full-logits logprobs and gradients;
- on-policy "current" old logprobs give the exact on-policy gradient whatever the sampler's numerics;
- a bf16 base stays within a stated tolerance of fp32.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig, RLTrainingConfig
from purplerl.engines import loading
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.engines.local_sampling import draw
from purplerl.engines.local_scoring import EAGER_ATTENTION_MAX_WIDTH, attention_for, micro_batches
from purplerl.errors import ExperimentError
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.train.loop import old_logprobs_mode
from purplerl.types import AdamParams, SamplingParams, TrainBatch
from tests.tolerances import gradient_atol, logprob_atol

PROMPTS = [[1, 10, 20, 30, 40, 50, 60], [1, 11], [1, 12, 22, 32]]
PAD = 2
ADVANTAGES_N = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def _engine(model_dir: Path, settings: EngineSettings | None = None, **model_kw) -> LocalEngine:
    kw = {"lora_rank": 4, "dtype": "float32", **model_kw}
    return LocalEngine(ModelConfig(name=str(model_dir), device="cpu", **kw), seed=0, settings=settings)


def _sample(engine: LocalEngine, seed: int, max_new_tokens: int = 8):
    groups = engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=max_new_tokens, seed=seed))
    comps = [c for g in groups for c in g]
    return comps, sequence_tensors(comps, PAD)


def _pg(name: str, **params) -> Loss:
    """A policy-gradient loss with the given PolicyGradientParams."""
    return Loss(name, PolicyGradientParams(**params))


def _train(engine: LocalEngine, seed: int, lr: float = 5e-2) -> None:
    _, tensors = _sample(engine, seed)
    engine.forward_backward(build_train_batch(tensors, ADVANTAGES_N), _pg("importance_sampling"))
    engine.optim_step(AdamParams(lr=lr))


# Two code paths or batch splittings sum the same float32 terms in another order, and other CPUs' kernels change
# the order again: so the bound is derived from fp32 and the reduction chain (tests/tolerances.py; ~2.5e-4 of the
# largest entry for gradients, 7e-4 for logprobs of size ~6), not from the noise one CPU shows (6e-8 of 0.3 for
# gradients, 5e-7 for logprobs). It is still ~1e3x below the effects these tests tell apart (a 0.3-nat skew moves
# gradients by 0.13 of 0.5).
def _grad_atol(engine: LocalEngine, batch: TrainBatch, *grads: torch.Tensor) -> float:
    """The fp32 bound on a flat gradient computed along two paths, measured against its largest entry."""
    return gradient_atol(torch.float32, engine.model.config, batch.input_ids_NT.shape[1],
                         int(batch.attention_mask_NT.sum()), max(float(g.abs().max()) for g in grads))


def _close(got: torch.Tensor, want: torch.Tensor, engine: LocalEngine, batch: TrainBatch) -> bool:
    """Equal up to fp32 rounding along two paths, within the bound of the gradient's reduction chain."""
    return float((got - want).abs().max()) <= _grad_atol(engine, batch, got, want)


def _lp_atol(engine: LocalEngine, ids_NT: torch.Tensor, logprobs: torch.Tensor) -> float:
    """The fp32 bound on logprobs computed along two paths (tests/tolerances.py)."""
    return logprob_atol(torch.float32, engine.model.config, ids_NT.shape[1], float(logprobs.abs().max()))


def _grads(engine: LocalEngine, batch: TrainBatch, loss: Loss, **settings: int) -> torch.Tensor:
    """The gradient of one forward_backward, under the engine's settings changed by `settings` for this call."""
    before = engine.settings
    engine.settings = dataclasses.replace(before, **settings)
    try:
        engine.forward_backward(batch, loss)
    finally:
        engine.settings = before
    flat = torch.cat([p.grad.flatten() for p in engine.master])  # fp32 (the trainable params under fp32)
    engine.optimizer.zero_grad(set_to_none=True)
    return flat


def test_merged_sampler_draws_what_the_adapter_model_draws(tiny_model_dir: Path, tmp_path: Path) -> None:
    merged, plain = _engine(tiny_model_dir), _engine(tiny_model_dir, EngineSettings(merged_sampler=False))
    assert merged.sampler.merged is not None and plain.sampler.merged is None
    for step in range(3):  # the sampler must follow every optimizer step
        # both train on one batch, so their adapters stay equal whatever either sampler draws
        _, tensors = _sample(plain, seed=step)
        for engine in (merged, plain):
            engine.forward_backward(build_train_batch(tensors, ADVANTAGES_N), _pg("importance_sampling"))
            engine.optim_step(AdamParams(lr=5e-2))
        assert all(torch.equal(x, y) for x, y in zip(merged.master, plain.master, strict=True))
        # The merged weights (W + s B A) and the adapter model (W x + s B A x) round differently: logits move by
        # ~1e-6, and a uniform draw within that of a CDF boundary picks the neighbouring token (the closest
        # draw here is 2e-7 from one). So each sampler's recorded logprobs are checked against the adapter
        # model along its own path, and the tokens only need to agree for all but one completion per step.
        a, ta = _sample(merged, seed=100 + step)
        b, tb = _sample(plain, seed=100 + step)
        assert sum(x.tokens == y.tokens for x, y in zip(a, b, strict=True)) >= len(a) - 1
        for t in (ta, tb):
            ids, attn, mask = t["input_ids_NT"], t["attention_mask_NT"], t["loss_mask_NT"]
            recorded = t["sampling_logprobs_NT"]
            assert float(((plain.logprobs(ids, attn) - recorded) * mask).abs().max()) <= _lp_atol(plain, ids, recorded)
            # the adapter has moved the distribution far beyond that tolerance: a stale sampler would fail
            assert float(((plain.logprobs(ids, attn, reference=True) - recorded) * mask).abs().max()) > 1e-2
    # the adapter changed the sampler's weights, and the PEFT base weights stayed untouched
    q_name = "model.layers.0.self_attn.q_proj"
    peft_q = merged.model.get_base_model().get_submodule(q_name)
    assert not torch.equal(merged.sampler.merged.get_submodule(q_name).weight, peft_q.get_base_layer().weight)
    # load() resyncs too: a fresh engine restoring the adapter samples the same tokens
    merged.save(tmp_path / "ckpt")
    fresh = _engine(tiny_model_dir)
    fresh.load(tmp_path / "ckpt")
    assert [c.tokens for c in _sample(fresh, seed=7)[0]] == [c.tokens for c in _sample(merged, seed=7)[0]]


def test_lora_on_a_tied_lm_head_unties_it_in_the_sampler_only(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    engine = _engine(tmp_path, lora_targets="lm_head")
    embeddings_before = engine.sampler.merged.get_input_embeddings().weight.clone()
    _train(engine, seed=1, lr=0.2)
    comps, tensors = _sample(engine, seed=2)
    # the sampler's embeddings are still the base's; only its LM head carries the LoRA delta
    assert torch.equal(engine.sampler.merged.get_input_embeddings().weight, embeddings_before)
    assert not torch.equal(engine.sampler.merged.get_output_embeddings().weight, embeddings_before)
    recomputed = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"])
    mask = tensors["loss_mask_NT"]
    drift = ((recomputed - tensors["sampling_logprobs_NT"]) * mask).abs().max()
    assert float(drift) <= _lp_atol(engine, tensors["input_ids_NT"], recomputed * mask)


def test_head_only_scoring_equals_full_logits_in_values_and_gradients(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    _train(engine, seed=3)
    _, tensors = _sample(engine, seed=4)
    ids, attn, mask = tensors["input_ids_NT"], tensors["attention_mask_NT"], tensors["loss_mask_NT"]
    batch = build_train_batch(tensors, ADVANTAGES_N)
    loss = _pg("ppo_clip")
    assert engine.trainer.head_only
    fast_lp = engine.logprobs(ids, attn)
    fast_ref = engine.logprobs(ids, attn, reference=True, targets_NT=mask)
    fast_grad = _grads(engine, batch, loss, micro_batch_size=4)
    engine.trainer.head_only = False
    full_lp = engine.logprobs(ids, attn)
    full_ref = engine.logprobs(ids, attn, reference=True, targets_NT=mask)
    full_grad = _grads(engine, batch, loss, micro_batch_size=4)
    assert torch.allclose(fast_lp, full_lp, rtol=0, atol=_lp_atol(engine, ids, full_lp))
    assert torch.allclose(fast_ref, full_ref, rtol=0, atol=_lp_atol(engine, ids, full_ref))
    assert _close(fast_grad, full_grad, engine, batch)
    # targets_NT limits scoring to the completion: zero elsewhere, the same values on it
    assert torch.equal(fast_ref, fast_ref * mask)
    every = engine.logprobs(ids, attn, reference=True) * mask
    assert torch.allclose(fast_ref, every, rtol=0, atol=_lp_atol(engine, ids, every))
    assert float(fast_lp[:, 0].abs().max()) == 0.0 and float((fast_lp * (1 - mask)).abs().sum()) > 0


def test_current_old_logprobs_give_the_exact_on_policy_gradient(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    _train(engine, seed=5)
    _, tensors = _sample(engine, seed=6)
    exact = build_train_batch(tensors, ADVANTAGES_N)  # fp32: sampling logprobs == the policy's to ~1e-6
    skewed_lp = tensors["sampling_logprobs_NT"] + 0.3 * tensors["loss_mask_NT"]  # a sampler with other numerics
    skewed = build_train_batch({**tensors, "sampling_logprobs_NT": skewed_lp}, ADVANTAGES_N)
    for loss in ("importance_sampling", "ppo_clip"):
        reference = _grads(engine, exact, _pg(loss))
        current = _grads(engine, skewed, _pg(loss, old_logprobs="current"))
        off = _grads(engine, skewed, _pg(loss, old_logprobs="sampler"))
        assert _close(current, reference, engine, exact)
        # the skew matters when used: far beyond the tolerance, not just outside it
        assert float((off - reference).abs().max()) > 100 * _grad_atol(engine, exact, reference)


@pytest.mark.parametrize(("mode", "epochs", "minis", "expected"), [
    ("auto", 1, 1, "current"), ("auto", 2, 1, "sampler"), ("auto", 1, 4, "sampler"),
    ("sampler", 1, 1, "sampler"), ("current", 2, 2, "current")])
def test_old_logprobs_auto_is_current_only_for_one_update_per_batch(mode, epochs, minis, expected) -> None:
    assert old_logprobs_mode(RLTrainingConfig(old_logprobs=mode, ppo_epochs=epochs, mini_batches=minis)) == expected


def test_auto_dtype_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(loading, "cpu_has_fast_bf16", lambda: True)
    assert loading.resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(loading, "cpu_has_fast_bf16", lambda: False)
    assert loading.resolve_dtype("auto", cpu) == torch.float32
    assert loading.resolve_dtype("float32", cpu) == torch.float32


def test_bf16_base_stays_within_tolerance_of_fp32(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Same adapter, same batch: bf16 logprobs within 0.05 nats per token (mean 0.01), gradient cosine > 0.99."""
    fp32 = _engine(tiny_model_dir)
    _train(fp32, seed=8)
    fp32.save(tmp_path / "adapter")
    bf16 = _engine(tiny_model_dir, dtype="bfloat16")
    bf16.load(tmp_path / "adapter")
    assert all(p.dtype == torch.float32 for p in bf16.master)  # the optimizer's LoRA masters stay fp32
    assert all(p.dtype == torch.bfloat16 for p in bf16.trainable)  # the adapter computes in bf16
    # loading put fp32 values into the masters exactly, and their bf16 copies into the model
    saved = [p.detach().clone() for p in fp32.master]
    assert all(torch.equal(a, b) for a, b in zip(saved, bf16.master, strict=True))
    assert all(torch.equal(a.to(torch.bfloat16), b) for a, b in zip(saved, bf16.trainable, strict=True))
    assert bf16.model.get_base_model().get_input_embeddings().weight.dtype == torch.bfloat16
    _, tensors = _sample(fp32, seed=9, max_new_tokens=12)
    ids, attn, mask = tensors["input_ids_NT"], tensors["attention_mask_NT"], tensors["loss_mask_NT"]
    diff = (fp32.logprobs(ids, attn) - bf16.logprobs(ids, attn))[mask.bool()].abs()
    assert float(diff.max()) < 0.05 and float(diff.mean()) < 0.01
    batch = build_train_batch(tensors, ADVANTAGES_N)
    loss = _pg("ppo_clip", old_logprobs="current")
    g32, g16 = _grads(fp32, batch, loss), _grads(bf16, batch, loss)
    assert float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) > 0.99
    assert float(g16.norm() / g32.norm()) == pytest.approx(1.0, abs=0.05)
    # and the bf16 merged sampler samples from (nearly) the same distribution as its own scorer
    comps, t16 = _sample(bf16, seed=10, max_new_tokens=12)
    drift = (bf16.logprobs(t16["input_ids_NT"], t16["attention_mask_NT"]) - t16["sampling_logprobs_NT"])
    assert float(drift[t16["loss_mask_NT"].bool()].abs().mean()) < 0.01


def test_inverse_cdf_draw_follows_the_distribution_and_never_picks_zero_mass() -> None:
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [0.1, 0.0, 0.0, 0.9, 0.0]])
    n = 20_000
    draws_n3 = draw(probs.repeat(n, 1), torch.Generator().manual_seed(0)).view(n, 3)
    freq = torch.bincount(draws_n3[:, 0], minlength=5) / n
    assert torch.allclose(freq, probs[0], atol=0.015)  # 3 sigma of a binomial frequency at n = 20k is ~0.01
    assert set(draws_n3[:, 1].tolist()) == {4}
    assert set(draws_n3[:, 2].tolist()) <= {0, 3} and abs(float((draws_n3[:, 2] == 0).float().mean()) - 0.1) < 0.01
    # the largest draw below the total mass lands on the last token with p > 0, never past it
    cdf = probs.cumsum(-1)
    edge = torch.searchsorted(cdf, torch.nextafter(cdf[:, -1:], torch.zeros(3, 1)), right=True).squeeze(-1)
    assert edge.tolist() == [3, 4, 3]


def test_micro_batches_fill_a_token_budget_in_length_order() -> None:
    lengths = [5, 2, 9, 3, 3, 7]
    attn = torch.zeros((6, 9), dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1

    def split(max_sequences: int, max_tokens: int) -> list[list[int]]:
        return [b.tolist() for b in micro_batches(attn, max_sequences, max_tokens)]

    # sorted by length: 1(2) 3(3) 4(3) 0(5) 5(7) 2(9); a micro-batch costs rows x its longest row
    assert split(64, 10) == [[1, 3, 4], [0], [5], [2]]  # 3x3=9 fits, 4x5=20 does not; 2x7, 2x9 do not
    assert split(2, 10) == [[1, 3], [4, 0], [5], [2]]  # at most 2 rows; 2x5=10 fits
    assert split(64, 4) == [[1], [3], [4], [0], [5], [2]]  # a row longer than the budget still runs alone
    assert split(64, 10_000) == [[1, 3, 4, 0, 5, 2]]


def test_token_budget_micro_batches_give_the_full_batch_gradient(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    _train(engine, seed=12)
    _, tensors = _sample(engine, seed=13)
    batch = build_train_batch(tensors, ADVANTAGES_N)
    full = _grads(engine, batch, _pg("ppo_clip"))
    budgeted = _grads(engine, batch, _pg("ppo_clip"), micro_batch_tokens=12)
    assert len(micro_batches(batch.attention_mask_NT, 64, 12)) >= 3
    assert _close(budgeted, full, engine, batch)


def test_short_sequences_score_with_eager_attention_and_the_choice_is_restored() -> None:
    from transformers import LlamaConfig

    config, cpu = LlamaConfig(), torch.device("cpu")
    config._attn_implementation = "sdpa"
    with attention_for(config, EAGER_ATTENTION_MAX_WIDTH, cpu):
        assert config._attn_implementation == "eager"
    assert config._attn_implementation == "sdpa"
    with attention_for(config, EAGER_ATTENTION_MAX_WIDTH + 1, cpu):  # long: the T x T scores would cost memory
        assert config._attn_implementation == "sdpa"
    with attention_for(config, 8, torch.device("cuda")):  # CUDA's fused SDPA kernels win at every width
        assert config._attn_implementation == "sdpa"
    config._attn_implementation = "flash_attention_2"  # a user's explicit choice is never overridden
    with attention_for(config, 8, cpu):
        assert config._attn_implementation == "flash_attention_2"


def test_reading_decode_flags_every_few_tokens_changes_no_completion(tiny_model_dir: Path) -> None:
    """GPUs read the stop / non-finite flags every few tokens: the completions are the same as every token."""
    every, sparse = _engine(tiny_model_dir), _engine(tiny_model_dir)
    sparse.sampler.decode_sync_every = 5
    params = SamplingParams(max_new_tokens=23, seed=3)
    # a tiny random model rarely draws its EOS: stop on every 20th token id (some sequences stop, some run to
    # the limit), then on every 3rd (all stop early, so decoding ends before max_new_tokens)
    for stride, endings in ((20, {"stop", "length"}), (3, {"stop"})):
        every.stop_ids = sparse.stop_ids = list(range(0, len(every.tokenizer), stride))
        a = [c for g in every.sample(PROMPTS, 4, params) for c in g]
        b = [c for g in sparse.sample(PROMPTS, 4, params) for c in g]
        assert {c.finish_reason for c in a} == endings
        assert [(c.tokens, c.finish_reason) for c in a] == [(c.tokens, c.finish_reason) for c in b]
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x.logprobs_C, y.logprobs_C)
    assert max(len(c.tokens) for c in a) < params.max_new_tokens
    with torch.no_grad():
        for name, param in sparse.model.named_parameters():
            if "lora_B" in name:
                param.fill_(float("nan"))
    sparse.trainer.touch()  # the LoRA weights changed by hand
    with pytest.raises(ExperimentError, match="sampling produced non-finite logits"):
        sparse.sample(PROMPTS, 1, params)
