"""The reward-hacking label (RewardBreakdown.is_rh_N) reaches the step: its rate is logged as rh/rate, each sample
row says is_rh, data-parallel shards keep it, and a reward without a detector logs neither."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from purplerl.config import LoggingConfig, ModelConfig, RLTrainingConfig, RunConfig, SamplingConfig
from purplerl.data import PromptSampler
from purplerl.engines.distributed import World
from purplerl.engines.local import LocalEngine
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import AttackSettings
from purplerl.train.loop import LoopParts, RecipeHooks, run_loop
from purplerl.train.shards import StepShard, merge_shards
from purplerl.train.sinks import read_jsonl
from purplerl.types import PromptRecord, RewardBreakdown

RECORDS = [PromptRecord(messages=({"role": "user", "content": text},), uid=f"p{i}")
           for i, text in enumerate(["hello world", "tell me a joke about cats", "roast my friend"])]


def _labelled(prompts, completions, kl_N: torch.Tensor) -> RewardBreakdown:
    """A hack is a completion of an even number of tokens (any rule the test can recompute from the samples)."""
    even_N = torch.tensor([len(c.tokens) % 2 == 0 for c in completions])
    return RewardBreakdown(total_N=even_N.float(), components={"even": even_N.float()}, is_rh_N=even_N)


def _unlabelled(prompts, completions, kl_N: torch.Tensor) -> RewardBreakdown:
    return RewardBreakdown(total_N=torch.zeros(len(completions)))


def _run(model_dir: Path, out: Path, reward) -> tuple[list[dict], list[dict]]:
    config = AttackSettings(model=ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"),
                            sampling=SamplingConfig(group_size=2, max_new_tokens=5),
                            training=RLTrainingConfig(steps=2, batch_size=2, lr=1e-2),
                            run=RunConfig(save_every=5), logging=LoggingConfig(progress=False))
    engine = LocalEngine(config.model, seed=0)
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)
    run_loop(config, LoopParts(engine, PromptSampler(RECORDS, 2, 0), render, RecipeHooks(reward=reward)), out)
    return read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "samples.jsonl")


def test_the_hack_label_is_logged_per_step_and_per_sample(tiny_model_dir: Path, tmp_path: Path) -> None:
    metrics, samples = _run(tiny_model_dir, tmp_path, _labelled)
    for row in metrics:
        step = [s for s in samples if s["step"] == row["step"]]
        assert len(step) == 4
        assert all(s["is_rh"] == (s["num_tokens"] % 2 == 0) for s in step)
        assert row["rh/rate"] == sum(s["is_rh"] for s in step) / 4
        assert row["rh/rate"] == row["even/mean"]


def test_without_a_detector_no_rate_and_no_label(tiny_model_dir: Path, tmp_path: Path) -> None:
    metrics, samples = _run(tiny_model_dir, tmp_path, _unlabelled)
    assert not any("rh/rate" in row for row in metrics)
    assert not any("is_rh" in s for s in samples)


class _TwoRanks(World):
    """Rank 0 of two, whose peer's shard is given (gather without processes)."""

    def __init__(self, peer: StepShard) -> None:
        super().__init__(rank=0, size=2)
        self.peer = peer

    def gather(self, obj):
        return [obj, self.peer]


def _shard(is_rh: list[bool] | None) -> StepShard:
    n = 2
    rh = None if is_rh is None else torch.tensor(is_rh)
    return StepShard(prompts=RECORDS[:n], completions=[], rewards=RewardBreakdown(torch.zeros(n), {}, rh),
                     kl_N=torch.zeros(n), mask_NT=torch.ones(n, 3), adv_metrics={}, advantages_N=torch.zeros(n))


def test_shards_keep_the_label_in_rank_order() -> None:
    merged = merge_shards(_TwoRanks(_shard([False, True])), _shard([True, True]))
    assert merged.rewards.is_rh_N.tolist() == [True, True, False, True]
    assert merge_shards(_TwoRanks(_shard(None)), _shard(None)).rewards.is_rh_N is None
