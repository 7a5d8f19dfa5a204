"""`training.optimizer adamw_8bit` (bitsandbytes' AdamW8bit: both moments in 8 bits, blockwise quantized; Dettmers
et al. 2022) follows fp32 AdamW's trajectory over 20 steps, for LoRA and for full fine-tuning, and its state survives
the engine's save and load bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines import make_engine
from purplerl.engines.base import EngineSettings
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, SamplingParams
from tests.quant.helpers import make_quantizable_model_dir

bitsandbytes = pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.quant

STEPS, LR = 20, 2e-3
# The bound: each 8-bit moment is within ~1% of its block's largest |value| (the dynamic code's widest step near 1 is
# 1/64 of the block maximum, half of it as rounding error), and an update m/sqrt(v) carries both errors, ~1.5% at
# most per step and per element: over 20 steps the displacement from the start may differ from fp32's by the same
# fraction of it when the errors pile up in one direction. 5% leaves room for the steps where the two runs' gradients
# have parted (measured on a 2-core Xeon with AMX: 1.8% for LoRA, 3.2% for full fine-tuning).
RELATIVE_DISPLACEMENT = 0.05
FINETUNES = {"lora": {"finetune": "lora", "lora_rank": 64}, "full": {"finetune": "full"}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_quantizable_model_dir(tmp_path_factory.mktemp("model"))


def _engine(model_dir: Path, finetune: str, optimizer: str):
    cfg = ModelConfig(name=str(model_dir), device="cpu", dtype="float32", **FINETUNES[finetune])
    return make_engine(cfg, seed=5, settings=EngineSettings(optimizer=optimizer))


def _batch(engine):
    groups = engine.sample([[1, 10, 20, 30], [1, 11, 12]], 2, SamplingParams(max_new_tokens=8, seed=0))
    tensors = sequence_tensors([c for g in groups for c in g], engine.tokenizer.pad_token_id)
    return build_train_batch(tensors, torch.tensor([1.0, -1.0, 0.5, -0.5]))


def _step(engine, batch) -> float:
    loss = engine.forward_backward(batch, Loss("importance_sampling", PolicyGradientParams()))["loss"]
    engine.optim_step(AdamParams(lr=LR, max_grad_norm=0.0))
    return loss


def _weights(engine) -> torch.Tensor:
    return torch.cat([m.detach().reshape(-1).float() for m in engine.trainer.master])


def _eight_bit_share(optimizer: torch.optim.Optimizer) -> float:
    states = [s for s in optimizer.state.values() if "state1" in s]
    return sum(s["state1"].dtype == torch.uint8 for s in states) / len(states)


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_8bit_adamw_follows_fp32_adamw(model_dir: Path, finetune: str) -> None:
    runs, batch = {}, None
    for optimizer in ("adamw", "adamw_8bit"):
        engine = _engine(model_dir, finetune, optimizer)
        batch = batch or _batch(engine)  # the fp32 run's completions train both
        start = _weights(engine)
        losses = [_step(engine, batch) for _ in range(STEPS)]
        runs[optimizer] = (_weights(engine) - start, losses, engine)
    (moved, losses, _), (moved_8bit, losses_8bit, engine_8bit) = runs["adamw"], runs["adamw_8bit"]
    assert _eight_bit_share(engine_8bit.trainer.optimizer) >= 0.5  # most moments really are in 8 bits
    assert losses[-1] < losses[0] - 0.1  # both runs learn
    relative = ((moved_8bit - moved).norm() / moved.norm()).item()
    assert relative <= RELATIVE_DISPLACEMENT, relative
    spread = max(abs(a - b) for a, b in zip(losses, losses_8bit, strict=True))
    assert spread <= RELATIVE_DISPLACEMENT * (losses[0] - losses[-1]), (losses, losses_8bit)


def _same(a: object, b: object) -> bool:
    """Bit for bit: tensors of one dtype and equal elements, containers of such, equal plain values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_8bit_state_survives_save_and_load_bit_exactly(model_dir: Path, finetune: str, tmp_path: Path) -> None:
    first = _engine(model_dir, finetune, "adamw_8bit")
    batch = _batch(first)
    for _ in range(3):
        _step(first, batch)
    first.save(tmp_path)
    second = _engine(model_dir, finetune, "adamw_8bit")
    second.load(tmp_path)
    saved, loaded = first.trainer.optimizer.state_dict(), second.trainer.optimizer.state_dict()
    assert saved["state"].keys() == loaded["state"].keys()
    for key, state in saved["state"].items():
        assert state.keys() == loaded["state"][key].keys()
        for name, value in state.items():
            assert _same(value, loaded["state"][key][name]), (key, name)
    assert torch.equal(_weights(first), _weights(second))
    _step(first, batch), _step(second, batch)  # and the next step is the same step
    assert torch.equal(_weights(first), _weights(second))
