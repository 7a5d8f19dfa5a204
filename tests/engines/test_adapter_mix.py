"""Adapters acting together on one base (the local engine's `use_adapters`, gradient routing's retain + forget):
the routed backward (`routed_backward`) in two label-homogeneous parts, each loss scaled by its share, gives the full
batch's gradient (forget: all rows; retain: the non-hack rows only, hack rows reach forget alone) and logs the full
batch's loss; one optimizer step clips both
adapters together; a scale multiplies an adapter's LoRA update, 0 being exactly the adapter absent, in scoring and
in the merged sampler; a checkpoint keeps both adapters (each its own rank) and which act."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.losses import aggregate_loss
from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.local import LocalEngine
from purplerl.errors import UserError
from purplerl.recipes.route.step import routed_backward
from purplerl.types import AdamParams, SamplingParams, TrainBatch
from tests.tolerances import decoder_reductions, gradient_atol, logprob_atol, reduction_atol

RETAIN, FORGET = "default", "forget"
BOTH = {RETAIN: 1.0, FORGET: 1.0}
LENGTHS = [7, 4, 9, 3, 6, 8]
HACKS = torch.tensor([False, True, False, False, True, False])
PROMPT = 2


def _engine(model_dir: Path, merged: bool = False) -> LocalEngine:
    engine = LocalEngine(ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=0)
    engine.settings = dataclasses.replace(engine.settings, merged_sampler=merged)
    engine.create_adapter(FORGET, rank=2)
    # fresh LoRA B is 0 (no gradient reaches A, no adapter changes an output): give every weight a value
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in engine.adapters:
            for m in engine.trainer._adapters.get(name).master:
                m.copy_(torch.randn(m.shape, generator=g) * 0.3)
    engine.trainer.touch()
    return engine


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    width = max(LENGTHS)
    attn = (torch.arange(width)[None] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(3, 300, (len(LENGTHS), width), generator=g) * attn + 2 * (1 - attn)
    mask = attn.float()
    mask[:, :PROMPT] = 0.0
    return TrainBatch(ids, attn, mask, sampling_logprobs_NT=(torch.randn(mask.shape, generator=g) - 5.0) * mask,
                      advantages_NT=torch.randn(mask.shape, generator=g) * mask)


def _grads(engine: LocalEngine, name: str) -> list[torch.Tensor | None]:
    return [None if m.grad is None else m.grad.clone() for m in engine.trainer._adapters.get(name).master]


def _clear(engine: LocalEngine) -> None:
    for name in engine.adapters:
        for m in engine.trainer._adapters.get(name).master:
            m.grad = None


def _loss(aggregation: str, scale: float = 1.0) -> Loss:
    return Loss("ppo_clip", PolicyGradientParams(), aggregation=aggregation, length_norm=8.0, scale=scale)


def _full_batch(engine: LocalEngine, batch: TrainBatch, loss: Loss, micro_batch_size: int | None = None
                ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None], dict[str, float]]:
    """(forget, retain) gradients of the whole batch with both adapters trained, in passes of at most
    `micro_batch_size` rows (default: the engine's, the whole batch in one pass), and the pass's metrics; the
    gradients are then cleared."""
    settings = engine.settings
    if micro_batch_size is not None:
        engine.settings = dataclasses.replace(settings, micro_batch_size=micro_batch_size)
    metrics = engine.forward_backward(batch, loss)
    engine.settings = settings
    grads = _grads(engine, FORGET), _grads(engine, RETAIN)
    _clear(engine)
    return *grads, metrics


def _excess(got: list[torch.Tensor | None], want: list[torch.Tensor | None], batch: TrainBatch, config) -> float:
    """The greatest |got - want| over the fp32 bound on an adapter's gradient computed along two paths
    (tests/tolerances.py: its reduction chain and the gradient's largest element): at most 1 when the two differ
    only in rounding."""
    assert len(got) == len(want) and all(g is not None and w is not None for g, w in zip(got, want, strict=True))
    bound = gradient_atol(torch.float32, config, batch.input_ids_NT.shape[1], int(batch.attention_mask_NT.sum()),
                          max(float(w.abs().max()) for w in want))
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) / bound


def _loss_atol(engine: LocalEngine, batch: TrainBatch, loss: Loss) -> float:
    """The fp32 bound on the loss of `batch` computed along two paths (tests/tolerances.py). A token's term is
    -A min(r, clip(r)) with r = exp(logp - sampling logp): an error d in logp moves it by at most |term| |d|, and
    logp itself errs by gamma_F max|logp| (F: the decoder's chain and the log-softmax, as `logprob_atol`); the
    aggregation then weighs the terms (weights >= 0) and sums them over the loss tokens and rows, after at most 8
    elementwise roundings per term (the log-ratio, its exp, the clip, the product, the divisions, the scale). So
    each path lies within gamma_(F + tokens + rows + 8) max(1, max|logp|) x (the aggregation of |term|) of the exact
    loss (Higham Lemma 3.3)."""
    config, mask_NT = engine.model.config, batch.loss_mask_NT
    logp_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=(mask_NT != 0).long())
    terms_NT, _ = loss.definition.fn(logp_NT, batch.inputs(), loss.params)
    absolute = float(aggregate_loss(terms_NT.abs(), mask_NT, loss.aggregation, total_tokens=batch.num_loss_tokens,
                                    total_sequences=batch.num_sequences, length_norm=loss.length_norm))
    chain = (decoder_reductions(config, batch.input_ids_NT.shape[1]) + config.vocab_size + batch.num_loss_tokens
             + batch.num_sequences + 8)
    return reduction_atol(torch.float32, chain, max(1.0, float(logp_NT[mask_NT != 0].abs().max())) * absolute)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_the_routed_backward_gives_the_full_batch_gradient_and_loss(tiny_model_dir: Path, aggregation: str) -> None:
    engine, batch, loss = _engine(tiny_model_dir), _batch(), _loss(aggregation)
    engine.use_adapters(BOTH)
    forget_full, retain_full, full = _full_batch(engine, batch, loss)
    # the parts sum in another order, through kernels of other shapes than the whole batch (and other CPUs pick other
    # kernels): so the bounds are derived from fp32 and the reduction length, and shown here to hold between two
    # orders of the one computation, the whole batch in one pass and row by row
    config = engine.model.config
    forget_rows, retain_rows, rows = _full_batch(engine, batch, loss, micro_batch_size=1)
    assert _excess(forget_rows, forget_full, batch, config) <= 1
    assert _excess(retain_rows, retain_full, batch, config) <= 1
    loss_atol = _loss_atol(engine, batch, loss)
    assert abs(rows["loss"] - full["loss"]) <= loss_atol
    # the retain adapter's reference: the full batch in one pass with the hack rows' loss zeroed (advantage 0 gives
    # a clipped surrogate of exactly 0), so every count the loss divides by is still the full batch's
    quiet = dataclasses.replace(batch, advantages_NT=batch.advantages_NT * (~HACKS)[:, None])
    _, retain_reference, _ = _full_batch(engine, quiet, loss)

    routed = routed_backward(engine, dataclasses.replace(batch, is_rh_N=HACKS), loss)

    assert _excess(_grads(engine, FORGET), forget_full, batch, config) <= 1
    assert _excess(_grads(engine, RETAIN), retain_reference, batch, config) <= 1
    # the hack rows did move the retain adapter in the unrouted pass, by far more than the bound: routing is what
    # kept them out, and the bound is tight enough to tell
    assert _excess(retain_full, retain_reference, batch, config) > 100
    # the logged loss is the unrouted batch's (each part's loss already carries its share), over the batch's tokens
    assert abs(routed["loss"] - full["loss"]) <= loss_atol
    assert routed["tokens"] == batch.num_loss_tokens and routed["routed_frac"] == pytest.approx(2 / 6)
    assert engine.adapter_scales == BOTH  # both adapters act again after the routed parts


def test_hack_rows_reach_only_the_forget_adapter(tiny_model_dir: Path) -> None:
    engine, batch = _engine(tiny_model_dir), _batch()
    hacks = batch.select(torch.nonzero(HACKS).squeeze(-1))
    engine.use_adapters(BOTH)
    routed_backward(engine, dataclasses.replace(hacks, is_rh_N=torch.ones(2, dtype=torch.bool)), _loss("token_mean"))
    assert all(g is None for g in _grads(engine, RETAIN))
    assert all(g is not None and float(g.abs().max()) > 0 for g in _grads(engine, FORGET))
    # and the hack rows do move the retain adapter when it trains too: the routing is what stops them
    _clear(engine)
    engine.use_adapters(BOTH)
    engine.forward_backward(hacks, _loss("token_mean"))
    assert all(g is not None and float(g.abs().max()) > 0 for g in _grads(engine, RETAIN))


def test_one_step_clips_both_adapters_together(tiny_model_dir: Path) -> None:
    engine, batch = _engine(tiny_model_dir), _batch()
    engine.use_adapters(BOTH)
    engine.forward_backward(batch, _loss("token_mean"))
    grads = [g for name in (RETAIN, FORGET) for g in _grads(engine, name)]
    joint = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
    before = {name: [m.detach().clone() for m in engine.trainer._adapters.get(name).master] for name in BOTH}
    metrics = engine.optim_step(AdamParams(lr=1e-2, max_grad_norm=joint / 10))
    assert metrics["grad_norm"] == pytest.approx(joint, rel=1e-5)
    for name in BOTH:
        after = engine.trainer._adapters.get(name).master
        assert all(not torch.equal(a, b) for a, b in zip(after, before[name], strict=True))
        assert all(m.grad is None for m in after)


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 300, (3, 8), generator=torch.Generator().manual_seed(2))
    return ids, torch.ones_like(ids)


def test_scale_zero_is_the_adapter_absent(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    ids, attn = _ids()
    engine.use_adapter(RETAIN)
    retain = engine.logprobs(ids, attn)
    engine.use_adapter(FORGET)
    forget = engine.logprobs(ids, attn)
    engine.use_adapters({RETAIN: 1.0, FORGET: 0.0})
    assert engine.adapter_scales == {RETAIN: 1.0}
    assert torch.equal(engine.logprobs(ids, attn), retain)
    engine.use_adapters({RETAIN: 0.0, FORGET: 1.0})
    assert torch.equal(engine.logprobs(ids, attn), forget)
    engine.use_adapters(BOTH)
    both = engine.logprobs(ids, attn)
    assert float((both - retain).abs().max()) > 1e-3 and float((both - forget).abs().max()) > 1e-3


def test_a_scale_multiplies_the_adapters_update(tiny_model_dir: Path) -> None:
    """On one adapted layer: output(scale s) - base output = s x (output(scale 1) - base output)."""
    from peft.tuners.lora import LoraLayer

    engine = _engine(tiny_model_dir)
    layer = next(m for m in engine.model.modules() if isinstance(m, LoraLayer) and FORGET in m.lora_A)
    x = torch.randn(5, layer.get_base_layer().in_features, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base = layer.get_base_layer()(x)
        outputs = {}
        for scale in (1.0, 0.5, -2.0):
            engine.use_adapters({RETAIN: 0.0, FORGET: scale})
            outputs[scale] = layer(x)
        # the |terms| an output at scale 1 sums: the base's and, per rank, (A x)_r (alpha/r B)_r, which cancel in
        # places to far less than their size
        engine.use_adapters({RETAIN: 0.0, FORGET: 1.0})
        a_rI, b_Or = layer.lora_A[FORGET].weight, layer.lora_B[FORGET].weight
        terms = float((base.abs() + (x @ a_rI.T).abs() @ (b_Or * layer.scaling[FORGET]).abs().T).max())
    for scale in (0.5, -2.0):
        # each side: a sum of rank + 1 terms, the scaled B, a subtraction and a product, rank + 4 roundings in fp32
        atol = reduction_atol(torch.float32, a_rI.shape[0] + 4, (1 + abs(scale)) * terms)
        torch.testing.assert_close(outputs[scale] - base, scale * (outputs[1.0] - base), rtol=0, atol=atol)


def test_the_merged_sampler_follows_the_mix(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, merged=True)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=4)
    engine.use_adapter(RETAIN)
    alone = engine.sample([[5, 6, 7]], 3, params)[0]
    engine.use_adapters({RETAIN: 1.0, FORGET: 0.0})
    assert [c.tokens for c in engine.sample([[5, 6, 7]], 3, params)[0]] == [c.tokens for c in alone]
    engine.use_adapters(BOTH)
    mixed = engine.sample([[5, 6, 7]], 3, params)[0]
    assert [c.tokens for c in mixed] != [c.tokens for c in alone]
    for c in mixed:  # the merged copy computes what the two adapters compute on the base
        ids = torch.tensor([list(c.prompt_tokens) + list(c.tokens)])
        scored = engine.logprobs(ids, torch.ones_like(ids))[0, len(c.prompt_tokens):]
        # merged weights and a KV cache against two LoRA updates over the whole sequence: two fp32 paths
        atol = logprob_atol(torch.float32, engine.model.config, ids.shape[1], float(scored.abs().max()))
        torch.testing.assert_close(scored, c.logprobs_C, rtol=0, atol=atol)


def test_a_checkpoint_keeps_both_adapters_and_the_mix(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine, batch = _engine(tiny_model_dir), _batch()
    engine.use_adapters(BOTH, [FORGET])
    engine.forward_backward(batch, _loss("token_mean"))
    engine.optim_step(AdamParams(lr=1e-2))
    ids, attn = _ids()
    want = engine.logprobs(ids, attn)
    engine.save(tmp_path)

    fresh = LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4, dtype="float32"), seed=0)
    fresh.load(tmp_path)
    assert fresh.adapters == [RETAIN, FORGET]
    assert fresh.adapter_scales == BOTH and fresh.trainer.trained_adapters == (FORGET,)
    assert {m.shape[0] for m in fresh.trainer._adapters.get(FORGET).master if m.ndim == 2} >= {2}  # A is [2, in]
    assert torch.equal(fresh.logprobs(ids, attn), want)


def test_mixing_refuses_what_it_cannot_do(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    with pytest.raises(UserError, match="nonzero scale"):
        engine.use_adapters({RETAIN: 0.0, FORGET: 0.0})
    with pytest.raises(UserError, match="'default' is trained but does not act"):
        engine.use_adapters({RETAIN: 0.0, FORGET: 1.0}, [RETAIN])
    with pytest.raises(UserError, match="no adapter named 'critic'"):
        engine.use_adapters({"critic": 1.0})
    with pytest.raises(UserError, match="fixes its rank"):
        engine.create_adapter("other", init=str(tiny_model_dir), rank=2)
