"""The GRPO benchmark's FLOPs convention (bench/grpo_flops.py) on a tiny made-up model, worked by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

_SPEC = importlib.util.spec_from_file_location("grpo_flops", Path(__file__).parents[1] / "bench" / "grpo_flops.py")
flops = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = flops  # dataclasses look their module up there
_SPEC.loader.exec_module(flops)

# L=2, h=8, I=16, 2 query heads and 1 KV head of width 4 (A = 8, kv width 4), V=10
TINY = SimpleNamespace(num_hidden_layers=2, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=4, vocab_size=10)


@pytest.fixture
def shape():
    return flops.ModelShape.from_hf_config(TINY)


def test_matmul_params(shape):
    # per layer: q 8·8 + k 8·4 + v 8·4 + o 8·8 + gate 8·16 + up 8·16 + down 16·8 = 64+32+32+64+128+128+128 = 576
    # N = 2·576 + lm_head 10·8 = 1152 + 80
    assert flops.matmul_params(shape) == 1232


def test_lora_params(shape):
    # r=2, r·(in+out): q 2·16 + k 2·12 + v 2·12 + o 2·16 + gate 2·24 + up 2·24 + down 2·24 = 256 per layer
    assert flops.lora_params(shape, rank=2) == 512


def test_forward_flops(shape):
    # 3 tokens · (2·1232 + 4·L2·A8·context5) = 3 · (2464 + 320)
    assert flops.forward_flops(shape, tokens=3, context=5) == 8352


def test_sampling_flops(shape):
    # P=3, C=2. prefill: 3·2464 + 64·3·3 = 7392 + 576; decode: 2·2464 + 64·(4 + 5) = 4928 + 576
    assert flops.sampling_flops(shape, [(3, 2)]) == 7968 + 5504


def test_reference_and_training_flops(shape):
    # T=5: forward 5·2464 + 64·5·5 = 12320 + 1600; training 2·13920 + 4·512·5
    assert flops.reference_flops(shape, [(3, 2)]) == 13920
    assert flops.training_flops(shape, [(3, 2)], rank=2) == 27840 + 10240
    assert flops.training_flops(shape, [(3, 2), (3, 2)], rank=2) == 2 * (27840 + 10240)


def test_defaults_and_missing_fields():
    no_gqa = SimpleNamespace(num_hidden_layers=1, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                             vocab_size=10)
    shape = flops.ModelShape.from_hf_config(no_gqa)
    assert (shape.kv_heads, shape.head_dim) == (2, 4)
    with pytest.raises(ValueError, match="intermediate_size"):
        flops.ModelShape.from_hf_config(SimpleNamespace(num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
                                                        vocab_size=10))


def test_full_finetuning_flops_are_three_forwards(shape):
    # forward + backward to the inputs + weight gradients: 3 · 13920 for the (3, 2) sequence
    assert flops.training_flops(shape, [(3, 2)], rank=None) == 41760


def test_decode_weight_and_kv_cache_bytes(shape):
    # bf16: 2 · N = 2 · 1232; with the r=2 LoRA 2 · (1232 + 512)
    assert flops.decode_weight_bytes(shape, dtype_bytes=2) == 2464
    assert flops.decode_weight_bytes(shape, dtype_bytes=2, rank=2) == 3488
    # per cached position L2 · (K, V) · kv1 · hd4 · 2 bytes = 32; (P=3, C=2) decodes tokens that read 4 and 5
    assert flops.kv_cache_bytes(shape, [(3, 2)], dtype_bytes=2) == 32 * 9
    assert flops.kv_cache_bytes(shape, [(3, 2), (1, 1)], dtype_bytes=2) == 32 * (9 + 2)
