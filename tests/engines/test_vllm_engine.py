"""The vLLM engine with vLLM itself (make test-vllm): the adapter refresh after every update, and a short GRPO
run through the CLI with the mismatch metric, the importance-sampling correction and a resume.

The tiny model's 4 heads are 32 wide: vLLM's CPU attention serves no narrower head."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import make_engine
from purplerl.train.batch import sequence_tensors
from purplerl.types import AdamParams, SamplingParams, TrainBatch
from tests.conftest import make_tiny_model_dir

pytestmark = pytest.mark.vllm
TOL = 1e-4  # fp32 vLLM vs fp32 torch logprobs


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("wide_heads"), hidden_size=128)


def _vllm_logprobs(engine, ids: list[int], prompt_len: int) -> torch.Tensor:
    """vLLM's logprobs of the fixed continuation ids[prompt_len:] under the engine's current adapter."""
    from vllm import SamplingParams as VLLMSamplingParams

    out = engine._llm.generate([{"prompt_token_ids": ids}], VLLMSamplingParams(max_tokens=1, prompt_logprobs=0),
                               lora_request=engine._current_lora(), use_tqdm=False)
    scored = out[0].prompt_logprobs
    return torch.tensor([scored[t][ids[t]].logprob for t in range(prompt_len, len(ids))])


def _trainer_logprobs(engine, ids: list[int], prompt_len: int, reference: bool = False) -> torch.Tensor:
    ids_NT = torch.tensor([ids])
    mask_NT = torch.zeros(ids_NT.shape)
    mask_NT[0, prompt_len:] = 1
    return engine.logprobs(ids_NT, torch.ones_like(ids_NT), targets_NT=mask_NT, reference=reference)[0, prompt_len:]


def _update(engine) -> None:
    prompts = [engine.tokenizer.encode("Tell me a joke about cats"), engine.tokenizer.encode("hello world")]
    completions = [c for g in engine.sample(prompts, 2, SamplingParams(max_new_tokens=6, seed=0)) for c in g]
    tensors = sequence_tensors(completions, int(engine.tokenizer.pad_token_id))
    advantages = torch.linspace(-1, 1, len(completions))[:, None] * tensors["loss_mask_NT"]
    engine.forward_backward(TrainBatch(**tensors, advantages_NT=advantages),
                            Loss("importance_sampling", PolicyGradientParams(old_logprobs="current")))
    engine.optim_step(AdamParams(lr=5e-2))


def test_vllm_samples_from_the_new_adapter_after_each_update(wide_model_dir: Path) -> None:
    cfg = ModelConfig(name=str(wide_model_dir), dtype="float32", device="cpu", lora_rank=4, lora_alpha=8.0,
                      lora_targets="q_proj,v_proj,down_proj")
    engine = make_engine(cfg, engine=EngineConfig(kind="vllm"), seed=3)
    try:
        ids = engine.tokenizer.encode("Roast my friend who thinks he is a genius")
        P = 4
        before = _vllm_logprobs(engine, ids, P)
        torch.testing.assert_close(before, _trainer_logprobs(engine, ids, P), atol=TOL, rtol=0)
        first = engine._lora
        for _ in range(3):
            _update(engine)
        after = _vllm_logprobs(engine, ids, P)
        torch.testing.assert_close(after, _trainer_logprobs(engine, ids, P), atol=TOL, rtol=0)
        assert float((after - before).abs().max()) > 100 * TOL  # the adapter moved, and vLLM followed it
        assert engine._lora.lora_int_id > first.lora_int_id and not Path(first.lora_path).exists()
        assert engine.sample_metrics["rollout/lp_diff_max"] < TOL
        # another adapter: vLLM follows use_adapter too (a fresh adapter is the base)
        engine.create_adapter("fresh")
        engine.use_adapter("fresh")
        torch.testing.assert_close(_vllm_logprobs(engine, ids, P), _trainer_logprobs(engine, ids, P, reference=True),
                                   atol=TOL, rtol=0)
    finally:
        engine.close()


def _cli(*args, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "purplerl", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=900)


def test_grpo_run_through_the_cli_logs_the_mismatch_and_resumes(wide_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PURPLERL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = ["--batch_size", "2", "--group_size", "2", "--max_new_tokens", "8", "--save_every", "1",
              "--logging.progress", "false"]
    first = _cli("attack", "--engine", "vllm", "--model", wide_model_dir, "--model.dtype", "float32",
                 "--engine.vllm_is_correction", "true", "--steps", "2", "--output_dir", tmp_path, "--name", "run",
                 *common, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "run"
    resumed = _cli("attack", "--resume", run, "--steps", "3", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert 0 <= row["rollout/lp_diff_mean"] <= row["rollout/lp_diff_max"] < TOL
        assert row["rollout/is_weight_mean"] == pytest.approx(1.0, abs=TOL)
        assert row["entropy/mean"] > 0
    assert (run / "checkpoints" / "step_000003" / "adapter_model.safetensors").is_file()
