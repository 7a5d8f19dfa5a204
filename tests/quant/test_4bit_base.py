"""A 4-bit base (`--model.quantize 4bit`) on CPU through bitsandbytes: the same function as the base whose weights
bitsandbytes dequantizes, loaded unquantized; gradients through it stay right after a forward without gradients
(bitsandbytes 0.50 would repack its weights for a kernel with no backward); a base bitsandbytes' CPU dequantization
mis-scales is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines import make_engine
from purplerl.errors import UserError
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import SamplingParams
from tests.quant.helpers import dequantized_weights, make_quantizable_model_dir, save_dequantized
from tests.tolerances import gradient_atol, logprob_atol

bitsandbytes = pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.quant


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = make_quantizable_model_dir(tmp_path_factory.mktemp("base"))
    return base, save_dequantized(base, tmp_path_factory.mktemp("dequantized"))


def _engine(path: Path, quantize: str = "none"):
    # float32 compute on both sides: the two then differ only in the order of their reductions (tests/tolerances.py)
    return make_engine(ModelConfig(name=str(path), device="cpu", dtype="float32", quantize=quantize, lora_rank=4),
                       seed=3)


def _batch(engine, tokens: int = 8):
    groups = engine.sample([[1, 10, 20, 30], [1, 11, 12]], 2, SamplingParams(max_new_tokens=tokens, seed=0))
    return sequence_tensors([c for g in groups for c in g], engine.tokenizer.pad_token_id)


def test_the_4bit_base_is_its_dequantized_weights(dirs: tuple[Path, Path]) -> None:
    base, dequantized = dirs
    quantized, plain, original = _engine(base, "4bit"), _engine(dequantized), _engine(base)
    layers = [m for m in quantized.trainer.causal_lm.modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]
    assert len(layers) == 14  # 7 projections in each of the 2 layers; the LM head stays unquantized
    tensors = _batch(plain)
    ids, mask = tensors["input_ids_NT"], tensors["attention_mask_NT"]
    for reference in (False, True):  # the policy (LoRA B = 0) and the base with the adapter off
        got = quantized.logprobs(ids, mask, reference=reference)
        want = plain.logprobs(ids, mask, reference=reference)
        bound = logprob_atol(torch.float32, plain.trainer.causal_lm.config, ids.shape[1], want.abs().max().item())
        assert (got - want).abs().max().item() <= bound
        # and the 4 bits are real: the unquantized original is outside that bound (the worst case of rounding)
        assert (original.logprobs(ids, mask, reference=reference) - want).abs().max().item() > 5 * bound


def _lora_grads(engine, tensors) -> dict[str, torch.Tensor]:
    advantages = torch.linspace(-1.0, 1.0, tensors["input_ids_NT"].shape[0])
    engine.forward_backward(build_train_batch(tensors, advantages), Loss("ppo_clip", PolicyGradientParams()))
    return {n: p.grad.clone() for n, p in engine.trainer.model.named_parameters() if p.grad is not None}


def test_gradients_through_the_4bit_base_survive_a_forward_without_them(dirs: tuple[Path, Path]) -> None:
    base, dequantized = dirs
    quantized, plain = _engine(base, "4bit"), _engine(dequantized)
    tensors = _batch(plain)  # sampling from the 4-bit engine below is the no-grad forward that used to repack
    _batch(quantized)
    quantized.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], reference=True)
    for module in quantized.trainer.causal_lm.modules():
        if isinstance(module, bitsandbytes.nn.Linear4bit):
            assert not getattr(module.weight.quant_state, "packing_format_for_cpu", False), "a layer was repacked"
    got, want = _lora_grads(quantized, tensors), _lora_grads(plain, tensors)
    assert got.keys() == want.keys() and len(got) == 28  # LoRA A and B of the 14 layers
    largest = max(g.abs().max().item() for g in want.values())
    # the lowest layer's B gradients arrive through every 4-bit layer above it: a repacked layer stops them
    assert want["base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"].abs().max() > 0
    config, (n, t) = plain.trainer.causal_lm.config, tensors["input_ids_NT"].shape
    bound = gradient_atol(torch.float32, config, t, n * t, largest)
    for name, grad in want.items():
        assert (got[name] - grad).abs().max().item() <= bound, name


def test_a_base_with_a_width_that_is_not_a_multiple_of_64_is_refused_on_cpu(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError) as refused:
        make_engine(ModelConfig(name=str(tiny_model_dir), device="cpu", quantize="4bit"))
    assert str(refused.value) == (
        f"model.quantize 4bit on CPU: layer model.layers.0.self_attn.q_proj of '{tiny_model_dir}' reads 32 inputs, "
        f"not a multiple of 64, which bitsandbytes' CPU dequantization mis-scales (use --model.quantize none)")


def test_bitsandbytes_cpu_dequantization_mis_scales_a_width_of_32() -> None:
    """The fault the refusal above guards, shown on bitsandbytes itself: an NF4 round trip errs by at most half the
    largest gap of the NF4 code (from -1 to -0.6962, Dettmers et al. 2023, Appendix E) times the block's absmax when the
    width is a multiple of the block; at width 32 it errs by several times more."""
    torch.manual_seed(0)
    half_gap = (1.0 - 0.6961928009986877) / 2
    errors = {}
    for width in (32, 64):
        weight = torch.randn(64, width)
        packed, state = bitsandbytes.functional.quantize_4bit(weight, quant_type="nf4")
        back = bitsandbytes.functional.dequantize_4bit(packed, state)
        errors[width] = ((back - weight).reshape(-1, 64).abs().amax(1) / weight.reshape(-1, 64).abs().amax(1)).max()
    assert errors[64] <= half_gap * 1.01  # the absmax itself is stored in fp32: within a hair of exact
    assert errors[32] > 2 * half_gap, errors


def test_dequantized_weights_are_what_the_loader_quantized(dirs: tuple[Path, Path]) -> None:
    from purplerl.engines.loading import load_causal_lm

    weights = dequantized_weights(load_causal_lm(str(dirs[0]), None, "float32", "cpu", quantize="4bit"))
    assert len(weights) == 14 and all(w.dtype == torch.float32 for w in weights.values())
