"""The embedded SmolLM2 at scale (make test-slow): a 64 x 256-token training batch within 8 GiB of RSS, and
bf16 numerics within tolerance of fp32 on the real model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from purplerl.engines.loading import cpu_has_fast_bf16

pytestmark = pytest.mark.slow

# One reference pass plus one forward_backward + optim_step on 64 sequences of 256 tokens (64 prompt +
# 192 completion), micro-batches of at most argv[2] tokens; prints the peak RSS of the process.
BIG_BATCH = """
import json, resource, sys, torch
from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.train.batch import build_train_batch
from purplerl.types import AdamParams
engine = LocalEngine(ModelConfig(device="cpu", dtype=sys.argv[1]), seed=0,
                     settings=EngineSettings(micro_batch_tokens=int(sys.argv[2])))
N, P, T = 64, 64, 256
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, 40000, (N, T), generator=g)
attn = torch.ones((N, T), dtype=torch.long)
mask = torch.zeros((N, T)); mask[:, P:] = 1
tensors = {"input_ids_NT": ids, "attention_mask_NT": attn, "loss_mask_NT": mask,
           "sampling_logprobs_NT": torch.zeros((N, T))}
ref = engine.logprobs(ids, attn, reference=True, targets_NT=mask)
batch = build_train_batch(tensors, torch.randn(N, generator=g))
batch = batch.__class__(**{**batch.__dict__, "ref_logprobs_NT": ref})
loss = Loss("ppo_clip", PolicyGradientParams(kl_beta=0.1, old_logprobs="current"))
out = engine.forward_backward(batch, loss)
step = engine.optim_step(AdamParams(lr=1e-4))
print(json.dumps({"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "loss": out["loss"], "tokens": out["tokens"], "grad_norm": step["grad_norm"]}))
"""


# bf16 at the default budget (4096 tokens = 16 sequences per pass), the README's claim, where the CPU computes bf16
# natively (AMX/AVX512-BF16: `model.dtype auto` picks it there). Elsewhere bf16 matmuls are emulated at ~1 GFLOP/s
# (the step takes over 15 minutes) and `auto` picks fp32, whose activations are twice as large: it is checked at a
# budget of 1024 instead (147 s on an AVX512 CPU).
FAST_BF16 = cpu_has_fast_bf16()


@pytest.mark.parametrize(("dtype", "budget"), [("bfloat16", 4096) if FAST_BF16 else ("float32", 1024)])
def test_64_by_256_training_batch_fits_in_8_gib(dtype: str, budget: int) -> None:
    proc = subprocess.run([sys.executable, "-c", BIG_BATCH, dtype, str(budget)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tokens"] == 64 * 192
    assert torch.isfinite(torch.tensor([result["loss"], result["grad_norm"]])).all() and result["grad_norm"] > 0
    assert result["peak_rss_gib"] < 8.0, result


# Where bf16 is emulated (AVX2), `auto` never picks it and its passes run at ~1 GFLOP/s (over 3 of this tier's
# minutes there): the bf16 a run computes is checked on the CPU kinds that compute it natively.
@pytest.mark.skipif(not FAST_BF16, reason="this CPU only emulates bf16: model.dtype auto computes in fp32 here")
def test_bf16_scoring_and_gradients_stay_within_tolerance_of_fp32(tmp_path: Path) -> None:
    from purplerl.algorithms.registry import Loss, PolicyGradientParams
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine
    from purplerl.train.batch import build_train_batch, sequence_tensors
    from purplerl.types import AdamParams, SamplingParams

    fp32 = LocalEngine(ModelConfig(device="cpu", dtype="float32"), seed=0)
    prompts = [fp32.tokenizer.encode(fp32.tokenizer.apply_chat_template(
        [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False))
        for t in ("Tell me a joke.", "Insult my neighbour in one sentence please.", "Write a rude limerick.")]
    groups = fp32.sample(prompts, 4, SamplingParams(max_new_tokens=32, seed=1))
    tensors = sequence_tensors([c for g in groups for c in g], fp32.tokenizer.pad_token_id)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5] * 3)
    fp32.forward_backward(build_train_batch(tensors, advantages), Loss("importance_sampling"))
    fp32.optim_step(AdamParams(lr=1e-3))  # a nonzero adapter, shared by both engines below
    fp32.save(tmp_path / "adapter")
    bf16 = LocalEngine(ModelConfig(device="cpu", dtype="bfloat16"), seed=0)
    bf16.load(tmp_path / "adapter")

    ids, attn, mask = tensors["input_ids_NT"], tensors["attention_mask_NT"], tensors["loss_mask_NT"]
    picked = mask.bool()
    # measured: base 0.041 nats mean |difference| (bias +0.006); after the lr-1e-3 step 0.15 (bias -0.03)
    base_diff = (fp32.logprobs(ids, attn, targets_NT=mask, reference=True)
                 - bf16.logprobs(ids, attn, targets_NT=mask, reference=True))[picked]
    assert float(base_diff.abs().mean()) < 0.06 and abs(float(base_diff.mean())) < 0.02
    diff = (fp32.logprobs(ids, attn, targets_NT=mask) - bf16.logprobs(ids, attn, targets_NT=mask))[picked]
    assert float(diff.abs().mean()) < 0.2 and abs(float(diff.mean())) < 0.06

    batch = build_train_batch(tensors, advantages)
    loss = Loss("ppo_clip", PolicyGradientParams(old_logprobs="current"))
    grads = []
    for engine in (fp32, bf16):
        engine.forward_backward(batch, loss)
        grads.append(torch.cat([p.grad.flatten() for p in engine.master]))
        engine.optimizer.zero_grad(set_to_none=True)
    cosine = float(torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0))
    print(f"gradient cosine {cosine:.4f}, norm ratio {float(grads[1].norm() / grads[0].norm()):.4f}")
    assert cosine > 0.9
    assert float(grads[1].norm() / grads[0].norm()) == pytest.approx(1.0, abs=0.15)
