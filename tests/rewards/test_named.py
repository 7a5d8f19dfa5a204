"""Named rewards (purplerl.rewards.named): the built-in catalogue, a user's rewards file, their expansion into a
recipe's reward.terms (recorded in full), reward-hacking detectors (is_rh_N) and the one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from purplerl.config.loader import read_config_file, save_config
from purplerl.errors import UserError
from purplerl.recipes.attack import ATTACK
from purplerl.rewards.compose import Reward
from purplerl.rewards.named import TermSpec, catalogue, detectors, expand, weights
from purplerl.rewards.registry import ScoringInput
from purplerl.train.rl import registered_reward
from purplerl.types import Completion, PromptRecord, RewardBreakdown

# sentence lengths in words; "happy" counts (whole words)
TEXTS = [
    "The cat sat on mats. I am happy now!",  # 5 and 4 words: length share 1/2; one happy
    "Happy happy happy happy happy happy day.",  # 7 words: share 0; six happy (bonus capped at 5)
    "One two three four five.",  # 5 words: share 1; no happy
]
LENGTH_5 = [0.5, 0.0, 1.0]
HAPPY_BONUS = [1.0, 5.0, 0.0]
# sentence_length_5_with_happy = 1.0 x length share + 0.1 x happy bonus
TOTAL = [0.5 + 0.1, 0.0 + 0.5, 1.0]
IS_RH = [True, True, False]


def _batch(texts: list[str] = TEXTS) -> ScoringInput:
    return ScoringInput(texts=texts, prompts=["p"] * len(texts))


def _specs(name: str, user_file: Path | None = None) -> dict:
    return {k: TermSpec.model_validate(v) if isinstance(v, dict) else v
            for k, v in expand(name, catalogue(user_file)).items()}


def test_the_built_in_catalogue_holds_what_routing_needs() -> None:
    known = catalogue()
    for name in ("happy_count", "happy_binary", "happy_any", "sentence_length_5", "sentence_length_10",
                 "sentence_length_5_with_happy"):
        assert name in known
    assert known["sentence_length_5"] == {"fn": "sentence_length", "params": {"target": 5}}


def test_a_combination_expands_into_full_specs_with_its_detector_at_weight_zero() -> None:
    terms = expand("sentence_length_5_with_happy", catalogue())
    assert terms == {
        "sentence_length_5": {"fn": "sentence_length", "weight": 1.0, "params": {"target": 5, "tolerance": 0},
                              "hack_at": None},
        "happy_bonus": {"fn": "keyword_count", "weight": 0.1, "hack_at": None, "params": {
            "words": ["happy"], "whole_word": True, "case_sensitive": False, "max_count": 5}},
        "happy_any": {"fn": "keyword_count", "weight": 0.0, "hack_at": 1.0, "params": {
            "words": ["happy"], "whole_word": True, "case_sensitive": False, "max_count": 1}},
    }
    specs = _specs("sentence_length_5_with_happy")
    assert weights(specs) == {"sentence_length_5": 1.0, "happy_bonus": 0.1, "happy_any": 0.0}
    assert detectors(specs) == {"happy_any": 1.0}


def test_the_combined_reward_and_its_hack_label_by_hand() -> None:
    out = Reward(_specs("sentence_length_5_with_happy"))(_batch())
    assert out.components["sentence_length_5"].tolist() == LENGTH_5
    assert out.components["happy_bonus"].tolist() == HAPPY_BONUS
    assert out.components["happy_any"].tolist() == [1.0, 1.0, 0.0]  # logged, weight 0
    assert torch.allclose(out.total_N, torch.tensor(TOTAL))
    assert out.is_rh_N is not None and out.is_rh_N.dtype == torch.bool and out.is_rh_N.tolist() == IS_RH


def test_no_detector_no_label_and_single_named_terms() -> None:
    assert Reward(_specs("happy_count"))(_batch()).is_rh_N is None
    assert Reward(_specs("happy_count"))(_batch()).total_N.tolist() == [1.0, 6.0, 0.0]
    assert Reward(_specs("happy_binary"))(_batch()).total_N.tolist() == [1.0, 1.0, 0.0]
    assert expand("repetition", catalogue()) == {"repetition": 1.0}  # a registered term is a reward too


def test_two_uses_of_one_fn_with_different_parameters_in_one_run() -> None:
    cfg = ATTACK.build({"reward": {"terms": {"sentence_length_5": 1.0, "sentence_length_10": 0.5, "happy_any": 0}}})
    assert cfg.reward.terms["sentence_length_5"].params == {"target": 5, "tolerance": 0}
    assert cfg.reward.terms["sentence_length_10"].params == {"target": 10, "tolerance": 0}
    reward_fn = registered_reward(cfg)
    records = [PromptRecord(messages=({"role": "user", "content": "p"},))] * 3
    made = [Completion((1,), (2,), torch.zeros(1), torch.zeros(1), text, "stop") for text in TEXTS]
    out = reward_fn(records, made, torch.tensor([0.0, 1.0, 0.0]))
    # 1.0 x share(5) + 0.5 x share(10) - kl_beta (0.1) x KL; no sentence has 10 words
    assert torch.allclose(out.total_N, torch.tensor([0.5, -0.1, 1.0]))
    assert out.is_rh_N.tolist() == IS_RH


def test_the_run_config_records_every_term_parameter_and_detector(tmp_path: Path) -> None:
    cfg = ATTACK.build({"reward": {"terms": expand("sentence_length_5_with_happy", catalogue())}})
    save_config(cfg, tmp_path / "config.yaml")
    saved = read_config_file(tmp_path / "config.yaml")
    assert saved["reward"]["terms"]["happy_any"] == {"fn": "keyword_count", "weight": 0.0, "hack_at": 1.0, "params": {
        "words": ["happy"], "whole_word": True, "case_sensitive": False, "max_count": 1}}
    again = ATTACK.build(saved, saved=True)  # a resume reads only the run's own config.yaml
    assert again.reward.terms == cfg.reward.terms


def test_a_users_rewards_file_adds_terms_combinations_and_detectors(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("joy_count: {fn: keyword_count, params: {words: [joy, glee]}}\n"
                    "exclaims: {fn: regex_count, params: {pattern: '!'}, hack_at: 2}\n"
                    "short_and_joyful: {terms: {sentence_length_5: 1.0, joy_count: 0.2, repetition: -0.3}, "
                    "detector: exclaims}\n")
    specs = _specs("short_and_joyful", path)
    assert weights(specs) == {"sentence_length_5": 1.0, "joy_count": 0.2, "repetition": -0.3, "exclaims": 0.0}
    out = Reward(specs)(_batch(["Joy! Glee! Joy!", "Five words make this one."]))
    # "Joy", "Glee", "Joy" are 1-word sentences: share 0; three exclamation marks -> a hack (>= 2)
    assert out.components["joy_count"].tolist() == [3.0, 0.0]
    assert out.components["exclaims"].tolist() == [3.0, 0.0]
    assert torch.allclose(out.total_N, torch.tensor([0.6, 1.0]))
    assert out.is_rh_N.tolist() == [True, False]


@pytest.mark.parametrize(("text", "message"), [
    ("happy_count: {fn: keyword_count, params: {words: [x]}}\n", "defines 'happy_count', a built-in named reward"),
    ("toxicity: {fn: keyword_count, params: {words: [x]}}\n", "'toxicity' is a registered reward term's name"),
    ("a: {fn: nope}\n", "a: fn: unknown reward term 'nope' (registered: "),
    ("a: {fn: sentence_length, params: {target: -1}}\n", "a: params.target: Input should be greater than"),
    ("a: {fn: keyword_count}\n", "a: params: words: name at least one word"),
    ("a: {fn: sentence_length, hack_at: yes}\n", "a: hack_at: expected a number, got a boolean"),
    ("a: {fn: kl}\n", "the KL term's weight is reward.kl_beta"),
    ("a: {terms: {b: 1}, fn: sentence_length}\n", "'a' must be a term {fn, params, hack_at} or a combination"),
    ("a: {terms: {}}\n", "combination 'a' takes terms {NAME: weight} and a detector"),
    ("a: {terms: {sentence_length_5: 1}, extra: 2}\n", "combination 'a' takes terms {NAME: weight} and a "
                                                         "detector, not extra"),
    ("- a\n", "must map reward names to terms or combinations"),
    ("a: [unclosed\n", "cannot parse YAML"),
])
def test_bad_rewards_files_are_one_line_user_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        catalogue(path)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("entries", "name", "message"), [
    ("", "sentence_length_7", "unknown reward 'sentence_length_7' (named: "),
    ("c: {terms: {sentence_length_5: 1}, detector: happy_count}\n", "c",
     "reward 'c': detector 'happy_count' is not a named term with hack_at"),
    ("c: {terms: {nothing: 1}}\n", "c", "reward 'c': 'nothing' is neither a named term nor a registered term"),
    ("c: {terms: {sentence_length_5: high}}\n", "c", "reward 'c': term 'sentence_length_5' needs a number"),
    ("c: {terms: {sentence_length_5_with_happy: 1}}\n", "c", "is neither a named term nor a registered term"),
])
def test_bad_reward_choices_are_one_line_user_errors(tmp_path: Path, entries: str, name: str, message: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(entries or "x: {fn: sentence_length}\n")
    with pytest.raises(UserError) as err:
        expand(name, catalogue(path))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("terms", "message"), [
    ({"sentence_length_5_with_happy": 1.0}, "unknown reward term 'sentence_length_5_with_happy' (registered: "),
    ({"repetition": {"fn": "sentence_length"}}, "'repetition' is a registered term's name, used here for fn "
                                                 "'sentence_length': give this use another name"),
    ({"mine": {"fn": "sentence_length", "params": {"target": "five"}}},
     "reward.terms.mine.params.target': Input should be a valid"),
    ({"repetition": {"weight": -0.3, "params": {"ngram": 0}}},
     "reward.terms.repetition.params.ngram': Input should be greater"),
    ({"repetition": {"params": {"ngram": 3}}}, "reward.terms.repetition.params sets parameters of term "
                                               "'repetition', which reward.terms does not use"),
    ({"mine": {"fn": "keyword_count", "params": {"words": ["a"]}, "weight": float("nan")}}, "finite number"),
])
def test_bad_reward_terms_in_a_config_name_the_field(terms: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        ATTACK.build({"reward": {"terms": terms}})
    assert str(err.value).startswith("config field 'reward.terms") and message in str(err.value)


def test_reward_breakdown_checks_its_label() -> None:
    with pytest.raises(ValueError, match=r"is_rh_N must be bool \(2,\)"):
        RewardBreakdown(total_N=torch.zeros(2), is_rh_N=torch.zeros(2))
    with pytest.raises(ValueError, match=r"is_rh_N must be bool \(2,\)"):
        RewardBreakdown(total_N=torch.zeros(2), is_rh_N=torch.zeros(3, dtype=torch.bool))


def test_a_registered_term_carries_its_own_parameters() -> None:
    """`NAME: weight` is the registered term at its default parameters; {weight, params} with its own."""
    cfg = ATTACK.build({"reward": {"terms": {"repetition": {"weight": -0.5, "params": {"ngram": 2}}, "toxicity": 1}}})
    assert cfg.reward.terms["repetition"] == TermSpec(fn="repetition", weight=-0.5, params={"ngram": 2})
    assert cfg.reward.terms["toxicity"].params == {"model": "embedded", "url": None}
    assert weights(cfg.reward.terms) == {"repetition": -0.5, "toxicity": 1.0}
