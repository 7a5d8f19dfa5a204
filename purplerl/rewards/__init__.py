"""Reward scorers behind one protocol, and their composition into the training reward."""

from purplerl.rewards.base import Scorer, checked_scores
from purplerl.rewards.composite import RAW_KEY, combine
from purplerl.rewards.repetition import RepetitionScorer, repetition_ratio
from purplerl.rewards.toxicity import (
    EmbeddedToxicityScorer,
    HFClassifierScorer,
    make_toxicity_scorer,
    resolve_label,
)

__all__ = [
    "RAW_KEY",
    "EmbeddedToxicityScorer",
    "HFClassifierScorer",
    "RepetitionScorer",
    "Scorer",
    "checked_scores",
    "combine",
    "make_toxicity_scorer",
    "repetition_ratio",
    "resolve_label",
]
