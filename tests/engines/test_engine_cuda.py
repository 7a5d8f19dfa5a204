"""The local engine on a CUDA device against the same engine on the CPU (`make test-gpu`; skipped without CUDA).

The CPU suite covers the maths; these check what only a GPU run can show: tensors on the right device in every
path (sampling, the merged sampler, head-only scoring, micro-batched training, master weights, checkpoints) and
numerics that agree with the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = [[1, 10, 20, 30, 40, 50, 60], [1, 11], [1, 12, 22, 32]]
PAD = 2
ADVANTAGES_N = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def _engine(model_dir: Path, device: str, settings: EngineSettings | None = None, **model_kw) -> LocalEngine:
    kw = {**({"lora_rank": 4} if model_kw.get("finetune", "lora") == "lora" else {}), "dtype": "float32", **model_kw}
    return LocalEngine(ModelConfig(name=str(model_dir), device=device, **kw), seed=0, settings=settings)


def _tensors(engine: LocalEngine, seed: int):
    groups = engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=seed))
    comps = [c for g in groups for c in g]
    return comps, sequence_tensors(comps, PAD)


def _grads(engine: LocalEngine, batch, loss: Loss) -> torch.Tensor:
    engine.forward_backward(batch, loss)
    flat = torch.cat([p.grad.flatten().cpu() for p in engine.master])
    return flat


def _same_adapter(source: LocalEngine, target: LocalEngine, tmp: Path) -> None:
    source.save(tmp)
    target.load(tmp)


def test_cuda_logprobs_gradients_and_updates_match_the_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    two_micro_batches = EngineSettings(micro_batch_size=4)  # the batch has 6 sequences
    cpu = _engine(tiny_model_dir, "cpu", settings=two_micro_batches)
    gpu = _engine(tiny_model_dir, "cuda", settings=two_micro_batches)
    assert gpu.device.type == "cuda" and all(p.is_cuda for p in gpu.master)
    _same_adapter(cpu, gpu, tmp_path / "init")
    _, tensors = _tensors(cpu, seed=1)
    ids, attn, mask = tensors["input_ids_NT"], tensors["attention_mask_NT"], tensors["loss_mask_NT"]
    for reference in (False, True):
        a = cpu.logprobs(ids, attn, reference=reference)
        b = gpu.logprobs(ids, attn, reference=reference)
        assert b.device.type == "cpu"  # results come back to the host
        assert torch.allclose(a, b, atol=1e-4)
    ref = cpu.logprobs(ids, attn, reference=True, targets_NT=mask)
    batch = build_train_batch(tensors, ADVANTAGES_N, ref_logprobs_NT=ref)
    loss = Loss("ppo_clip", PolicyGradientParams(kl_beta=0.1))
    g_cpu, g_gpu = _grads(cpu, batch, loss), _grads(gpu, batch, loss)
    assert float(g_cpu.norm()) > 0
    assert torch.allclose(g_cpu, g_gpu, atol=1e-5, rtol=1e-3)
    norms = [e.optim_step(AdamParams(lr=5e-2))["grad_norm"] for e in (cpu, gpu)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-4)
    # after the update both score alike, and differently from before it
    after_cpu, after_gpu = cpu.logprobs(ids, attn), gpu.logprobs(ids, attn)
    assert torch.allclose(after_cpu, after_gpu, atol=1e-4)
    assert float(((after_gpu - a) * mask).abs().max()) > 1e-3


def test_cuda_sampling_is_seeded_and_scored_by_its_own_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    merged = _engine(tiny_model_dir, "cuda")
    plain = _engine(tiny_model_dir, "cuda", EngineSettings(merged_sampler=False))
    _same_adapter(merged, plain, tmp_path / "init")
    for step in range(2):  # the merged sampler follows the optimizer step on the GPU too
        for engine in (merged, plain):
            _, tensors = _tensors(engine, seed=step)
            engine.forward_backward(build_train_batch(tensors, ADVANTAGES_N), Loss("importance_sampling"))
            engine.optim_step(AdamParams(lr=5e-2))
        a, ta = _tensors(merged, seed=10 + step)
        b, _ = _tensors(plain, seed=10 + step)
        assert [c.tokens for c in a] == [c.tokens for c in b]
    again, _ = _tensors(merged, seed=11)
    other, _ = _tensors(merged, seed=12)
    assert [c.tokens for c in again] == [c.tokens for c in a]
    assert [c.tokens for c in other] != [c.tokens for c in a]
    recomputed = merged.logprobs(ta["input_ids_NT"], ta["attention_mask_NT"])
    assert float(((recomputed - ta["sampling_logprobs_NT"]) * ta["loss_mask_NT"]).abs().max()) <= 1e-4


def test_cuda_bf16_auto_trains_near_fp32_and_saves_exact_masters(tiny_model_dir: Path, tmp_path: Path) -> None:
    fp32, auto = _engine(tiny_model_dir, "cuda"), _engine(tiny_model_dir, "cuda", dtype="auto")
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16: auto resolves to float32")
    assert auto.trainable[0].dtype == torch.bfloat16 and auto.master[0].dtype == torch.float32
    _same_adapter(fp32, auto, tmp_path / "init")
    _, tensors = _tensors(fp32, seed=3)
    batch = build_train_batch(tensors, ADVANTAGES_N)
    lp32 = fp32.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"])
    lp16 = auto.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"])
    assert float((lp32 - lp16).abs().mean()) < 0.05
    g32, g16 = _grads(fp32, batch, Loss("ppo_clip")), _grads(auto, batch, Loss("ppo_clip"))
    assert float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) > 0.98
    auto.optim_step(AdamParams(lr=5e-2))
    auto.save(tmp_path / "after")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "after" / "adapter_model.safetensors"))
    assert all(t.dtype == torch.float32 for t in saved.values())
    restored = _engine(tiny_model_dir, "cuda", dtype="auto")
    restored.load(tmp_path / "after")
    for m, r in zip(auto.master, restored.master, strict=True):
        assert torch.equal(m, r)


def test_attack_cli_runs_on_cuda(tiny_model_dir: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "purplerl.cli", "attack", "--model", str(tiny_model_dir), "--device", "cuda",
           "--steps", "3", "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "8", "--seed", "7",
           "--output_dir", str(tmp_path), "--name", "cuda", "--logging.progress", "false"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "cuda" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["train/loss"] == r["train/loss"] and r["train/grad_norm"] > 0 for r in rows)  # not NaN, learning


def test_cuda_sampling_fails_loudly_on_nan_weights(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, "cuda")
    assert engine.sampler.decode_sync_every > 1  # the GPU path reads its flags only every few tokens
    with torch.no_grad():
        for name, param in engine.model.named_parameters():
            if "lora_B" in name:
                param.fill_(float("nan"))
    from purplerl.errors import ExperimentError

    with pytest.raises(ExperimentError, match="sampling produced non-finite logits"):
        engine.sample(PROMPTS, 2, SamplingParams(max_new_tokens=20, seed=0))


def test_cuda_full_finetune_matches_the_cpu_and_checkpoints_move_between_them(tiny_model_dir: Path,
                                                                              tmp_path: Path) -> None:
    cpu, gpu = _engine(tiny_model_dir, "cpu", finetune="full"), _engine(tiny_model_dir, "cuda", finetune="full")
    assert all(p.is_cuda for p in gpu.master) and len(gpu.master) == len(list(gpu.model.parameters()))
    _, tensors = _tensors(cpu, seed=1)
    ids, attn = tensors["input_ids_NT"], tensors["attention_mask_NT"]
    initial = cpu.logprobs(ids, attn)
    batch = build_train_batch(tensors, ADVANTAGES_N)
    g_cpu, g_gpu = _grads(cpu, batch, Loss("importance_sampling")), _grads(gpu, batch, Loss("importance_sampling"))
    assert float(g_cpu.norm()) > 0 and torch.allclose(g_cpu, g_gpu, atol=1e-5, rtol=1e-3)
    for engine in (cpu, gpu):
        engine.optim_step(AdamParams(lr=1e-2))
    after = gpu.logprobs(ids, attn)
    assert torch.allclose(cpu.logprobs(ids, attn), after, atol=1e-4)
    assert float((after - initial).abs().max()) > 1e-3
    assert torch.allclose(gpu.logprobs(ids, attn, reference=True), initial, atol=1e-4)  # the initial model
    gpu.save(tmp_path / "gpu")
    restored = _engine(tiny_model_dir, "cpu", finetune="full")
    restored.load(tmp_path / "gpu")
    assert torch.allclose(restored.logprobs(ids, attn), after, atol=1e-4)
    if torch.cuda.is_bf16_supported():  # mixed precision on the GPU: bf16 weights, fp32 masters restored exactly
        mixed = _engine(tiny_model_dir, "cuda", finetune="full", dtype="bfloat16")
        mixed.load(tmp_path / "gpu")
        assert mixed.trainable[0].dtype == torch.bfloat16
        assert all(torch.equal(m.cpu(), r) for m, r in zip(mixed.master, restored.master, strict=True))
        assert float((mixed.logprobs(ids, attn) - after).abs().mean()) < 0.05


def test_cuda_graph_decoding_draws_what_eager_decoding_draws(tiny_model_dir: Path) -> None:
    from purplerl.engines.decoding import DynamicDecoder, StaticDecoder

    graphed = _engine(tiny_model_dir, "cuda")
    eager = _engine(tiny_model_dir, "cuda", EngineSettings(cuda_graphs=False))
    for sampling in (SamplingParams(max_new_tokens=12, seed=3), SamplingParams(max_new_tokens=12, seed=0,
                                                                               temperature=0.0)):
        a = [c for g in graphed.sample(PROMPTS, 3, sampling) for c in g]
        b = [c for g in eager.sample(PROMPTS, 3, sampling) for c in g]
        assert [c.tokens for c in a] == [c.tokens for c in b]
        for x, y in zip(a, b, strict=True):
            assert torch.allclose(x.logprobs_C, y.logprobs_C, atol=1e-4)
    assert graphed.sampler.graphs_work  # no capture failed (a failure falls back to eager decoding, with a warning)
    # the graph itself: captured at the second step, replayed after, same logits as the growing cache
    model = graphed.sampler.decoding_model()
    attn_NP = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]], device="cuda")
    ids_NP = torch.tensor([[2, 2, 10, 11], [1, 12, 13, 14]], device="cuda")
    position_N1 = torch.tensor([[1], [3]], device="cuda")
    with torch.no_grad():
        static = StaticDecoder(model, graphed.sampler.cache_kwarg, attn_NP, max_new_tokens=4, graphed=True)
        dynamic = DynamicDecoder(model, graphed.sampler.cache_kwarg, attn_NP)
        position_NP = (attn_NP.cumsum(-1) - 1).clamp(min=0)
        assert torch.allclose(static.prefill(ids_NP, position_NP), dynamic.prefill(ids_NP, position_NP), atol=1e-5)
        for k in range(4):
            tok_N = torch.tensor([5 + k, 9 + k], device="cuda")
            assert torch.allclose(static.step(tok_N, position_N1 + 1 + k), dynamic.step(tok_N, position_N1 + 1 + k),
                                  atol=1e-4), k
        assert static.graph is not None and static.graphed
