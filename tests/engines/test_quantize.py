"""`model.quantize 4bit` (the base loaded in 4 bits through bitsandbytes: QLoRA) and `training.optimizer
adamw_8bit` (8-bit AdamW through bitsandbytes): refused in one line, before any model loads, where they cannot run:
without bitsandbytes, on an engine that loads its own base or steps its own optimizer, and (4 bits) with full
fine-tuning. The quick tier has no bitsandbytes: `find_spec` is patched so these hold wherever it runs. What they do
with bitsandbytes is tests/quant (`make test-quant`); the CUDA load is the gpu-marked test at the end."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import check_optimizer, check_quantize, make_engine
from purplerl.engines.base import EngineSettings
from purplerl.engines.loading import qlora_config, quantize_problem, require_quantizable
from purplerl.errors import UserError
from tests.test_cli import cli_env

NO_BNB = ("model.quantize 4bit needs bitsandbytes, which is not installed here: pip install bitsandbytes "
          "(`make test-quant` builds such a venv, .venv-quant)")
NO_BNB_OPTIMIZER = ("training.optimizer adamw_8bit needs bitsandbytes, which is not installed here: pip install "
                    "bitsandbytes (`make test-quant` builds such a venv, .venv-quant)")
FULL_REFUSAL = "quantize is read only when model.finetune is lora"


@pytest.fixture
def no_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "bitsandbytes" else real(name, *args))


def test_qlora_config_is_nf4_double_quantized_computing_in_the_model_dtype() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        settings = qlora_config(dtype)
        assert (settings.load_in_4bit, settings.load_in_8bit) == (True, False)
        assert settings.bnb_4bit_quant_type == "nf4"
        assert settings.bnb_4bit_use_double_quant is True
        assert settings.bnb_4bit_compute_dtype == dtype


def test_a_4bit_base_needs_only_bitsandbytes() -> None:
    assert quantize_problem("none", has_bitsandbytes=False) is None
    assert quantize_problem("4bit", has_bitsandbytes=False) == NO_BNB
    assert quantize_problem("4bit", has_bitsandbytes=True) is None
    for device in ("cpu", "cuda"):  # CPU too, since bitsandbytes 0.50
        assert ModelConfig(device=device, quantize="4bit").quantize == "4bit"


def test_without_bitsandbytes_both_are_refused_before_any_model_loads(no_bitsandbytes: None, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")  # loading it would fail: the refusal must come first
    with pytest.raises(UserError) as refused:
        make_engine(ModelConfig(name=missing, device="cpu", quantize="4bit"))
    assert str(refused.value) == NO_BNB
    with pytest.raises(UserError) as refused:
        make_engine(ModelConfig(name=missing, device="cpu"), settings=EngineSettings(optimizer="adamw_8bit"))
    assert str(refused.value) == NO_BNB_OPTIMIZER
    require_quantizable("none")  # nothing asked, nothing refused
    check_optimizer("adamw", EngineConfig(kind="local"))


def test_other_engines_and_full_finetuning_refuse_them() -> None:
    model = ModelConfig(name="unused", quantize="4bit")
    for kind in ("vllm", "tinker"):
        with pytest.raises(UserError, match=rf"^model.quantize 4bit is for engine.kind local: engine '{kind}' loads"):
            check_quantize(model, EngineConfig(kind=kind))
    with pytest.raises(UserError) as refused:
        check_optimizer("adamw_8bit", EngineConfig(kind="tinker"))
    assert str(refused.value) == ("training.optimizer adamw_8bit runs in this process: a Tinker service steps its "
                                  "own AdamW (use --training.optimizer adamw)")
    with pytest.raises(ValidationError, match=FULL_REFUSAL):
        ModelConfig(finetune="full", quantize="4bit")
    with pytest.raises(ValidationError, match="quantize"):
        ModelConfig(quantize="8bit")
    assert ModelConfig().quantize == "none" and "quantize" not in ModelConfig(finetune="full").settings()


@pytest.mark.process
def test_the_cli_refuses_them_in_one_line(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    base = [sys.executable, "-m", "purplerl.cli", "attack", "--model", tmp_path / "no-such-model", "--steps", "1",
            "--output_dir", runs]
    cases = [(["--model.finetune", "full", "--model.quantize", "4bit"],
              f"error: config field 'model': {FULL_REFUSAL}: leave it out (got '4bit')"),
             (["--training.optimizer", "adamw_9bit"], "training.optimizer")]
    for args, says in cases:
        proc = subprocess.run([*base, *args], env=cli_env(tmp_path), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.strip().startswith(says) or says in proc.stderr, proc.stderr
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
