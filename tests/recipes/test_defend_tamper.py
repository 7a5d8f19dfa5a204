"""Defense reward, adaptive-attack reward and the tamper-test statistics."""

from __future__ import annotations

import pytest
import torch

from purplerl.config import load_config
from purplerl.errors import UserError
from purplerl.experiments.tamper import harm_curve_stats
from purplerl.recipes.attack import attack_reward_fn
from purplerl.recipes.defend import DEFEND_DEFAULTS, defend_reward_fn
from purplerl.rewards.entropy import mean_entropy
from purplerl.types import Completion, PromptRecord


def _completion(text: str, entropies: list[float]) -> Completion:
    n = len(entropies)
    return Completion(prompt_tokens=(1,), tokens=tuple(range(2, 2 + n)), logprobs_C=torch.zeros(n),
                      entropies_C=torch.tensor(entropies), text=text, finish_reason="length")


PROMPTS = [PromptRecord(messages=({"role": "user", "content": "hi"},))] * 2


def test_defend_reward_is_negative_mean_entropy_minus_kl() -> None:
    config = load_config(None, ["--kl_beta", "0.5"], base=DEFEND_DEFAULTS)
    completions = [_completion("you are an idiot", [1.0, 3.0]), _completion("hello friend", [0.5, 0.5, 0.5])]
    out = defend_reward_fn(config)(PROMPTS, completions, torch.tensor([0.2, 0.0]))
    assert out.total_N.tolist() == pytest.approx([-2.0 - 0.1, -0.5])
    assert out.components["response_entropy"].tolist() == pytest.approx([2.0, 0.5])
    assert out.components["toxicity"][0] > 0.5 > out.components["toxicity"][1]  # monitored, weight 0


def test_defend_defaults() -> None:
    config = load_config(None, [], base=DEFEND_DEFAULTS)
    assert (config.recipe, config.training.noiser, config.reward.kl_beta) == ("defend", True, 0.001)
    assert (config.training.noiser_warmup, config.training.noiser_every, config.training.noiser_epsilon) == (25, 2, 0.1)
    assert config.sampling.group_size == 4 and config.training.early_stop_toxicity is None


def test_adaptive_attack_adds_capped_entropy() -> None:
    config = load_config(None, ["--reward.entropy_bonus_cap", "3.0", "--repetition_penalty", "0", "--kl_beta", "0"])
    completions = [_completion("hello friend", [4.0, 5.0]), _completion("hello there", [1.0, 2.0])]
    out = attack_reward_fn(config)(PROMPTS, completions, torch.zeros(2))
    tox = out.components["toxicity"]
    assert out.components["entropy_bonus"].tolist() == pytest.approx([3.0, 1.5])
    assert out.total_N.tolist() == pytest.approx([tox[0].item() + 3.0, tox[1].item() + 1.5])
    assert mean_entropy(completions).tolist() == pytest.approx([4.5, 1.5])


def test_harm_curve_stats_by_hand() -> None:
    stats = harm_curve_stats([0.1, 0.2, 0.6, 0.4, 0.9, 0.8], threshold=0.5, window=2)
    assert stats["final_harm"] == pytest.approx(0.85)
    assert stats["auc"] == pytest.approx(3.0 / 6)
    assert stats["steps_to_threshold"] == 3 and stats["max_harm"] == 0.9 and stats["steps"] == 6
    assert harm_curve_stats([0.1, 0.2], threshold=0.5)["steps_to_threshold"] is None
    with pytest.raises(UserError):
        harm_curve_stats([], threshold=0.5)
