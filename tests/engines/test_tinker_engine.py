"""The tinker engine end to end against a real Tinker-API server on loopback (make test-tinker): a GRPO attack
through the `purplerl attack` CLI whose reward rises, resumed from its checkpoint; a dead service as one line
in bounded time; the API key never written into the run dir."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from purplerl.config import EngineConfig, ModelConfig, RewardServerConfig
from purplerl.engines import make_engine
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.server import create_app
from purplerl.types import AdamParams, SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "rewards"))
from reward_servers import ThreadServer  # noqa: E402

from tests import tinker_server as _tinker  # noqa: E402

tinker_server = _tinker.tinker_server  # the fixture these tests ask for


pytestmark = pytest.mark.tinker


class WordStartScorer:
    """1 for a completion that starts a new word (its text begins with a space), else 0: a random policy on the
    served model earns well under 0.2, and one that learned to start words earns up to 1."""

    name = "toxicity"

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return [float(t.startswith(" ")) for t in texts]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PURPLERL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def _purplerl(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "purplerl", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _rewards(run_dir: Path) -> list[float]:
    return [json.loads(line)["reward/mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_attack_through_the_cli_learns_and_resumes(tinker_server, tmp_path: Path) -> None:
    url, model_dir, api_key = tinker_server
    scorer = ThreadServer(create_app(RewardServerConfig(), scorer=WordStartScorer(), label="word_start"))
    env = _env(tmp_path)
    run_dir = tmp_path / "runs" / "attack"
    common = ["--engine.tinker_url", url, "--engine.tinker_loss_reduction", "sequence_mean"]
    try:
        # one token per completion, sampler logprobs in the ratio: Tinker's built-in importance_sampling
        done = _purplerl(["attack", "--model", str(model_dir), "--engine", "tinker", *common,
                          "--reward.terms.toxicity.params.url", scorer.url, "--kl_beta", "0",
                          "--repetition_penalty", "0",
                          "--steps", "4", "--batch_size", "4", "--group_size", "8", "--max_new_tokens", "1",
                          "--lr", "0.02", "--training.old_logprobs", "sampler", "--training.early_stop_toxicity",
                          "null", "--seed", "1", "--save_every", "2",
                          "--output_dir", str(tmp_path / "runs"), "--name", "attack", "--logging.progress", "false"],
                         env)
        assert done.returncode == 0, done.stderr[-3000:]
        state = json.loads((run_dir / "checkpoints" / "step_000004" / "tinker_state.json").read_text())
        assert state["adapters"]["default"].startswith("tinker://")
        resumed = _purplerl(["attack", "--resume", str(run_dir), "--steps", "6"], env)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    finally:
        scorer.stop()
    rewards = _rewards(run_dir)
    assert len(rewards) == 6
    # step 1 samples the base; the resumed steps 5-6 start from the adapter the checkpoint gave back
    assert sum(rewards[-3:]) / 3 > rewards[0] + 0.5, rewards
    assert rewards[4] > rewards[0] + 0.4, rewards
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert api_key.encode() not in path.read_bytes(), path


def test_a_dead_service_is_one_line_in_bounded_time(tiny_model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _purplerl(["attack", "--model", str(tiny_model_dir), "--engine", "tinker",
                      "--engine.tinker_url", f"http://127.0.0.1:{port}", "--engine.tinker_timeout_s", "5",
                      "--engine.tinker_retries", "0", "--steps", "1", "--output_dir", str(tmp_path / "runs"),
                      "--logging.progress", "false"], {**_env(tmp_path), "TINKER_API_KEY": "tml-unused"},
                     timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: tinker service: "), done.stderr[-2000:]


def test_what_the_api_cannot_give_is_refused_in_one_line(tinker_server) -> None:
    url, model_dir, _ = tinker_server
    engine = make_engine(ModelConfig(name=str(model_dir), lora_rank=4),
                         engine=EngineConfig(kind="tinker", tinker_url=url, tinker_loss_reduction="sequence_mean"))
    (completion,) = engine.sample([engine.tokenizer.encode("hello world")], 1, SamplingParams(max_new_tokens=3))[0]
    assert len(completion.tokens) == len(completion.logprobs_C) and torch.isnan(completion.entropies_C).all()
    from purplerl.rewards.entropy import mean_entropy

    with pytest.raises(ExperimentError, match="needs per-token entropies"):
        mean_entropy([completion])
    ids = torch.tensor([list(completion.prompt_tokens) + list(completion.tokens)])
    with pytest.raises(UserError, match="temperature 1 only"):
        engine.logprobs(ids, torch.ones_like(ids), temperature=0.7)
    with pytest.raises(UserError, match="cannot load a local PEFT adapter"):
        engine.create_adapter("other", init=model_dir)
    with pytest.raises(UserError, match="holds no tinker_state.json"):
        engine.load(model_dir)
    assert engine.optim_step(AdamParams(lr=1e-3))["grad_norm_reported"] == 1.0  # SkyRL reports its norm


def test_the_sequence_mean_scaling_matches_the_servers_own_reduction(tinker_server, tmp_path: Path) -> None:
    """A cross-entropy averaged per sequence, then over sequences, is exactly what SkyRL's server computes of
    a plain cross_entropy datum (a 'sum' engine sends one: its weights' per-row scale cancels there), and what
    a 'sequence_mean' engine computes through its rescaled surrogate: with an update that reads out the
    gradient, the two must leave the same weights, on rows of different lengths."""
    from purplerl.algorithms.registry import Loss
    from purplerl.train.batch import sequence_tensors
    from purplerl.types import TrainBatch

    url, model_dir, _ = tinker_server
    # update = 10 x the gradient (eps far above it): the two engines' updates match only if their gradients do
    readout = AdamParams(lr=1e5, beta1=0.0, beta2=0.0, eps=1e4, weight_decay=0.0, max_grad_norm=0.0)
    engines = {reduction: make_engine(ModelConfig(name=str(model_dir), lora_rank=4), seed=5, engine=EngineConfig(
        kind="tinker", tinker_url=url, tinker_loss_reduction=reduction)) for reduction in ("sum", "sequence_mean")}
    first = engines["sum"]
    prompts = [first.tokenizer.encode("hello world"), first.tokenizer.encode("Tell me a joke about cats")]
    groups = first.sample(prompts, 2, SamplingParams(max_new_tokens=6, seed=3))
    tensors = sequence_tensors([c for g in groups for c in g], int(first.tokenizer.pad_token_id))
    mask_NT = tensors["loss_mask_NT"].clone()
    mask_NT[0, mask_NT[0].nonzero()[:2, 0]] = 0  # row 0 trains on 2 tokens fewer: the rows weigh differently
    batch = TrainBatch(**{**tensors, "loss_mask_NT": mask_NT})
    assert len(set(mask_NT.sum(-1).tolist())) > 1
    for _ in range(2):  # off LoRA B = 0, where the gradient of A vanishes
        first.forward_backward(batch, Loss("cross_entropy"))
        first.optim_step(AdamParams(lr=5e-2))
    first.save(tmp_path)
    start = first.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    loss = Loss("cross_entropy", aggregation="seq_mean_token_mean")
    after = {}
    for reduction, engine in engines.items():
        engine.load(tmp_path)
        engine.forward_backward(batch, loss)
        engine.optim_step(readout)
        after[reduction] = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
    moved = float((after["sum"] - start).abs().max())
    assert moved > 1e-3
    assert float((after["sum"] - after["sequence_mean"]).abs().max()) <= 2e-3 * moved
