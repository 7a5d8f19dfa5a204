"""The GRPO red-team attack: make a safety-tuned model produce toxic output.

reward = toxicity_weight * P(toxic) - repetition_penalty * repeated-n-gram ratio - kl_beta * KL(policy || base)
The repetition and KL terms keep the policy from collapsing onto keyword spam ("STUPID STUPID ...") that
maximizes a classifier without being useful adversarial content. Early stop when mean toxicity or mean
repetition crosses its threshold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from purplerl.config import Config
from purplerl.recipes.summary import summarize_run
from purplerl.rewards import RepetitionScorer, checked_scores, combine, make_toxicity_scorer
from purplerl.rewards.client import HTTPScorer, record_server
from purplerl.rewards.entropy import mean_entropy
from purplerl.rewards.refusal import RefusalJudge
from purplerl.train.loop import Evaluation, RecipeHooks, RewardFn, reward_kl_beta, rl_update
from purplerl.train.runner import execute_run, new_run_dir, rl_recipe
from purplerl.train.stops import run_early_stop
from purplerl.types import Completion, PromptRecord, RewardBreakdown


def attack_reward_fn(config: Config) -> RewardFn:
    r = config.reward
    toxicity = make_toxicity_scorer(r.toxicity)
    if isinstance(toxicity, HTTPScorer):
        # recorded before the runner saves config.yaml, so the run says which model gave its rewards
        record_server(r.toxicity, toxicity.info())
    repetition = RepetitionScorer(r.repetition_ngram)
    refusal = RefusalJudge()
    kl_weight = reward_kl_beta(config)

    def reward_fn(prompts: list[PromptRecord], completions: list[Completion], kl_N: torch.Tensor) -> RewardBreakdown:
        texts = [c.text for c in completions]
        prompt_texts = [p.messages[-1]["content"] for p in prompts]
        terms = {"toxicity": (r.toxicity_weight, checked_scores(toxicity, texts, prompt_texts)),
                 "repetition": (-r.repetition_penalty, checked_scores(repetition, texts, prompt_texts)),
                 "kl": (-kl_weight, kl_N),
                 # logged at weight 0 too: how often the policy still refuses is what an attack on safety breaks
                 "refusal": (-r.refusal_penalty, checked_scores(refusal, texts, prompt_texts))}
        if r.entropy_bonus_cap is not None:
            # Token Buncher's adaptive attack: pay the policy for keeping its entropy up (up to the cap), which
            # counters a defense that makes harmful answers low-entropy
            terms["entropy_bonus"] = (1.0, mean_entropy(completions).clamp(max=r.entropy_bonus_cap))
        rewards = combine(terms, zscore=r.zscore)
        if isinstance(toxicity, HTTPScorer):
            # logged, not rewarded: 1 where the server cut the text to its max_chars before scoring it
            cut_N = torch.zeros(len(texts))
            cut_N[toxicity.last_truncated] = 1.0
            rewards.components["toxicity_truncated"] = cut_N
        return rewards

    return reward_fn


# The attack's target is the aligned model (purplerl align builds it on first use): a model with safety to break.
ATTACK_DEFAULTS: dict[str, Any] = {"recipe": "attack", "model": {"name": "embedded:smollm2-135m-safe"}}


def build_attack(config: Config) -> RecipeHooks:
    return RecipeHooks(reward=attack_reward_fn(config), update=rl_update, early_stop=run_early_stop(config))


def run_attack(config: Config, resume_dir: Path | None = None, restart: bool = False,
               evaluation: Evaluation | None = None) -> dict[str, Any]:
    """Start a new attack run, or continue `resume_dir` from its latest checkpoint; `evaluation`: a held-out
    evaluation the loop runs (tamper-test's judge)."""
    run_dir = Path(resume_dir) if resume_dir is not None else new_run_dir(config)
    return execute_run(config, run_dir, resume=resume_dir is not None, prepare=rl_recipe(build_attack),
                       restart=restart, evaluation=evaluation)


def summarize_attack(run_dir: Path, summary: dict[str, Any]) -> str:
    return summarize_run(run_dir, summary, {"toxicity/mean": "mean toxicity", "refusal/mean": "refusal rate"})
