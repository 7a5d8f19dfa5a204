"""Rule-based text terms that count things in the response: keyword and regex counts, and the share of sentences
of a target length (small-rl's toy rewards, where a policy learns to say "happy" or to write 5-word sentences).

Each is a pure function of one text, wrapped as a Scorer and registered as a "text" term, so training, eval,
`serve-reward` and veRL all compute it the same way. A named reward binds their parameters
(purplerl.rewards.named: `sentence_length_5: {fn: sentence_length, params: {target: 5}}`).

- keyword_count: whole-word (by default), case-insensitive occurrences of any of `words`, optionally capped at
  `max_count`. small-rl counted the substring "happy" (so "unhappy" scored); a whole word is what a reader means.
- regex_count: non-overlapping matches of `pattern` (Python `re`), optionally capped.
- sentence_length: the share of the response's sentences (split at . ! ?) whose word count is within `tolerance`
  of `target`. small-rl counted SimpleStories tokenizer tokens between delimiter ids; words keep the term
  independent of the tokenizer, so the same reward means the same thing in veRL and in eval.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from purplerl.config.base import Section
from purplerl.errors import UserError
from purplerl.rewards.registry import register_term, text_term

_SENTENCE_END = re.compile(r"[.!?]+")
_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")  # "don't" is one word; "--" and "..." are none


def capped(count: int, max_count: int | None) -> float:
    return float(count if max_count is None else min(count, max_count))


def keyword_pattern(words: list[str], whole_word: bool = True, case_sensitive: bool = False) -> re.Pattern[str]:
    """One pattern matching any of `words` (each literal; longest first so "happy days" wins over "happy")."""
    if not words or any(not w.strip() for w in words):
        raise UserError(f"keyword_count needs non-empty words, got {words!r}")
    body = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    body = rf"(?<!\w)(?:{body})(?!\w)" if whole_word else f"(?:{body})"
    return re.compile(body, 0 if case_sensitive else re.IGNORECASE)


def count_matches(pattern: re.Pattern[str], text: str, max_count: int | None = None) -> float:
    """Non-overlapping matches of `pattern` in `text`, capped at `max_count` (None: no cap).

    Worked example, words [happy], whole words, any case: "Happy days, happy! unhappy" -> 2 ("unhappy" is
    another word); with max_count 1 -> 1.0 (small-rl's happy_binary)."""
    return capped(sum(1 for _ in pattern.finditer(text)), max_count)


def sentence_lengths(text: str) -> list[int]:
    """Word counts of the text's sentences (split at runs of . ! ?); a piece without words is no sentence."""
    return [n for part in _SENTENCE_END.split(text) if (n := len(_WORD.findall(part)))]


def sentence_length_share(text: str, target: int, tolerance: int = 0) -> float:
    """Share of sentences with |words - target| <= tolerance; 0.0 for a text without sentences.

    Worked example, target 5: "The cat sat on mats. It is red! Go home now, little dog" -> lengths 5, 3, 5 ->
    2/3; with tolerance 2 -> 3/3 = 1.0."""
    lengths = sentence_lengths(text)
    if not lengths:
        return 0.0
    return sum(abs(n - target) <= tolerance for n in lengths) / len(lengths)


class KeywordCountParams(Section):
    words: list[str] = Field(default_factory=list, description="the words (or phrases) counted, e.g. [happy, joy]")
    whole_word: bool = Field(True, description="count only whole words ('unhappy' is not 'happy')")
    case_sensitive: bool = Field(False, description="match case exactly")
    max_count: int | None = Field(None, ge=1, description="cap the count here (1: 1.0 when any word is present)")

    def incomplete(self) -> str | None:
        return None if self.words else "words: name at least one word to count"


class RegexCountParams(Section):
    pattern: str = Field("", description="a Python regular expression; its non-overlapping matches are counted")
    ignore_case: bool = Field(False, description="match without regard to case")
    max_count: int | None = Field(None, ge=1, description="cap the count here (1: 1.0 when the pattern matches)")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"not a regular expression ({err})") from None
        return pattern

    def incomplete(self) -> str | None:
        return None if self.pattern else "pattern: give the regular expression to count"


class SentenceLengthParams(Section):
    target: int = Field(10, ge=1, description="the sentence length rewarded, in words")
    tolerance: int = Field(0, ge=0, description="a sentence counts when its length is within this many words of target")


class CountScorer:
    """Matches of one compiled pattern in each text, as a Scorer (prompts are ignored)."""

    def __init__(self, name: str, pattern: re.Pattern[str], max_count: int | None) -> None:
        self.name, self.pattern, self.max_count = name, pattern, max_count

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return [count_matches(self.pattern, text, self.max_count) for text in texts]


class SentenceLengthScorer:
    name = "sentence_length"

    def __init__(self, params: SentenceLengthParams) -> None:
        self.params = params

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return [sentence_length_share(t, self.params.target, self.params.tolerance) for t in texts]


def keyword_scorer(p: KeywordCountParams) -> CountScorer:
    return CountScorer("keyword_count", keyword_pattern(p.words, p.whole_word, p.case_sensitive), p.max_count)


def regex_scorer(p: RegexCountParams) -> CountScorer:
    if not p.pattern:
        raise UserError("regex_count needs a pattern (params: {pattern: REGEX})")
    return CountScorer("regex_count", re.compile(p.pattern, re.IGNORECASE if p.ignore_case else 0), p.max_count)


register_term(text_term(
    "keyword_count", "occurrences of any of the given words in the response (whole words, any case; capped at "
    "max_count)", KeywordCountParams, keyword_scorer))
register_term(text_term(
    "regex_count", "non-overlapping matches of a regular expression in the response (capped at max_count)",
    RegexCountParams, regex_scorer))
register_term(text_term(
    "sentence_length", "share of the response's sentences whose word count is within tolerance of target",
    SentenceLengthParams, SentenceLengthScorer))
