"""`model.quantize 4bit`: the base loaded in 4 bits through bitsandbytes (QLoRA) by the local engine on CUDA, and
refused in one line everywhere else before any model loads (listed and read only with --device cuda).

This machine has neither CUDA nor bitsandbytes: the refusals run here for real; the CUDA load is the gpu-marked test
at the end, skipped here (never run where it was written)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import check_quantize, make_engine
from purplerl.engines.loading import qlora_config, quantize_problem, require_quantizable
from purplerl.errors import UserError
from tests.test_cli import cli_env

CPU_REFUSAL = ("model.quantize 4bit loads the base through bitsandbytes, on CUDA only: the model's device is cpu "
               "(use --model.quantize none)")
NO_BNB = "model.quantize 4bit needs bitsandbytes, which is not installed (pip install bitsandbytes)"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")


def test_qlora_config_is_nf4_double_quantized_with_bf16_compute() -> None:
    settings = qlora_config()
    assert (settings.load_in_4bit, settings.load_in_8bit) == (True, False)
    assert settings.bnb_4bit_quant_type == "nf4"
    assert settings.bnb_4bit_use_double_quant is True
    assert settings.bnb_4bit_compute_dtype == torch.bfloat16


def test_which_machines_can_load_a_4bit_base() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert quantize_problem("none", cpu, has_bitsandbytes=False) is None
    assert quantize_problem("4bit", cpu, has_bitsandbytes=True) == CPU_REFUSAL
    assert quantize_problem("4bit", cuda, has_bitsandbytes=False) == NO_BNB
    assert quantize_problem("4bit", torch.device("cuda", 1), has_bitsandbytes=True) is None


@no_cuda
def test_this_machine_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")  # loading it would fail: the refusal must come first
    for device in ("cpu", "auto"):  # the setting is read only with the device named cuda
        with pytest.raises(ValidationError, match="quantize is read only when model.finetune is lora and "
                                                  "model.device is cuda"):
            ModelConfig(name=missing, device=device, quantize="4bit")
    with pytest.raises(UserError, match=r"^device 'cuda' requested but no CUDA device is available"):
        make_engine(ModelConfig(name=missing, device="cuda", quantize="4bit"))
    require_quantizable("none", "cpu")  # nothing asked, nothing refused


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_a_machine_without_bitsandbytes_is_refused() -> None:
    # without CUDA the device refusal comes first, so the missing package is checked through the same rule
    assert quantize_problem("4bit", torch.device("cuda"), importlib.util.find_spec("bitsandbytes") is not None) \
        == NO_BNB


def test_other_engines_and_full_finetuning_refuse_it() -> None:
    model = ModelConfig(name="unused", device="cuda", quantize="4bit")
    for kind in ("vllm", "tinker"):
        with pytest.raises(UserError, match=rf"^model.quantize 4bit is for engine.kind local: engine '{kind}' loads"):
            check_quantize(model, EngineConfig(kind=kind))
    with pytest.raises(ValidationError, match="quantize is read only when model.finetune is lora"):
        ModelConfig(finetune="full", device="cuda", quantize="4bit")
    with pytest.raises(ValidationError, match="quantize"):
        ModelConfig(device="cuda", quantize="8bit")
    assert ModelConfig().quantize == "none" and "quantize" not in ModelConfig(finetune="full").settings()


@pytest.mark.process
@no_cuda
def test_the_cli_refuses_it_in_one_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "purplerl.cli", "attack", "--model", tmp_path / "no-such-model",
                           "--model.quantize", "4bit", "--device", "cpu", "--steps", "1", "--output_dir", runs],
                          env=cli_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: config field 'model': quantize is read only when model.finetune is lora and model.device is cuda: "
        "leave it out (got '4bit')"), proc.stderr
    assert not runs.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None,
                    reason="needs CUDA and bitsandbytes")
def test_a_4bit_base_trains_its_lora_on_cuda(tiny_model_dir: Path) -> None:
    from purplerl.algorithms.registry import Loss, PolicyGradientParams
    from purplerl.train.batch import build_train_batch, sequence_tensors
    from purplerl.types import AdamParams, SamplingParams

    engine = make_engine(ModelConfig(name=str(tiny_model_dir), device="cuda", quantize="4bit", lora_rank=4))
    quantized = [m for m in engine.trainer.causal_lm.modules() if type(m).__name__ == "Linear4bit"]
    assert quantized, "no linear layer of the base is in 4 bits"
    groups = engine.sample([[1, 10, 20], [1, 11]], 2, SamplingParams(max_new_tokens=6, seed=0))
    tensors = sequence_tensors([c for g in groups for c in g], 2)
    metrics = engine.forward_backward(build_train_batch(tensors, torch.tensor([1.0, -1.0, 0.5, -0.5])),
                                      Loss("ppo_clip", PolicyGradientParams()))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert engine.optim_step(AdamParams(lr=5e-2))["grad_norm"] > 0
