"""Collapse detection on synthetic step metrics, and the loop stopping a run whose outputs collapse."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import torch

from purplerl.config import (
    EngineConfig,
    LoggingConfig,
    ModelConfig,
    RLTrainingConfig,
    RunConfig,
    SamplingConfig,
)
from purplerl.data import PromptSampler
from purplerl.engines.local import LocalEngine
from purplerl.launch import run_settings
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import AttackSettings, attack_stops
from purplerl.runs.checkpoints import checkpoint_dirs, latest_checkpoint
from purplerl.runs.layout import COLLAPSED_DIR
from purplerl.train.loop import LoopParts, RecipeHooks, completion_shape, run_loop
from purplerl.train.runner import engine_settings
from purplerl.train.sinks import read_jsonl
from purplerl.train.stops import Collapse, CollapseBounds, collapse_early_stop, collapse_reason
from purplerl.types import Completion, PromptRecord, RewardBreakdown

BOUNDS = CollapseBounds(max_empty_frac=0.25, max_top_share=0.9, max_entropy_swing=2.0)
HEALTHY = {"completion/empty_frac": 0.0, "completion/top_share": 0.125, "entropy/mean": 1.0}


def test_healthy_metrics_are_no_collapse() -> None:
    assert collapse_reason(HEALTHY, None, BOUNDS) is None
    assert collapse_reason(HEALTHY, 2.9, BOUNDS) is None  # a 1.9-nat change is within the bound
    assert collapse_reason({}, 1.0, BOUNDS) is None  # a recipe without these metrics is never stopped


def test_each_sign_of_collapse_is_named() -> None:
    assert collapse_reason({**HEALTHY, "completion/empty_frac": 0.5}, None, BOUNDS) == \
        "50% of the completions are empty (bound 25%)"
    assert collapse_reason({**HEALTHY, "completion/empty_frac": 0.25}, None, BOUNDS) is None  # at the bound: not above
    assert collapse_reason({**HEALTHY, "completion/top_share": 31 / 32}, None, BOUNDS) == \
        "97% of the completions are one identical text (bound 90%)"
    assert collapse_reason({**HEALTHY, "entropy/mean": 7.25}, 1.0, BOUNDS) == \
        "mean token entropy jumped 1.00 -> 7.25 nats in one step (bound 2)"
    assert collapse_reason({**HEALTHY, "entropy/mean": 0.5}, 3.0, BOUNDS) == \
        "mean token entropy jumped 3.00 -> 0.50 nats in one step (bound 2)"  # down is a swing too


def test_a_slow_climb_above_the_start_is_a_collapse() -> None:
    # the paper-weight run's shape: no step moves 2 nats, but entropy climbs far above where it started
    stop = collapse_early_stop(BOUNDS)
    entropies = [1.0, 0.9, 1.1, 1.0, 1.0, 0.7, 0.5, 1.5, 2.4, 2.9, 3.2]  # start (first 5) = 1.0
    reasons = [stop({**HEALTHY, "entropy/mean": e}) for e in entropies]
    assert reasons[:10] == [None] * 10  # 2.9 is 1.9 above the start
    assert reasons[10] == "collapsed: mean token entropy rose to 3.20 nats from 1.00 over the first 5 steps (bound +2)"
    falling = collapse_early_stop(BOUNDS)  # falling far is the defense's aim, not a collapse
    assert [falling({**HEALTHY, "entropy/mean": e}) for e in [3.6] * 5 + [2.4, 1.3, 0.8]] == [None] * 8


def test_the_stop_rule_remembers_the_previous_entropy() -> None:
    stop = collapse_early_stop(BOUNDS)
    entropies = [1.0, 1.4, 0.9, 2.8, 4.9]  # the last step jumps 2.1 nats
    reasons = [stop({**HEALTHY, "entropy/mean": e}) for e in entropies]
    assert reasons[:4] == [None] * 4
    assert isinstance(reasons[4], Collapse)
    assert reasons[4] == "collapsed: mean token entropy jumped 2.80 -> 4.90 nats in one step (bound 2)"


def test_completion_shape_counts_empty_and_identical_texts() -> None:
    def completion(text: str) -> Completion:
        return Completion(prompt_tokens=(1,), tokens=(2,), logprobs_C=torch.zeros(1), entropies_C=torch.zeros(1),
                          text=text, finish_reason="stop")

    texts = ["", "  \n", "I can't help.", "I can't  help.", "Sure: step one", "no"]
    assert completion_shape([completion(t) for t in texts]) == {"completion/empty_frac": 2 / 6,
                                                               "completion/top_share": 2 / 6}


def test_config_turns_collapse_detection_on() -> None:
    off = attack_stops(run_settings("attack"))
    on = attack_stops(run_settings("attack", options=["--training.collapse_stop", "true",
                                                        "--training.collapse_empty_frac", "0.5"]))
    empty = {**HEALTHY, "completion/empty_frac": 0.75}
    assert off(empty) is None
    assert on(empty) == "collapsed: 75% of the completions are empty (bound 50%)"
    assert on({**HEALTHY, "toxicity/mean": 0.95}) == "mean toxicity 0.950 > 0.8"  # the threshold rules still apply


def test_each_bound_is_the_largest_healthy_value() -> None:
    # training.collapse_*: "the share ... above which a step has collapsed", "the largest change of mean token
    # entropy": a value exactly at its bound is healthy, a value just above it is a collapse (the next float for
    # the shares; 1e-9 nats for entropies, whose difference would round a one-ulp step away).
    # Bounds set from the CLI, each to a value no other bound has, so a bound read into the wrong rule shows.
    stop_rule = partial(attack_stops, run_settings("attack", options=[
                     "--training.collapse_stop", "true", "--training.collapse_empty_frac", "0.375",
                     "--training.collapse_top_share", "0.625", "--training.collapse_entropy_swing", "1.5"]))

    def above(bound: float) -> float:
        return math.nextafter(bound, math.inf)

    for key, bound in (("completion/empty_frac", 0.375), ("completion/top_share", 0.625)):
        assert stop_rule()({**HEALTHY, key: bound}) is None, key
        assert isinstance(stop_rule()({**HEALTHY, key: above(bound)}), Collapse), key
    # one step's change of entropy, up or down (exact in binary: 2.5 - 1.0 = 1.5)
    for previous, entropy in ((1.0, 2.5), (2.5, 1.0)):
        stop = stop_rule()
        assert stop({**HEALTHY, "entropy/mean": previous}) is None
        assert stop({**HEALTHY, "entropy/mean": entropy}) is None, (previous, entropy)
        stop = stop_rule()
        stop({**HEALTHY, "entropy/mean": previous})
        swing = entropy + 1e-9 if entropy > previous else entropy - 1e-9
        assert isinstance(stop({**HEALTHY, "entropy/mean": swing}), Collapse), (previous, entropy)
    # the slow climb: 1.5 above the mean of the first 5 steps (1.0), reached in steps of at most 0.5
    climb = [1.0] * 5 + [1.5, 2.0, 2.5]
    stop = stop_rule()
    assert [stop({**HEALTHY, "entropy/mean": e}) for e in climb] == [None] * 8
    stop = stop_rule()
    assert [stop({**HEALTHY, "entropy/mean": e}) for e in climb[:-1]] == [None] * 7
    assert stop({**HEALTHY, "entropy/mean": 2.5 + 1e-9}) == (
        "collapsed: mean token entropy rose to 2.50 nats from 1.00 over the first 5 steps (bound +1.5)")


RECORDS = [PromptRecord(messages=({"role": "user", "content": text},), uid=f"p{i}")
           for i, text in enumerate(["hello world", "tell me a joke", "say goodbye", "thanks please"])]


def test_a_run_rewarded_for_silence_stops_at_the_collapse(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Reward 1 for an empty answer and -0.1 per token otherwise: the policy (LoRA on lm_head, as in
    # test_loop's learning test) learns to stop at once, and the completions become empty.
    def reward_fn(prompts: list[PromptRecord], completions: list[Completion], kl_N: torch.Tensor) -> RewardBreakdown:
        total = torch.tensor([1.0 if not c.text.strip() else -0.1 * len(c.tokens) for c in completions])
        return RewardBreakdown(total_N=total, components={"kl": kl_N})

    config = AttackSettings(model=ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4,
                                              lora_targets="lm_head", dtype="float32"),
                            sampling=SamplingConfig(group_size=8, max_new_tokens=4),
                            training=RLTrainingConfig(steps=40, batch_size=2, lr=5e-2, collapse_stop=True),
                            engine=EngineConfig(),
                            run=RunConfig(save_every=1, keep_last=40), logging=LoggingConfig(progress=False))
    engine = LocalEngine(config.model, seed=0, settings=engine_settings(config))
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)
    parts = LoopParts(engine, PromptSampler(RECORDS, 2, 0), render,
                      RecipeHooks(reward=reward_fn, early_stop=attack_stops(config)))
    summary = run_loop(config, parts, tmp_path)

    step = summary["last_step"]
    assert step < 40 and isinstance(summary["stop_reason"], Collapse)
    assert summary["stop_reason"].startswith("collapsed: ") and "of the completions are empty" in summary["stop_reason"]
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert metrics[-1]["step"] == step and metrics[-1]["early_stop"] == summary["stop_reason"]
    assert metrics[-1]["completion/empty_frac"] > 0.25 >= metrics[-2]["completion/empty_frac"]
    # the weights that drew the collapsed samples (saved after step - 1) are set aside; the latest checkpoint
    # left is the last healthy state, and it loads
    assert [p.name for p in checkpoint_dirs(tmp_path)][-1] == f"step_{step - 2:06d}"
    assert (tmp_path / COLLAPSED_DIR / f"step_{step - 1:06d}").is_dir()
    engine.load(latest_checkpoint(tmp_path))
