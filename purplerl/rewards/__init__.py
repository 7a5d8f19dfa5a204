"""Reward terms behind one registry (purplerl.rewards.registry), their scorers behind one protocol, and their
composition into the training reward (purplerl.rewards.compose.Reward).

Importing the package registers the built-in terms (purplerl.rewards.terms) and the model judges
(purplerl.rewards.judges, purplerl.rewards.compliance); no model loads until a term is built.
"""

from purplerl.rewards import compliance as _compliance  # noqa: F401 -- registers the compliance judge
from purplerl.rewards import counting as _counting  # noqa: F401 -- registers keyword_count, regex_count, sentence_length
from purplerl.rewards import degenerate as _degenerate  # noqa: F401 -- registers degenerate
from purplerl.rewards import ground_truth as _ground_truth  # noqa: F401 -- registers ground_truth
from purplerl.rewards import judges as _judges  # noqa: F401 -- registers harm_classifier, guard, strongreject
from purplerl.rewards import terms as _terms  # noqa: F401 -- registers the built-in terms
from purplerl.rewards.base import ConversationScorer, Scorer, checked_scores
from purplerl.rewards.compose import Reward
from purplerl.rewards.composite import RAW_KEY, combine
from purplerl.rewards.conversation import conversation_judge, conversation_scorer
from purplerl.rewards.named import TermSpec
from purplerl.rewards.registry import (
    REWARD_TERMS,
    Needs,
    RewardTerm,
    ScoringInput,
    TermOutput,
    get_term,
    register_term,
    term_params,
    text_term,
)
from purplerl.rewards.repetition import RepetitionScorer, repetition_ratio
from purplerl.rewards.toxicity import (
    EmbeddedToxicityScorer,
    HFClassifierScorer,
    make_toxicity_scorer,
    resolve_label,
)

__all__ = [
    "RAW_KEY",
    "REWARD_TERMS",
    "ConversationScorer",
    "EmbeddedToxicityScorer",
    "HFClassifierScorer",
    "Needs",
    "RepetitionScorer",
    "Reward",
    "RewardTerm",
    "Scorer",
    "ScoringInput",
    "TermOutput",
    "TermSpec",
    "checked_scores",
    "combine",
    "conversation_judge",
    "conversation_scorer",
    "get_term",
    "make_toxicity_scorer",
    "register_term",
    "repetition_ratio",
    "resolve_label",
    "term_params",
    "text_term",
]
