"""Every registered preference loss through LocalEngine.forward_backward: its linearized backward (micro-batch by
micro-batch) gives the gradient of plain autograd through one forward pass of the whole batch, and the same loss
and metrics; the batch inputs it reads (pairs, KTO labels) reach it past the per-token micro-batching."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.pairwise import DPOParams, KTOParams, ORPOParams, SimPOParams
from purplerl.algorithms.registry import Loss, get_loss_def
from purplerl.types import AdamParams, TrainBatch
from tests.engines.test_registered_losses import (
    PAIRS_P2,
    _autograd_logprobs,
    _close,
    _engine,
    _take_grads,
    _tensors,
    _trained,
)

# six rows (three prompts x two completions); KTO: desirable, undesirable and KL rows (for the gradient it does not
# matter that these KL rows are not mismatched pairs; a real batch pairs each prompt with another's completion)
KTO_LABELS_N = torch.tensor([1, 0, -1, 0, 1, -1])
CASES = {
    "dpo sigmoid": Loss("dpo", DPOParams(beta=0.5), temperature=0.7),
    "dpo cdpo": Loss("dpo", DPOParams(beta=0.5, label_smoothing=0.2)),
    "dpo hinge": Loss("dpo", DPOParams(beta=0.1, loss_type="hinge")),
    "dpo ipo": Loss("dpo", DPOParams(beta=0.5, loss_type="ipo")),
    "simpo": Loss("simpo", SimPOParams(beta=2.0, gamma=0.5, label_smoothing=0.1)),
    "kto": Loss("kto", KTOParams(beta=0.5, desirable_weight=1.5)),
    "orpo": Loss("orpo", ORPOParams(beta=0.3), temperature=0.7),
}


def _batch(engine, tensors: dict[str, torch.Tensor], loss: Loss) -> TrainBatch:
    mask = tensors["loss_mask_NT"]
    ref = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], reference=True,
                          temperature=loss.temperature, targets_NT=mask)
    reads = loss.definition.inputs
    return TrainBatch(tensors["input_ids_NT"], tensors["attention_mask_NT"], mask,
                      ref_logprobs_NT=ref if "ref_logprobs_NT" in reads else None,
                      pairs_P2=PAIRS_P2 if "pairs_P2" in reads else None,
                      kto_labels_N=KTO_LABELS_N if "kto_labels_N" in reads else None)


@pytest.mark.parametrize("case", list(CASES))
def test_preference_loss_gradient_equals_autograd_through_one_forward(tiny_model_dir: Path, case: str) -> None:
    loss = CASES[case]
    engine = _trained(tiny_model_dir)
    engine.settings = dataclasses.replace(engine.settings, micro_batch_size=2)  # three micro-batches
    batch = _batch(engine, _tensors(engine, seed=2), loss)
    metrics = engine.forward_backward(batch, loss)
    linearized = _take_grads(engine)

    value, expected = get_loss_def(loss.name).fn(_autograd_logprobs(engine, batch, loss.temperature),
                                                 batch.inputs(), loss.params)
    value.backward()
    direct = _take_grads(engine)
    assert _close(linearized, direct, engine, batch), case
    assert metrics["loss"] == pytest.approx(float(value.detach()), abs=1e-5)
    for key in ("rewards/margins", "rewards/chosen", "kl", "nll_loss"):
        if key in expected:
            assert metrics[key] == pytest.approx(expected[key], abs=1e-4), key
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", ["simpo", "kto", "orpo"])
def test_training_moves_the_preferred_answers_up(tiny_model_dir: Path, name: str) -> None:
    loss = CASES[name]
    engine = _engine(tiny_model_dir)
    batch = _batch(engine, _tensors(engine, seed=3), loss)
    first = engine.forward_backward(batch, loss)
    engine.optim_step(AdamParams(lr=5e-2))
    for _ in range(4):
        metrics = engine.forward_backward(batch, loss)
        engine.optim_step(AdamParams(lr=5e-2))
    assert metrics["loss"] < first["loss"] - 0.01
    assert metrics["rewards/margins"] > first["rewards/margins"]
