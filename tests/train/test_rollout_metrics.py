"""The loop logs what an engine reports about its sampler (`sample_metrics`, read right after each rollout)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from purplerl.config import LoggingConfig, ModelConfig, RLTrainingConfig, RunConfig, SamplingConfig
from purplerl.data import PromptSampler
from purplerl.engines.local import LocalEngine
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import AttackSettings
from purplerl.train.loop import LoopParts, RecipeHooks, run_loop
from purplerl.train.sinks import read_jsonl
from purplerl.types import PromptRecord, RewardBreakdown

RECORDS = [PromptRecord(messages=({"role": "user", "content": text},), uid=f"p{i}")
           for i, text in enumerate(["hello world", "tell me a joke about cats", "roast my friend"])]


class ReportingEngine(LocalEngine):
    """A local engine that reports a made-up sampler gap: 0.5 per sample() call so far."""

    calls = 0

    def sample(self, *args, **kwargs):
        self.calls += 1
        self.sample_metrics = {"rollout/lp_diff_mean": 0.5 * self.calls}
        return super().sample(*args, **kwargs)


def _reward(prompts, completions, kl_N: torch.Tensor) -> RewardBreakdown:
    lengths = torch.tensor([float(len(c.tokens)) for c in completions])
    return RewardBreakdown(total_N=lengths, components={"length": lengths})


def test_the_engines_sampler_metrics_are_logged_per_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = AttackSettings(model=ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4, dtype="float32"),
                            sampling=SamplingConfig(group_size=2, max_new_tokens=4),
                            training=RLTrainingConfig(steps=2, batch_size=2, lr=1e-2),
                            run=RunConfig(save_every=5), logging=LoggingConfig(progress=False))
    engine = ReportingEngine(config.model, seed=0)
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)
    parts = LoopParts(engine, PromptSampler(RECORDS, 2, 0), render, RecipeHooks(reward=_reward))
    run_loop(config, parts, tmp_path)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["rollout/lp_diff_mean"] for r in rows] == [0.5, 1.0]


def test_an_engine_without_a_report_adds_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = AttackSettings(model=ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4, dtype="float32"),
                            sampling=SamplingConfig(group_size=2, max_new_tokens=4),
                            training=RLTrainingConfig(steps=1, batch_size=2, lr=1e-2),
                            run=RunConfig(save_every=5), logging=LoggingConfig(progress=False))
    engine = LocalEngine(config.model, seed=0)
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)
    run_loop(config, LoopParts(engine, PromptSampler(RECORDS, 2, 0), render, RecipeHooks(reward=_reward)), tmp_path)
    assert not [k for k in read_jsonl(tmp_path / "metrics.jsonl")[0] if k.startswith("rollout/")]
