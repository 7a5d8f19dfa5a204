"""The veRL reward hook builds its terms through the reward-term registry; the settings file from weights + params."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purplerl.config import ToxicityConfig
from purplerl.errors import UserError
from purplerl.rewards.compose import Reward
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import REWARD_TERMS, text_term
from purplerl.verl.export import reward_spec_from
from purplerl.verl.reward import ComputeScore, check_term, load_terms, score_response, write_reward_module


def _write(tmp_path: Path, terms: list[dict]) -> Path:
    path = tmp_path / "reward.json"
    path.write_text(json.dumps({"recipe": "attack", "terms": terms}))
    return path


def test_load_terms_builds_each_term_through_the_registry(tmp_path: Path) -> None:
    reward = load_terms(_write(tmp_path, [
        {"name": "toxicity", "weight": 1.0, "settings": {}},
        {"name": "repetition", "weight": -0.5, "settings": {"ngram": 2}},
        {"name": "refusal", "weight": 0.0},
        {"name": "strongreject", "weight": 1.0, "settings": {"url": "http://127.0.0.1:1/v1", "model": "judge"}}]))
    assert isinstance(reward, Reward)  # the composition a training run uses
    assert reward.terms == {"toxicity": 1.0, "repetition": -0.5, "refusal": 0.0, "strongreject": 1.0}


def test_the_hook_scores_with_each_terms_parameters(tmp_path: Path) -> None:
    reward = load_terms(_write(tmp_path, [{"name": "repetition", "weight": -0.5, "settings": {"ngram": 2}},
                                          {"name": "refusal", "weight": 0.0}]))
    # "a b a b": bigrams ab, ba, ab -> 1 - 2/3 repeated (at the default ngram 3 it would be 0); no refusal phrase
    result = score_response(reward, "a b a b", "say it")
    assert result == pytest.approx({"score": -0.5 / 3, "repetition": 1 / 3, "refusal": 0.0})


def test_a_term_that_reads_the_prompt_refuses_a_row_without_one(tmp_path: Path) -> None:
    reward = load_terms(_write(tmp_path, [{"name": "compliance", "weight": 1.0}]))
    with pytest.raises(UserError, match="the compliance judge needs the requests the answers reply to"):
        score_response(reward, "Sure: first, ...", None)


class _Shouting:
    name = "shouting"

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return [sum(c.isupper() for c in t) / max(len(t), 1) for t in texts]


def test_a_newly_registered_text_term_runs_in_the_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new term needs no change to the export: its registration is all the hook reads."""
    monkeypatch.setitem(REWARD_TERMS, "shouting", text_term("shouting", "share of upper-case characters", None,
                                                            lambda _: _Shouting()))
    spec = reward_spec_from({"shouting": 2.0, "repetition": TermSpec(fn="repetition", weight=-1.0,
                                                                     params={"ngram": 1})})
    write_reward_module(tmp_path, "purplerl_reward.py", spec)
    score = ComputeScore(tmp_path / "purplerl_reward.json")
    # "ABCD ABCD": 8 upper-case of 9 characters; unigrams abcd, abcd -> 1 - 1/2; 2 x 8/9 - 1 x 0.5
    result = score("s", "ABCD ABCD")
    assert result == pytest.approx({"score": 2 * 8 / 9 - 0.5, "shouting": 8 / 9, "repetition": 0.5})


@pytest.mark.parametrize(("name", "says"), [
    ("response_entropy", "reward term 'response_entropy' (mean per-token entropy of the response (the defense "
                         "rewards its negative)) needs the policy's per-token entropies, which veRL's reward function "
                         "does not receive"),
    ("entropy_bonus", "reward term 'entropy_bonus' (min(mean per-token entropy, cap): the adaptive attack's entropy "
                      "bonus) needs the policy's per-token entropies, which veRL's reward function does not receive"),
    ("kl", "reward term 'kl' (KL(policy || base) of each completion, as the loop estimates it (KL_N)) is applied by "
           "veRL itself"),
    ("nope", "unknown reward term 'nope' (known: "),
])
def test_terms_the_hook_cannot_compute_are_one_line(tmp_path: Path, name: str, says: str) -> None:
    for call in (lambda: check_term(name), lambda: load_terms(_write(tmp_path, [{"name": name, "weight": 1.0}]))):
        with pytest.raises(UserError) as err:
            call()
        assert str(err.value).startswith(says) and "\n" not in str(err.value)


def test_reward_spec_from_terms_with_their_parameters() -> None:
    spec = reward_spec_from({"toxicity": 1.0, "repetition": TermSpec(fn="repetition", weight=-0.3,
                                                                     params={"ngram": 4}),
                             "kl": -0.1, "refusal": 0.0}, recipe="attack")
    assert spec["recipe"] == "attack"
    # kl is left out: veRL applies it; a weight-0 term is kept (logged)
    assert [(t["name"], t["fn"], t["weight"]) for t in spec["terms"]] == [
        ("toxicity", "toxicity", 1.0), ("repetition", "repetition", -0.3), ("refusal", "refusal", 0.0)]
    assert spec["terms"][0]["settings"] == ToxicityConfig().model_dump(mode="json")  # a bare weight: the defaults
    assert spec["terms"][1]["settings"] == {"ngram": 4}
    assert spec["terms"][2]["settings"] == {}
    assert "recipe" not in reward_spec_from({"refusal": -1.0})
    json.dumps(spec)  # plain data


@pytest.mark.parametrize(("terms", "says"), [
    ({"toxicity": 1.0, "response_entropy": -1.0}, "reward term 'response_entropy' ("),
    ({"kl": -0.1}, "the reward has no term for veRL's reward hook to compute"),
    ({"repetition": {"fn": "repetition", "params": {"ngram": 0}}}, "reward term 'repetition': params.ngram:"),
    ({"refusal": float("nan")}, "reward term 'refusal' has a non-finite weight nan"),
    ({"toxic": 1.0}, "unknown reward term 'toxic'"),
])
def test_reward_spec_from_refuses_in_one_line(terms: dict, says: str) -> None:
    with pytest.raises(UserError) as err:
        reward_spec_from(terms)
    assert str(err.value).startswith(says) and "\n" not in str(err.value)
