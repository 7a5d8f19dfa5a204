import pytest

from purplerl.errors import UserError
from purplerl.rewards.base import Scorer
from purplerl.rewards.repetition import RepetitionScorer, repetition_ratio


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        # trigrams abc, bca, cab, abc: 4 in all, 3 unique -> 1 - 3/4
        ("a b c a b c", 3, 0.25),
        ("A b c, a b c!", 3, 0.25),  # case and edge punctuation do not matter
        ("the cat sat", 3, 0.0),  # one trigram
        ("hello world", 3, 0.0),  # fewer than n words: no n-grams
        ("", 3, 0.0),
        ("go go go go go", 1, 0.8),  # 5 unigrams, 1 unique
        ("go go go go go", 2, 0.75),  # 4 bigrams, 1 unique
        ("spam spam spam spam", 3, 0.5),  # 2 trigrams, 1 unique
        ("a -- b ... a b", 2, 1 - 2 / 3),  # punctuation-only tokens dropped: ab, ba, ab
        ("Don't stop. don't STOP", 2, 1 - 2 / 3),  # inner apostrophe kept: don't stop, stop don't, don't stop
        ("one two three four", 2, 0.0),
    ],
)
def test_repetition_ratio_by_hand(text: str, n: int, expected: float) -> None:
    assert repetition_ratio(text, n) == pytest.approx(expected)


def test_bad_n() -> None:
    with pytest.raises(UserError, match="must be >= 1"):
        repetition_ratio("a b", 0)
    with pytest.raises(UserError, match="must be >= 1"):
        RepetitionScorer(0)


def test_scorer() -> None:
    scorer = RepetitionScorer(n=2)
    assert isinstance(scorer, Scorer) and scorer.name == "repetition"
    assert scorer.score(["go go go go go", "one two three"], prompts=["p", "q"]) == pytest.approx([0.75, 0.0])
    assert scorer.score([]) == []
