"""The `compiled` fast path (torch.compile of the policy's decoder) against the eager engine, on a tiny random Llama.

Inductor compiles in worker processes, so this file is in the process tier. Both engines start from one seed
(the same LoRA init); each step trains both on the same batch. The compiled kernels fuse and block the same fp32
sums differently, so the bounds are tests/tolerances.py's for two reduction orders of the same chain.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, SamplingParams
from tests.tolerances import gradient_atol, logprob_atol

pytestmark = pytest.mark.process

PROMPTS = [[1, 10, 20, 30, 40, 50, 60], [1, 11], [1, 12, 22, 32]]
ADVANTAGES_N = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def _engine(model_dir: Path, compiled: bool) -> LocalEngine:
    cfg = ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32")
    return LocalEngine(cfg, seed=0, settings=EngineSettings(compiled=compiled))


def test_the_compiled_decoder_scores_and_trains_as_the_eager_one(tiny_model_dir: Path) -> None:
    counters.clear()
    eager, compiled = _engine(tiny_model_dir, False), _engine(tiny_model_dir, True)
    assert compiled.trainer._decoder is not None and eager.trainer._decoder is None
    config = eager.model.config
    loss = Loss("importance_sampling", PolicyGradientParams(kl_beta=0.1))
    for step in range(2):  # the second step checks the compiled decoder reads the updated adapter
        groups = eager.sample(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=step))
        tensors = sequence_tensors([c for g in groups for c in g], 2)
        ids, attn, mask = tensors["input_ids_NT"], tensors["attention_mask_NT"], tensors["loss_mask_NT"]
        for reference in (False, True):  # the policy, and the base with the adapter off
            want = eager.logprobs(ids, attn, reference=reference, targets_NT=mask)
            got = compiled.logprobs(ids, attn, reference=reference, targets_NT=mask)
            atol = logprob_atol(torch.float32, config, ids.shape[1], float(want.abs().max()))
            assert float((got - want).abs().max()) <= atol, (step, reference)
        batch = build_train_batch(tensors, ADVANTAGES_N)
        batch = batch.__class__(**{**batch.__dict__, "ref_logprobs_NT": eager.logprobs(ids, attn, reference=True,
                                                                                       targets_NT=mask)})
        m_eager, m_compiled = eager.forward_backward(batch, loss), compiled.forward_backward(batch, loss)
        g_eager = torch.cat([p.grad.flatten() for p in eager.trainer.master])
        g_compiled = torch.cat([p.grad.flatten() for p in compiled.trainer.master])
        atol = gradient_atol(torch.float32, config, ids.shape[1], int(attn.sum()),
                             max(float(g_eager.abs().max()), float(g_compiled.abs().max())))
        assert float((g_compiled - g_eager).abs().max()) <= atol and float(g_eager.abs().max()) > 100 * atol
        assert m_compiled["loss"] == pytest.approx(m_eager["loss"], abs=atol)
        for engine in (eager, compiled):
            engine.optim_step(AdamParams(lr=5e-2))
    assert counters["stats"]["unique_graphs"] > 0  # the compiled engine ran compiled graphs, not the eager decoder
