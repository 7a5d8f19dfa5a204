"""What the quant tier's tests share: a tiny random Llama whose every linear input width is a multiple of
bitsandbytes' 64-wide quantization block, and the same base with its 4-bit weights dequantized by bitsandbytes."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import make_tiny_model_dir

HIDDEN = 64  # q/k/v/o and gate/up read 64 inputs, down reads the MLP's 128


def make_quantizable_model_dir(path: Path) -> Path:
    return make_tiny_model_dir(path, hidden_size=HIDDEN)


def dequantized_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> the fp32 weight that bitsandbytes itself reconstructs from each 4-bit layer of `model`."""
    import bitsandbytes

    return {name: bitsandbytes.functional.dequantize_4bit(module.weight.data, module.weight.quant_state).float()
            for name, module in model.named_modules() if isinstance(module, bitsandbytes.nn.Linear4bit)}


def save_dequantized(model_dir: Path, out: Path) -> Path:
    """`model_dir`'s base with every layer that a 4-bit load quantizes replaced by its dequantized weights, saved
    unquantized into `out`: the same function as the 4-bit base, computed without bitsandbytes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from purplerl.engines.loading import load_causal_lm

    quantized = load_causal_lm(str(model_dir), None, "float32", "cpu", quantize="4bit")
    weights = dequantized_weights(quantized)
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, weight in weights.items():
            plain.get_submodule(name).weight.copy_(weight)
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out
