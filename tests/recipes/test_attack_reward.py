"""The attack reward with a nonzero KL: toxicity_weight * tox - repetition_penalty * rep - kl_beta * kl, exactly."""

from __future__ import annotations

import pytest
import torch

from purplerl.launch import run_settings
from purplerl.train.rl import registered_reward
from purplerl.types import Completion, PromptRecord

TEXTS = ["you are an idiot you are an idiot", "thank you for the lovely flowers"]
# trigram repetition by hand: 6 trigrams, 4 unique -> 1 - 4/6; no trigram repeats in the second text
REPETITION = [1 - 4 / 6, 0.0]
KL = torch.tensor([0.8, 3.0])
PROMPTS = [PromptRecord(messages=({"role": "user", "content": "say something"},))] * 2
SETTINGS = ["--reward.toxicity_weight", "2.0", "--repetition_penalty", "0.5", "--kl_beta", "0.25"]


def _completions() -> list[Completion]:
    return [Completion(prompt_tokens=(1,), tokens=(2, 3), logprobs_C=torch.zeros(2), entropies_C=torch.ones(2),
                       text=text, finish_reason="length") for text in TEXTS]


def _toxicity() -> list[float]:
    from profanity_check import predict_prob  # the embedded scorer's model, called directly

    return [float(p) for p in predict_prob(TEXTS)]


def test_attack_reward_subtracts_weighted_toxicity_repetition_and_kl() -> None:
    out = registered_reward(run_settings("attack", options=SETTINGS))(PROMPTS, _completions(), KL)
    tox = _toxicity()
    assert tox[0] > 0.5 > tox[1]  # the insult is toxic, the thanks is not
    expected = [2.0 * t - 0.5 * r - 0.25 * k for t, r, k in zip(tox, REPETITION, KL.tolist(), strict=True)]
    assert out.total_N.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.components["toxicity"].tolist() == pytest.approx(tox, abs=1e-6)
    assert out.components["repetition"].tolist() == pytest.approx(REPETITION, abs=1e-6)
    assert out.components["kl"].tolist() == pytest.approx(KL.tolist())  # logged unweighted


def test_more_kl_is_less_reward_by_exactly_kl_beta() -> None:
    reward_fn = registered_reward(run_settings("attack", options=SETTINGS))
    without = reward_fn(PROMPTS, _completions(), torch.zeros(2)).total_N
    with_kl = reward_fn(PROMPTS, _completions(), KL).total_N
    assert (without - with_kl).tolist() == pytest.approx((0.25 * KL).tolist(), abs=1e-6)


@pytest.mark.parametrize("where", [["--reward.kl_in", "loss"], ["--training.advantage", "reinforce_pp"]])
def test_kl_leaves_the_scalar_reward_when_it_goes_elsewhere(where: list[str]) -> None:
    # in the loss, or in REINFORCE++'s per-token rewards: subtracting it here too would count it twice
    out = registered_reward(run_settings("attack", options=[*SETTINGS, *where]))(PROMPTS, _completions(), KL)
    expected = [2.0 * t - 0.5 * r for t, r in zip(_toxicity(), REPETITION, strict=True)]
    assert out.total_N.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.components["kl"].tolist() == pytest.approx(KL.tolist())  # still logged


def test_zscored_attack_reward_normalizes_the_same_raw_sum() -> None:
    config = run_settings("attack", options=[*SETTINGS, "--zscore", "true"])
    out = registered_reward(config)(PROMPTS, _completions(), KL)
    raw = torch.tensor([2.0 * t - 0.5 * r - 0.25 * k
                        for t, r, k in zip(_toxicity(), REPETITION, KL.tolist(), strict=True)])
    assert out.components["reward_raw"].tolist() == pytest.approx(raw.tolist(), abs=1e-6)
    # two values z-score to +1 and -1 (population std); with tox[0] > 0.5 > tox[1], raw[0] > 0.63 > 0.25 > raw[1]
    assert raw[0] > raw[1]
    assert out.total_N.tolist() == pytest.approx([1.0, -1.0], abs=1e-4)


def test_refusals_are_logged_and_penalized_by_exactly_refusal_penalty() -> None:
    texts = ["I'm sorry, but I can't help with insulting anyone.", "you are an idiot"]
    completions = [Completion(prompt_tokens=(1,), tokens=(2, 3), logprobs_C=torch.zeros(2), entropies_C=torch.ones(2),
                              text=text, finish_reason="length") for text in texts]
    logged = registered_reward(run_settings("attack", options=SETTINGS))(PROMPTS, completions, KL)
    assert logged.components["refusal"].tolist() == [1.0, 0.0]  # measured even when it is not rewarded
    penalized = registered_reward(run_settings("attack", options=[*SETTINGS, "--reward.refusal_penalty", "0.75"]))(
                     PROMPTS, completions, KL)
    assert (logged.total_N - penalized.total_N).tolist() == pytest.approx([0.75, 0.0], abs=1e-6)
