"""The embedded SmolLM2-135M-Instruct end to end (make test-slow): conversion cache, sampling, a short attack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from purplerl.config import EMBEDDED_MODEL

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("purplerl_cache")


def test_embedded_conversion_matches_gguf(fresh_cache, monkeypatch):
    from transformers import AutoModelForCausalLM

    from purplerl.engines.loading import find_embedded_gguf, resolve_model_path

    monkeypatch.setenv("PURPLERL_CACHE", str(fresh_cache))
    path = Path(resolve_model_path(EMBEDDED_MODEL))
    assert path.is_relative_to(fresh_cache)
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    assert (path / "purplerl_manifest.json").is_file(), "the conversion was not sealed with its manifest"
    assert not list(path.parent.glob("*.tmp")), "conversion left a temp dir behind"
    assert resolve_model_path(EMBEDDED_MODEL) == str(path)  # second call reuses the cache

    gguf = find_embedded_gguf("smollm2-135m-instruct")
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cached = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1345, 30]])
    with torch.no_grad():
        assert torch.equal(reference(ids).logits, cached(ids).logits)


def test_embedded_sampling_logprobs_match_recomputation():
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine
    from purplerl.train.batch import sequence_tensors
    from purplerl.types import SamplingParams

    engine = LocalEngine(ModelConfig(device="cpu", dtype="float32"), seed=0)
    prompts = [engine.tokenizer.encode(t) for t in ("Tell me a joke.", "Insult my neighbour in one sentence please.")]
    groups = engine.sample(prompts, 2, SamplingParams(max_new_tokens=12, seed=3))
    flat = [c for g in groups for c in g]
    tensors = sequence_tensors(flat, engine.tokenizer.pad_token_id)
    recomputed = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"])
    mask = tensors["loss_mask_NT"].bool()
    assert torch.allclose(recomputed[mask], tensors["sampling_logprobs_NT"][mask], atol=1e-4)


def test_attack_cli_on_embedded_model(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "purplerl.cli", "attack", "--steps", "2", "--batch_size", "2", "--group_size", "2",
           "--max_new_tokens", "12", "--output_dir", str(tmp_path), "--name", "slow", "--logging.progress", "false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mean toxicity" in proc.stdout
    metrics = [json.loads(line) for line in (tmp_path / "slow" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(0.0 <= m["toxicity/mean"] <= 1.0 for m in metrics)
    assert (tmp_path / "slow" / "checkpoints" / "step_000002" / "adapter_model.safetensors").is_file()
