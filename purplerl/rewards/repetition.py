"""Repeated-n-gram ratio: a degeneracy signal subtracted from the reward.

RL against a toxicity classifier quickly finds that repeating one slur maximizes the score; the
penalty on repeated n-grams keeps the attack diverse (the red-team trainer's repetition penalty).
"""

from __future__ import annotations

from purplerl.errors import UserError


def _words(text: str) -> list[str]:
    """Lowercased whitespace-split words with non-alphanumeric characters stripped from both edges.

    Inner punctuation stays ("don't", "e.g"); a token that is all punctuation ("--", "...") is dropped.
    """
    words = []
    for raw in text.lower().split():
        start, end = 0, len(raw)
        while start < end and not raw[start].isalnum():
            start += 1
        while end > start and not raw[end - 1].isalnum():
            end -= 1
        if start < end:
            words.append(raw[start:end])
    return words


def repetition_ratio(text: str, n: int = 3) -> float:
    """Share of the text's word n-grams that repeat an earlier one: 1 - #unique / #total.

    Worked example, n = 3: "A b c, a b c!" -> words [a, b, c, a, b, c] -> n-grams (a b c), (b c a),
    (c a b), (a b c): 4 in all, 3 unique -> 1 - 3/4 = 0.25. A text with fewer than n words has no
    n-grams and scores 0.0; the score approaches 1 as one phrase is repeated forever.
    """
    if n < 1:
        raise UserError(f"repetition n-gram size must be >= 1, got {n}")
    words = _words(text)
    if len(words) < n:
        return 0.0
    ngrams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(ngrams)) / len(ngrams)


class RepetitionScorer:
    """`repetition_ratio` of each text as a Scorer (prompts are ignored)."""

    name = "repetition"

    def __init__(self, n: int = 3) -> None:
        if n < 1:
            raise UserError(f"repetition n-gram size must be >= 1, got {n}")
        self.n = n

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return [repetition_ratio(text, self.n) for text in texts]
