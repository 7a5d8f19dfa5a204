"""Dialogues as the judges read them (the ConversationScorer protocol, purplerl.rewards.base).

A conversation is a list of turns {"role": "user" | "assistant", "content": text} that ends with the assistant
turn being judged. Every conversation judge checks its input with `check_conversations` first, so a malformed
dialogue stops with one line naming its index rather than a template error or a made-up score.

`conversation_scorer` makes any plain Scorer judge dialogues: the last assistant turn is its text and the turns
before it are its prompt, a single user turn as it is (so a one-turn dialogue scores what `score(text, prompt)`
scores) and longer histories as a transcript ("User: ...", "Agent: ...": Llama Guard's names for the two sides,
Inan et al. 2023).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.base import ConversationScorer, Scorer, checked_values
from purplerl.rewards.registry import READS, get_term, term_params, text_terms

Turn = dict[str, str]
ROLES = ("user", "assistant")
SPEAKERS = {"user": "User", "assistant": "Agent"}


def conversation_problem(conversation: Any) -> str | None:
    """Why `conversation` is not a dialogue a judge can score, or None."""
    if not isinstance(conversation, list) or not conversation:
        return "is empty" if isinstance(conversation, list) else f"is a {type(conversation).__name__}, not a list"
    for j, turn in enumerate(conversation):
        if not isinstance(turn, Mapping):
            return f"turn {j} is a {type(turn).__name__}, not a {{role, content}} mapping"
        if turn.get("role") not in ROLES:
            return f"turn {j} has role {turn.get('role')!r}, not one of {', '.join(ROLES)}"
        if not isinstance(turn.get("content"), str):
            return f"turn {j} has no text content"
    if conversation[-1]["role"] != "assistant":
        return "ends with a user turn, not the assistant turn to judge"
    return None


def check_conversations(conversations: Sequence[Any], who: str) -> None:
    """ExperimentError naming `who` and the first malformed conversation's index (the dialogues come from the
    run: one the judge cannot read means the run that built it went wrong)."""
    for i, conversation in enumerate(conversations):
        problem = conversation_problem(conversation)
        if problem is not None:
            raise ExperimentError(f"{who}: conversation {i} {problem}")


def transcript(turns: Sequence[Turn]) -> str:
    """The turns as plain text, one "Speaker: content" per turn."""
    return "\n".join(f"{SPEAKERS[turn['role']]}: {turn['content']}" for turn in turns)


def split_last_turn(conversation: Sequence[Turn]) -> tuple[str, str]:
    """(prompt, text): the turns before the last one as a prompt, and the last (assistant) turn's content. A lone
    user turn is the prompt as it is; any other history is its transcript ('' when there is none)."""
    earlier = conversation[:-1]
    if len(earlier) == 1 and earlier[0]["role"] == "user":
        return earlier[0]["content"], conversation[-1]["content"]
    return transcript(earlier), conversation[-1]["content"]


class LastTurnScorer:
    """A plain Scorer judging dialogues: its score of the last assistant turn, given the turns before it as the
    prompt (`split_last_turn`). Each value must be a probability: a score outside [0, 1] stops the run."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self.name = scorer.name

    def score_conversations(self, conversations: list[list[Turn]]) -> list[float]:
        check_conversations(conversations, f"scorer '{self.name}'")
        pairs = [split_last_turn(conversation) for conversation in conversations]
        values = checked_values(self.scorer, [text for _, text in pairs], [prompt for prompt, _ in pairs])
        for i, value in enumerate(values):
            if not 0.0 <= value <= 1.0:
                raise ExperimentError(f"scorer '{self.name}' gave {value:g} for conversation {i}: a conversation "
                                      f"judge gives P(unsafe) in [0, 1], and this scorer's values are not one")
        return values


def conversation_scorer(scorer: Scorer | ConversationScorer) -> ConversationScorer:
    """`scorer` itself when it judges whole dialogues (the guard judge, the harm classifier), else a
    LastTurnScorer over it."""
    if isinstance(scorer, ConversationScorer):
        return scorer
    if not isinstance(scorer, Scorer):
        raise UserError(f"{type(scorer).__name__} is not a scorer (it has no name and score(texts, prompts))")
    return LastTurnScorer(scorer)


def conversation_judge(term: str, params: Mapping[str, Any] | None = None) -> ConversationScorer:
    """The registered text reward term `term`, built with `params`, as a conversation judge; a term that reads
    more than the dialogue's text (entropies, KL, ground truth) is refused."""
    registered = get_term(term)
    if registered.scorer is None:
        raise UserError(f"reward term '{term}' reads {READS[registered.needs]}, not a dialogue's text: it cannot "
                        f"judge conversations (text terms: {', '.join(text_terms())})")
    return conversation_scorer(registered.scorer(term_params(term, params)))
