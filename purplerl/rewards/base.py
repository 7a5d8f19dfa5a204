"""The scorer protocol every reward source implements, and the boundary check on what it returns."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from purplerl.errors import ExperimentError

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Scorer(Protocol):
    """Maps N response texts to N floats (higher = more of what the scorer measures). A scorer that cannot score
    without the prompts says so with a class attribute `needs_prompts = True` (the reward server then answers a
    request without them with 422 instead of a failed scoring call)."""

    name: str  # short name used in metrics and errors, e.g. "toxicity"

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        """One score per text. `prompts` (same length, or None) are the prompts the texts answer; scorers
        that judge the response alone accept and ignore them."""
        ...


@runtime_checkable
class ConversationScorer(Protocol):
    """Judges whole dialogues: for each, P(unsafe) in [0, 1] of its last assistant turn, read in the context of every
    turn before it (a multi-turn attack can spread a request over several harmless-looking user turns)."""

    name: str

    def score_conversations(self, conversations: list[list[dict[str, str]]]) -> list[float]:
        """One probability per conversation; each is a list of {"role": "user" | "assistant", "content": ...}
        ending with an assistant turn."""
        ...


def checked_scores(scorer: Scorer, texts: list[str], prompts: list[str] | None = None) -> torch.Tensor:
    """Call `scorer.score` and return float32 [N], raising ExperimentError on a wrong count or NaN/inf."""
    import torch  # when scoring, not when the term registry is read (--help)

    return torch.tensor(checked_values(scorer, texts, prompts), dtype=torch.float32)


def checked_values(scorer: Scorer, texts: list[str], prompts: list[str] | None = None) -> list[float]:
    """`checked_scores` as full-precision Python floats (what the reward server sends)."""
    if prompts is not None and len(prompts) != len(texts):
        raise ExperimentError(f"scorer '{scorer.name}' was given {len(prompts)} prompts for {len(texts)} texts")
    scores = list(scorer.score(texts, prompts))
    if len(scores) != len(texts):
        raise ExperimentError(f"scorer '{scorer.name}' returned {len(scores)} scores for {len(texts)} texts")
    for i, value in enumerate(scores):
        if not math.isfinite(float(value)):
            raise ExperimentError(f"scorer '{scorer.name}' returned {value} for text {i}: {texts[i][:80]!r}")
    return [float(v) for v in scores]
