"""keyword_count, regex_count and sentence_length: hand-counted texts, their caps, and their one-line errors."""

from __future__ import annotations

import pytest
import torch

from purplerl.errors import UserError
from purplerl.rewards.compose import Reward
from purplerl.rewards.counting import count_matches, keyword_pattern, sentence_length_share, sentence_lengths
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import ScoringInput, get_term, term_params

TEXTS = [
    "Happy days, happy! unhappy",  # "Happy", "happy" whole words; "unhappy" is another word
    "The cat sat on mats. It is red! Go home now, little dog",  # sentences of 5, 3 and 5 words
    "",
]


def _score(name: str, params: dict, texts: list[str] = TEXTS) -> list[float]:
    batch = ScoringInput(texts=texts, prompts=["p"] * len(texts))
    return Reward({name: TermSpec(fn=name, params=params)})(batch).components[name].tolist()


def test_keyword_count_whole_words_any_case_by_hand() -> None:
    assert _score("keyword_count", {"words": ["happy"]}) == [2.0, 0.0, 0.0]
    assert _score("keyword_count", {"words": ["happy"], "max_count": 1}) == [1.0, 0.0, 0.0]  # happy_binary
    # substrings: "Happy", "happy", "unhappy" -> 3; case-sensitive whole words: only the lower-case "happy" -> 1
    assert _score("keyword_count", {"words": ["happy"], "whole_word": False}) == [3.0, 0.0, 0.0]
    assert _score("keyword_count", {"words": ["happy"], "case_sensitive": True}) == [1.0, 0.0, 0.0]
    # two words: "cat" and "dog" once each in the second text
    assert _score("keyword_count", {"words": ["dog", "cat"]}) == [0.0, 2.0, 0.0]


def test_keyword_phrases_match_longest_first_and_literally() -> None:
    pattern = keyword_pattern(["happy", "happy days"])
    assert count_matches(pattern, "Happy days are here, happy") == 2.0  # "Happy days" once, then "happy"
    assert count_matches(keyword_pattern(["a.b"]), "a.b axb") == 1.0  # the dot is a dot, not any character


def test_regex_count_by_hand() -> None:
    # words starting with a vowel: "unhappy" in the first text; "on", "It", "is" in the second
    assert _score("regex_count", {"pattern": r"\b[aeiou]\w*", "ignore_case": True}) == [1.0, 3.0, 0.0]
    assert _score("regex_count", {"pattern": r"\b[aeiou]\w*"}) == [1.0, 2.0, 0.0]  # "It" has a capital I
    assert _score("regex_count", {"pattern": "p", "max_count": 2}) == [2.0, 0.0, 0.0]  # 6 p's, capped at 2


def test_sentence_length_by_hand() -> None:
    assert sentence_lengths(TEXTS[1]) == [5, 3, 5]
    assert sentence_lengths("Don't stop... Go!!") == [2, 1]  # "don't" is one word; a run of . ! ? ends one sentence
    assert sentence_length_share(TEXTS[1], 5) == pytest.approx(2 / 3)
    assert sentence_length_share(TEXTS[1], 5, tolerance=2) == 1.0
    assert sentence_length_share("...", 5) == 0.0  # no sentences
    assert _score("sentence_length", {"target": 5}) == pytest.approx([0.0, 2 / 3, 0.0])
    # the first text: "Happy days, happy" (3 words), then "unhappy" (1) after the "!"
    assert sentence_lengths(TEXTS[0]) == [3, 1]
    assert _score("sentence_length", {"target": 3}) == pytest.approx([0.5, 1 / 3, 0.0])


def test_scorers_are_the_terms_values() -> None:
    # serve-reward, veRL and eval use the Scorer: the same numbers as the training term
    scorer = get_term("sentence_length").scorer(term_params("sentence_length", {"target": 5}))
    assert scorer.score(TEXTS) == pytest.approx([0.0, 2 / 3, 0.0])
    assert torch.is_tensor(Reward({"keyword_count": {"fn": "keyword_count", "params": {"words": ["x"]}}})(
        ScoringInput(texts=["x"], prompts=["p"])).total_N)


@pytest.mark.parametrize(("name", "params", "message"), [
    ("regex_count", {"pattern": "(unclosed"}, "reward term 'regex_count': params.pattern: not a regular expression"),
    ("keyword_count", {"words": ["happy"], "max_count": 0}, "params.max_count: Input should be greater than"),
    ("sentence_length", {"target": 0}, "reward term 'sentence_length': params.target: Input should be greater"),
    ("sentence_length", {"length": 5}, "reward term 'sentence_length': params.length: Extra inputs"),
    ("keyword_count", {}, "reward term 'keyword_count': params: words: name at least one word to count"),
    ("regex_count", {}, "reward term 'regex_count': params: pattern: give the regular expression to count"),
])
def test_bad_parameters_are_one_line_user_errors(name: str, params: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        Reward({name: {"fn": name, "params": params}})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("name", "params", "message"), [
    ("keyword_count", {"words": [" "]}, "keyword_count needs non-empty words, got [' ']"),
    ("regex_count", {"pattern": ""}, "regex_count needs a pattern"),
])
def test_the_scorers_refuse_what_they_cannot_count(name: str, params: dict, message: str) -> None:
    # serve-reward and eval build a scorer from the registry's parameters, without a reward's validation
    with pytest.raises(UserError, match=message.replace("[", "\\[")):
        get_term(name).scorer(term_params(name, params))
