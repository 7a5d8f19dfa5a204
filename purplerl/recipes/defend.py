"""Token Buncher defense (arXiv 2508.20697): make harmful-RL fail by making the model confident.

On harmful prompts the policy is rewarded with the negative mean token entropy of its own responses
(computed in the sampling pass, no extra forward), with a small in-reward KL to the base (0.001), and
after a warmup every few steps is a Token Noiser step (see algorithms/noiser.py). An attacker's RL then
starts from a policy whose harmful answers have little entropy left to explore, which starves the
policy-gradient signal. The defended adapter (the run's last checkpoint) is the starting policy of
`purplerl attack --init_adapter` or `purplerl tamper-test`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from purplerl.config import Config
from purplerl.recipes.attack import attack_early_stop, mean_entropy
from purplerl.recipes.summary import summarize_run
from purplerl.rewards import RepetitionScorer, checked_scores, combine, make_toxicity_scorer
from purplerl.train.loop import RewardFn, reward_kl_beta
from purplerl.train.runner import execute_run, new_run_dir
from purplerl.types import Completion, PromptRecord, RewardBreakdown

# What `purplerl defend` changes from the global defaults (the paper's settings, scaled to a CPU run).
DEFEND_DEFAULTS: dict[str, Any] = {
    "recipe": "defend",
    "sampling": {"group_size": 4},
    "training": {"noiser": True, "early_stop_toxicity": None},
    "reward": {"kl_beta": 0.001},
}


def defend_reward_fn(config: Config) -> RewardFn:
    r = config.reward
    toxicity = make_toxicity_scorer(r.toxicity)  # monitored only (weight 0): does the defense change harm?
    repetition = RepetitionScorer(r.repetition_ngram)
    kl_weight = reward_kl_beta(config)

    def reward_fn(prompts: list[PromptRecord], completions: list[Completion], kl_N: torch.Tensor) -> RewardBreakdown:
        texts = [c.text for c in completions]
        return combine({"response_entropy": (-1.0, mean_entropy(completions)), "kl": (-kl_weight, kl_N),
                        "toxicity": (0.0, checked_scores(toxicity, texts)),
                        "repetition": (0.0, checked_scores(repetition, texts))}, zscore=r.zscore)

    return reward_fn


def build_defend(config: Config) -> tuple[RewardFn, Callable[[dict[str, float]], str | None]]:
    return defend_reward_fn(config), attack_early_stop(config)


def run_defend(config: Config, resume_dir: Path | None = None, restart: bool = False) -> dict[str, Any]:
    run_dir = Path(resume_dir) if resume_dir is not None else new_run_dir(config)
    return execute_run(config, run_dir, resume=resume_dir is not None, build=build_defend,
                       restart=restart)


def summarize_defend(run_dir: Path, summary: dict[str, Any]) -> str:
    return summarize_run(run_dir, summary, {"response_entropy/mean": "mean response entropy",
                                            "toxicity/mean": "mean toxicity (monitored)"})
