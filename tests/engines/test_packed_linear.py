"""The sampler's prepacked bf16 linear layers (engines/packed_linear.py): when a decode runs them, the cache of this
machine's measurement, and that they compute the plain layers' values, before and after the weights change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import purplerl.engines.packed_linear as packed_linear
from purplerl.algorithms.registry import Loss
from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.engines.packed_linear import PackedLinears, PackTiming, machine_timing, packing_available, use_packed
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, SamplingParams
from tests.tolerances import reduction_atol, rounding_atol

PROMPTS = [[1, 10, 20, 30, 40, 50, 60], [1, 11], [1, 12, 22, 32]]
needs_kernels = pytest.mark.skipif(not packing_available(torch.device("cpu")),
                                   reason="this torch has no oneDNN bf16 linear kernels on this CPU")


def test_a_decode_runs_packed_only_where_it_pays_for_its_repack() -> None:
    faster = PackTiming(plain_s=0.030, packed_s=0.020, pack_s=0.1)  # saves 10 ms per token, a repack costs 100
    assert faster.pays
    assert use_packed(faster, packed_now=True, new_tokens=1)  # packed already: every token gains
    assert use_packed(faster, packed_now=False, new_tokens=11)  # 110 ms saved > 100 ms of packing
    assert not use_packed(faster, packed_now=False, new_tokens=10)  # 100 ms saved: no gain
    barely = PackTiming(plain_s=0.030, packed_s=0.0275, pack_s=0.0)  # 8% faster: inside the margin, never chosen
    assert not barely.pays and not use_packed(barely, packed_now=True, new_tokens=1000)


def _linears() -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16), torch.nn.Linear(96, 64, bias=False).to(
        torch.bfloat16)]


def test_the_measurement_is_cached_per_machine_and_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path))
    measured = []

    def fake_measure(linears, rows):
        measured.append(rows)
        return PackTiming(plain_s=0.01 * rows, packed_s=0.005, pack_s=0.02)

    monkeypatch.setattr(packed_linear, "measure", fake_measure)
    linears = _linears()
    assert machine_timing(linears, 32) == PackTiming(0.32, 0.005, 0.02)
    assert machine_timing(linears, 32) == PackTiming(0.32, 0.005, 0.02) and measured == [32]  # read back
    assert machine_timing(linears, 8).plain_s == pytest.approx(0.08) and measured == [32, 8]  # other rows
    assert machine_timing(linears[:1], 32) and measured == [32, 8, 32]  # other shapes
    entries = json.loads((tmp_path / "machine" / "packed-linear.json").read_text())
    assert len(entries) == 3 and {e["rows"] for e in entries.values()} == {8, 32}
    (tmp_path / "machine" / "packed-linear.json").write_text("{not json")  # damaged: measured again, rewritten
    assert machine_timing(linears, 32).plain_s == pytest.approx(0.32) and measured == [32, 8, 32, 32]
    assert len(json.loads((tmp_path / "machine" / "packed-linear.json").read_text())) == 1


@needs_kernels
@pytest.mark.parametrize("rows", [1, 8, 32, 128])
def test_a_packed_layer_computes_the_plain_product(rows: int) -> None:
    linears = _linears()
    packed = PackedLinears(torch.nn.Sequential(*linears))
    packed.timings[rows] = PackTiming(plain_s=1.0, packed_s=0.1, pack_s=0.0)
    assert packed.prepare(rows, new_tokens=1) and packed.packed
    x = torch.randn(rows, 1, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        for layer in linears:
            want = F.linear(x, layer.weight)
            got = layer(x)
            assert got.dtype == torch.bfloat16 and got.shape == want.shape
            magnitude = float((x.double().abs() @ layer.weight.double().abs().t()).max())
            # two blockings of one dot product accumulated in fp32, each output rounded to bf16 once
            atol = reduction_atol(torch.float32, layer.in_features, magnitude) + \
                2 * rounding_atol(torch.bfloat16, 1, float(want.float().abs().max()))
            assert torch.allclose(got.float(), want.float(), rtol=0, atol=atol)
            x = got
    # a prefill's rows run the plain product; and under autograd (never the sampler's) too
    wide = torch.randn(129, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(linears[0](wide), F.linear(wide, linears[0].weight))
    packed.invalidate()
    assert not packed.packed and all("_purplerl_packed" not in m.__dict__ for m in linears)


def _bf16_engine(model_dir: Path, packed: bool) -> LocalEngine:
    cfg = ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="bfloat16")
    return LocalEngine(cfg, seed=0, settings=EngineSettings(packed_decode=packed))


def _packed_atol(logits: torch.Tensor, layers: int) -> float:
    """How far the packed copy's logits may lie from the plain one's: each of the 7 linear layers of a decoder layer,
    and the LM head, may round its bf16 output the other way on each path (their fp32 sums run in another order),
    each moving the logits by a bf16 rounding of their size (tests/engines/test_engine_contract.py bounds the sampler
    against the scorer the same way)."""
    return 2 * rounding_atol(torch.bfloat16, 7 * layers + 1, float(logits.abs().max()))


def _sampler_logits(engine: LocalEngine) -> torch.Tensor:
    """The logits of the sampler's copy over PROMPTS[0] (7 rows: a packed size), after a decode brought it up to the
    trainer's weights and packed it where the engine decides so."""
    engine.sample(PROMPTS, 4, SamplingParams(max_new_tokens=2, seed=5))
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        return engine.sampler.merged(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()


@needs_kernels
def test_the_packed_sampler_follows_the_plain_one_across_a_weight_change(tiny_model_dir: Path) -> None:
    plain, fast = _bf16_engine(tiny_model_dir, packed=False), _bf16_engine(tiny_model_dir, packed=True)
    assert plain.sampler.packed is None and fast.sampler.packed is not None
    rows = len(PROMPTS) * 4
    fast.sampler.packed.timings[rows] = PackTiming(plain_s=1.0, packed_s=0.1, pack_s=0.0)  # this test decides
    layers = plain.model.config.num_hidden_layers
    before = _sampler_logits(plain)
    assert torch.allclose(_sampler_logits(fast), before, rtol=0, atol=_packed_atol(before, layers))
    assert fast.sampler.packed.packed  # it ran over the packs
    comps = [c for group in plain.sample(PROMPTS, 2, SamplingParams(max_new_tokens=6, seed=3)) for c in group]
    batch = build_train_batch(sequence_tensors(comps, plain.tokenizer.pad_token_id),
                              torch.linspace(-1.0, 1.0, len(comps)))
    for engine in (plain, fast):  # identical training steps on a fixed batch change the sampler's weights
        for _ in range(2):
            engine.forward_backward(batch, Loss("importance_sampling"))
            engine.optim_step(AdamParams(lr=5e-2))
    after, got = _sampler_logits(plain), _sampler_logits(fast)
    assert fast.sampler.packed.packed
    assert torch.allclose(got, after, rtol=0, atol=_packed_atol(after, layers))
    # repacked: the packed copy follows the new weights, not the old packs (which would sit where `before` is)
    moved = float((after - before).abs().max())
    assert moved > 0 and float((got - after).abs().max()) < 0.05 * moved
