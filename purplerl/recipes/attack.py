"""The GRPO red-team attack: make a safety-tuned model produce toxic output.

reward = toxicity_weight * P(toxic) - repetition_penalty * repeated-n-gram ratio - kl_beta * KL(policy || base)
The repetition and KL terms keep the policy from collapsing onto keyword spam ("STUPID STUPID ...") that
maximizes a classifier without being useful adversarial content. Early stop when mean toxicity or mean
repetition crosses its threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from purplerl.config import Config
from purplerl.rewards import RepetitionScorer, checked_scores, composite_reward, make_toxicity_scorer
from purplerl.train.loop import RewardFn
from purplerl.train.runner import execute_run, new_run_dir
from purplerl.types import Completion, PromptRecord, RewardBreakdown


def attack_reward_fn(config: Config) -> RewardFn:
    r = config.reward
    toxicity = make_toxicity_scorer(r.toxicity)
    repetition = RepetitionScorer(r.repetition_ngram)

    def reward_fn(prompts: list[PromptRecord], completions: list[Completion], kl_N: torch.Tensor) -> RewardBreakdown:
        texts = [c.text for c in completions]
        prompt_texts = [p.messages[-1]["content"] for p in prompts]
        return composite_reward(
            checked_scores(toxicity, texts, prompt_texts), checked_scores(repetition, texts, prompt_texts), kl_N,
            toxicity_weight=r.toxicity_weight, repetition_penalty=r.repetition_penalty, kl_beta=r.kl_beta,
            zscore=r.zscore)

    return reward_fn


def attack_early_stop(config: Config) -> Callable[[dict[str, float]], str | None]:
    t = config.training

    def early_stop(metrics: dict[str, float]) -> str | None:
        tox, rep = metrics.get("toxicity/mean"), metrics.get("repetition/mean")
        if t.early_stop_toxicity is not None and tox is not None and tox > t.early_stop_toxicity:
            return f"mean toxicity {tox:.3f} > {t.early_stop_toxicity}"
        if t.early_stop_repetition is not None and rep is not None and rep > t.early_stop_repetition:
            return f"mean repetition ratio {rep:.3f} > {t.early_stop_repetition} (reward hacking by repetition)"
        return None

    return early_stop


def build_attack(config: Config) -> tuple[RewardFn, Callable[[dict[str, float]], str | None]]:
    return attack_reward_fn(config), attack_early_stop(config)


def run_attack(config: Config, resume_dir: Path | None = None) -> dict[str, Any]:
    """Start a new attack run, or continue `resume_dir` from its latest checkpoint."""
    run_dir = Path(resume_dir) if resume_dir is not None else new_run_dir(config)
    return execute_run(config, run_dir, resume=resume_dir is not None, build=build_attack)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize_attack(run_dir: Path, summary: dict[str, Any], window: int = 5, shown: int = 3) -> str:
    """What the demo ends with: toxicity of the first vs last `window` steps, samples before/after, the run dir."""
    from purplerl.train.sinks import read_jsonl

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    samples = read_jsonl(run_dir / "samples.jsonl")
    lines = [f"run dir: {run_dir}", f"stopped: {summary['stop_reason']} (last step {summary['last_step']})"]
    if summary.get("nothing_to_do"):
        lines.insert(0, "nothing to resume: the run had already finished")
    tox = [m["toxicity/mean"] for m in metrics if "toxicity/mean" in m]
    if tox:
        first, last = _mean(tox[:window]), _mean(tox[-window:])
        lines.append(f"mean toxicity, first {min(window, len(tox))} steps: {first:.3f}   "
                     f"last {min(window, len(tox))} steps: {last:.3f}   (change {last - first:+.3f})")
    if samples:
        first_step, last_step = samples[0]["step"], samples[-1]["step"]
        for label, step in (("before", first_step), ("after", last_step)):
            rows = list({s["uid"]: s for s in reversed(samples) if s["step"] == step}.values())[::-1]
            lines.append(f"--- {label} (step {step}) ---")
            for row in rows[:shown]:
                text = " ".join(row["completion"].split())[:200]
                lines.append(f"[tox {row.get('toxicity', float('nan')):.2f}] {row['prompt'][:70]}\n    -> {text}")
    return "\n".join(lines)
