"""run_loop end to end on the tiny random Llama with a real LocalEngine and hand-written reward functions."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch

from purplerl.config import EngineConfig, LoggingConfig, ModelConfig, RLTrainingConfig, RunConfig, SamplingConfig
from purplerl.data import PromptSampler
from purplerl.engines.local import LocalEngine
from purplerl.errors import ExperimentError
from purplerl.prompting import render_prompt
from purplerl.recipes.attack import AttackSettings
from purplerl.runs.checkpoints import checkpoint_dirs, read_state
from purplerl.train.loop import LoopParts, RecipeHooks, run_loop
from purplerl.train.runner import engine_settings
from purplerl.train.sinks import read_jsonl
from purplerl.train.steps import never_stop
from purplerl.types import Completion, PromptRecord, RewardBreakdown

RECORDS = [PromptRecord(messages=({"role": "user", "content": text},), category=f"c{i % 2}", uid=f"p{i}")
           for i, text in enumerate(["hello world", "tell me a joke about cats", "roast my friend",
                                     "I hate Monday mornings", "say goodbye"])]
B, G = 2, 2



def _config(model_dir: Path, steps: int = 3, **training: object) -> AttackSettings:
    return AttackSettings(model=ModelConfig(name=str(model_dir), device="cpu", lora_rank=4, dtype="float32"),
                          sampling=SamplingConfig(group_size=G, max_new_tokens=5),
                          training=RLTrainingConfig(steps=steps, batch_size=B, lr=1e-2, **training),
                          engine=EngineConfig(micro_batch_tokens=128),
                          run=RunConfig(save_every=2, keep_last=5), logging=LoggingConfig(progress=False))


def _parts(config: AttackSettings, reward_fn, early_stop: Callable[[dict[str, float]], str | None] = never_stop):
    engine = LocalEngine(config.model, seed=config.training.seed, settings=engine_settings(config))
    render = partial(render_prompt, engine.tokenizer, template="chat", system_prompt=None, max_prompt_tokens=64)
    sampler = PromptSampler(RECORDS, config.training.batch_size, config.training.seed)
    return LoopParts(engine, sampler, render, RecipeHooks(reward=reward_fn, early_stop=early_stop))


def _fraction_reward(token_ids: set[int]):
    def reward_fn(prompts: list[PromptRecord], completions: list[Completion], kl_N: torch.Tensor) -> RewardBreakdown:
        assert len(prompts) == len(completions) == kl_N.shape[0]
        frac = torch.tensor([sum(t in token_ids for t in c.tokens) / len(c.tokens) for c in completions])
        return RewardBreakdown(total_N=frac - 0.1 * kl_N,
                               components={"toxicity": frac, "repetition": torch.zeros_like(frac), "kl": kl_N})
    return reward_fn


def test_three_steps_write_metrics_samples_and_checkpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir)
    # a third of the vocabulary, so groups get different rewards and nonzero advantages
    summary = run_loop(config, _parts(config, _fraction_reward(set(range(0, 400, 3)))), tmp_path)
    assert summary == {"last_step": 3, "stop_reason": "completed all steps"}

    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        for key in ("reward/mean", "kl/mean", "entropy/mean", "toxicity/mean", "train/loss", "train/grad_norm"):
            assert isinstance(m[key], float) and math.isfinite(m[key]), key
        assert "early_stop" not in m
        assert 0.0 <= m["toxicity/mean"] <= 1.0
        assert 0.0 < m["entropy/mean"] <= math.log(400) + 1e-4
        assert 1.0 <= m["completion/len_mean"] <= 5.0
    assert metrics[0]["kl/mean"] == pytest.approx(0.0, abs=1e-4)  # a fresh adapter is the base model
    assert any(m["adv/adv_abs_mean"] > 0 for m in metrics)

    samples = read_jsonl(tmp_path / "samples.jsonl")
    assert len(samples) == 3 * B * G
    assert [s["step"] for s in samples] == [1] * 4 + [2] * 4 + [3] * 4
    assert {s["uid"] for s in samples} <= {r.uid for r in RECORDS}
    for s in samples:
        assert {"prompt", "completion", "finish_reason", "num_tokens", "advantage", "reward", "toxicity",
                "repetition", "kl", "category"} <= set(s)
        assert 1 <= s["num_tokens"] <= 5
    for step in (1, 2, 3):  # GRPO advantages sum to zero within each group of G
        rows = [s for s in samples if s["step"] == step]
        for g in range(B):
            assert sum(r["advantage"] for r in rows[g * G:(g + 1) * G]) == pytest.approx(0.0, abs=1e-6)

    # save_every=2: step 2, and always the last step
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_000002", "step_000003"]
    assert read_state(tmp_path / "checkpoints" / "step_000003") == {"finished": True, "stop_reason": None, "step": 3}
    assert read_state(tmp_path / "checkpoints" / "step_000002")["finished"] is False
    assert (tmp_path / "checkpoints" / "step_000003" / "adapter_model.safetensors").is_file()


def test_early_stop_ends_the_run_and_is_recorded(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir, steps=5)
    seen: list[dict[str, float]] = []

    def early_stop(metrics: dict[str, float]) -> str | None:
        seen.append(metrics)
        return "toxicity above target" if len(seen) == 2 else None

    summary = run_loop(config, _parts(config, _fraction_reward({5, 6, 7}), early_stop), tmp_path)
    assert summary == {"last_step": 2, "stop_reason": "toxicity above target"}
    assert len(seen) == 2 and "reward/mean" in seen[0] and "time/step_s" in seen[0]
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert "early_stop" not in metrics[0] and metrics[1]["early_stop"] == "toxicity above target"
    assert len(read_jsonl(tmp_path / "samples.jsonl")) == 2 * B * G
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step_000002"]
    assert read_state(checkpoint_dirs(tmp_path)[-1]) == {"finished": True, "stop_reason": "toxicity above target",
                                                         "step": 2}


def test_nan_reward_component_names_step_and_component(tiny_model_dir: Path, tmp_path: Path) -> None:
    def reward_fn(prompts, completions, kl_N):
        ok = torch.zeros(len(completions))
        tox = ok.clone()
        tox[1] = float("nan")
        return RewardBreakdown(total_N=ok, components={"toxicity": tox, "kl": kl_N})

    config = _config(tiny_model_dir)
    with pytest.raises(ExperimentError, match=r"step 1: non-finite values in reward component 'toxicity'"):
        run_loop(config, _parts(config, reward_fn), tmp_path)
    assert read_jsonl(tmp_path / "metrics.jsonl") == []
    assert checkpoint_dirs(tmp_path) == []


def test_wrong_number_of_rewards_is_an_experiment_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    def reward_fn(prompts, completions, kl_N):
        return RewardBreakdown(total_N=torch.zeros(len(completions) - 1), components={"kl": kl_N})

    config = _config(tiny_model_dir)
    with pytest.raises(ExperimentError, match=r"step 1: reward component 'reward' has shape \(3,\)"):
        run_loop(config, _parts(config, reward_fn), tmp_path)


def test_scorer_returning_too_few_scores_names_step_and_scorer(tiny_model_dir: Path, tmp_path: Path) -> None:
    from purplerl.rewards import checked_scores

    class DropsOne:
        name = "dropper"

        def score(self, texts, prompts=None):
            return [0.5] * (len(texts) - 1)

    def reward_fn(prompts, completions, kl_N):
        scores = checked_scores(DropsOne(), [c.text for c in completions])
        return RewardBreakdown(total_N=scores, components={"kl": kl_N})

    config = _config(tiny_model_dir)
    with pytest.raises(ExperimentError, match=r"^step 1: scorer 'dropper' returned 3 scores for 4 texts"):
        run_loop(config, _parts(config, reward_fn), tmp_path)


def test_policy_learns_to_emit_rewarded_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    # The tiny random model's logits are ~N(0, 0.1): an adapter on the hidden layers can move a logit by at
    # most |w_t| * |h| ~ 0.02 * sqrt(32) * sqrt(32) ~ 0.6, so only an adapter on lm_head can make a token
    # strongly preferred. Four target ids (1% of the vocabulary) give the first steps some signal.
    targets = {150, 151, 152, 153}

    def reward_fn(prompts, completions, kl_N):
        count = torch.tensor([float(sum(t in targets for t in c.tokens)) for c in completions])
        return RewardBreakdown(total_N=count, components={"toxicity": count, "kl": kl_N})

    config = AttackSettings(model=ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4,
                                              lora_targets="lm_head", dtype="float32"),
                            sampling=SamplingConfig(group_size=8, max_new_tokens=8),
                            training=RLTrainingConfig(steps=20, batch_size=2, lr=5e-2),
                            engine=EngineConfig(),
                            run=RunConfig(save_every=100, keep_last=1), logging=LoggingConfig(progress=False))
    run_loop(config, _parts(config, reward_fn), tmp_path)
    rewards = [m["reward/mean"] for m in read_jsonl(tmp_path / "metrics.jsonl")]
    assert len(rewards) == 20
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.5  # at the start a target is ~1 token in 100
    assert last > first + 2.0, rewards  # two more target tokens per 8-token completion
    assert json.loads((tmp_path / "checkpoints" / "step_000020" / "loop_state.json").read_text())["finished"]
