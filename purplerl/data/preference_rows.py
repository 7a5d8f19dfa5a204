"""One row of preference data -> a PreferencePair or a LabelledCompletion, in the shapes public sets use.

Pairs (`chosen` and `rejected`, both text or both chat messages):

- text answers with a `prompt` (text, chat messages, or an HH transcript "\\n\\nHuman: ...\\n\\nAssistant:");
- full dialogues without a `prompt`, as in Anthropic HH-RLHF: "\\n\\nHuman: ...\\n\\nAssistant: ...". The text
  up to the last "\\n\\nAssistant:" is the prompt (every earlier turn of a multi-turn dialogue), the rest the
  answer; both sides must hold the same prompt, or they do not answer one request;
- message lists, as in binarized UltraFeedback: the last message is the assistant's answer and the earlier
  ones the prompt (both sides the same); when the lists hold only the answer (TRL's conversational format),
  the prompt comes from `prompt`. UltraFeedback's `score_chosen` / `score_rejected` are kept.

Unpaired (KTO, TRL's unpaired preference format): `prompt`, `completion` (text, or messages ending with the
assistant's answer) and `label`, a boolean: true for a desirable completion.

Every problem is one UserError naming the row (`where`: FILE:LINE, or SOURCE row INDEX).
"""

from __future__ import annotations

import math
import re
from typing import Any

from purplerl.data.sft import chat_messages
from purplerl.errors import UserError
from purplerl.files import unicode_problem
from purplerl.types import LabelledCompletion, PreferencePair

Messages = tuple[dict[str, str], ...]
ANSWER_MARK = "\n\nAssistant:"
# A turn of an HH-RLHF transcript starts a line pair "\n\n" (or the text) with the speaker's name and a colon.
_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def pair_from_row(row: dict[str, Any], where: str) -> PreferencePair:
    """The preference pair held by `row` (any shape in the module docstring)."""
    chosen, rejected = _field(row, "chosen", where), _field(row, "rejected", where)
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(value, str | list):
            raise UserError(f"{where}: '{name}' must be a text or a list of chat messages, got "
                            f"{type(value).__name__}")
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise UserError(f"{where}: 'chosen' and 'rejected' must both be texts or both chat messages")
    if isinstance(chosen, list):
        prompt, chosen, rejected = _from_message_lists(row, chosen, rejected, where)
    elif "prompt" in row:
        prompt = prompt_messages(row["prompt"], where)
    else:
        prompt, chosen, rejected = _from_dialogues(chosen, rejected, where)
    chosen, rejected = _answer(chosen, "chosen", where), _answer(rejected, "rejected", where)
    if chosen == rejected:
        raise UserError(f"{where}: 'chosen' and 'rejected' are the same answer, so neither is preferred")
    return PreferencePair(prompt, chosen, rejected, where, _score(row, "score_chosen", where),
                          _score(row, "score_rejected", where))


def labelled_from_row(row: dict[str, Any], where: str) -> LabelledCompletion:
    """The unpaired (KTO) example held by `row`: `prompt`, `completion`, boolean `label`."""
    prompt = prompt_messages(_field(row, "prompt", where), where)
    completion = _field(row, "completion", where)
    if isinstance(completion, list):
        messages = _ending_with_answer(completion, "completion", where)
        prompt = _ends_with_user((*prompt, *messages[:-1]), where)
        completion = messages[-1]["content"]
    elif not isinstance(completion, str):
        raise UserError(f"{where}: 'completion' must be a text or a list of chat messages, got "
                        f"{type(completion).__name__}")
    label = _field(row, "label", where)
    if not isinstance(label, bool):
        raise UserError(f"{where}: 'label' must be true (desirable) or false, got {type(label).__name__} "
                        f"{str(label)[:40]!r}")
    return LabelledCompletion(prompt, _answer(completion, "completion", where), label, where)


def prompt_messages(value: Any, where: str) -> Messages:
    """A prompt as chat messages ending with the user's turn: from a text, an HH transcript ending in
    "Assistant:", or chat messages."""
    if isinstance(value, str):
        _text(value, "prompt", where)
        stripped = value.strip()
        if stripped.startswith("Human:") and stripped.endswith("Assistant:"):
            return hh_turns(stripped.removesuffix("Assistant:"), "prompt", where)
        return ({"role": "user", "content": value},)
    if not isinstance(value, list):
        raise UserError(f"{where}: 'prompt' must be a text or a list of chat messages, got {type(value).__name__}")
    return _ends_with_user(chat_messages(value, f"{where}: 'prompt'"), where)


def hh_turns(transcript: str, name: str, where: str) -> Messages:
    """The turns of an HH-RLHF transcript ("\\n\\nHuman: ...\\n\\nAssistant: ...") as chat messages, each
    turn's text stripped; it must open with a Human turn and end with one."""
    parts = _HH_TURN.split(transcript.lstrip())
    if parts[0].strip() or len(parts) < 3 or parts[1] != "Human":
        raise UserError(f"{where}: '{name}' must start with a 'Human:' turn (HH-RLHF dialogue), got "
                        f"{transcript[:40]!r}")
    turns = tuple({"role": _HH_ROLES[role], "content": text.strip()} for role, text in zip(parts[1::2], parts[2::2],
                                                                                            strict=True))
    return _ends_with_user(turns, where, f"'{name}' before its last 'Assistant:' turn")


def _from_dialogues(chosen: str, rejected: str, where: str) -> tuple[Messages, str, str]:
    """HH-RLHF: (shared prompt, chosen answer, rejected answer) of two full dialogues."""
    (chosen_prompt, chosen_answer), (rejected_prompt, rejected_answer) = (
        _split_dialogue(text, name, where) for name, text in (("chosen", chosen), ("rejected", rejected)))
    if chosen_prompt != rejected_prompt:
        raise UserError(f"{where}: the 'chosen' and 'rejected' dialogues differ before their last 'Assistant:' "
                        f"turn ({_first_difference(chosen_prompt, rejected_prompt)}), so they answer different "
                        "prompts")
    return chosen_prompt, chosen_answer, rejected_answer


def _split_dialogue(text: str, name: str, where: str) -> tuple[Messages, str]:
    cut = text.rfind(ANSWER_MARK)
    if cut < 0:
        raise UserError(f"{where}: no 'prompt' field, and '{name}' is not an HH-RLHF dialogue "
                        "(no '\\n\\nAssistant:' turn)")
    answer = text[cut + len(ANSWER_MARK):]
    if _HH_TURN.search(answer):
        raise UserError(f"{where}: '{name}' ends with a 'Human:' turn, not the assistant's answer")
    return hh_turns(text[:cut], name, where), answer


def _from_message_lists(row: dict[str, Any], chosen: list, rejected: list, where: str) -> tuple[Messages, str, str]:
    """UltraFeedback: (shared prompt, chosen answer, rejected answer) of two message lists."""
    chosen_messages = _ending_with_answer(chosen, "chosen", where)
    rejected_messages = _ending_with_answer(rejected, "rejected", where)
    prompt = chosen_messages[:-1]
    if prompt != rejected_messages[:-1]:
        raise UserError(f"{where}: the 'chosen' and 'rejected' messages differ before their last (assistant) "
                        f"message ({_first_difference(prompt, rejected_messages[:-1])}), so they answer "
                        "different prompts")
    if prompt:
        prompt = _ends_with_user(prompt, where, "the messages before the answer")
    elif "prompt" in row:
        prompt = prompt_messages(row["prompt"], where)
    else:
        raise UserError(f"{where}: no 'prompt' field, and 'chosen' holds only the answer")
    return prompt, chosen_messages[-1]["content"], rejected_messages[-1]["content"]


def _ending_with_answer(value: list, name: str, where: str) -> Messages:
    messages = chat_messages(value, f"{where}: '{name}'")
    if messages[-1]["role"] != "assistant":
        raise UserError(f"{where}: the last message of '{name}' must be the assistant's answer, got role "
                        f"'{messages[-1]['role']}'")
    return messages


def _ends_with_user(messages: Messages, where: str, what: str = "the prompt") -> Messages:
    if messages[-1]["role"] != "user":
        raise UserError(f"{where}: {what} must end with the user's turn, got role '{messages[-1]['role']}'")
    if not messages[-1]["content"].strip():
        raise UserError(f"{where}: {what} ends with an empty user turn")
    return messages


def _first_difference(a: Messages, b: Messages) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"turn {i + 1}: {x['content'][:30]!r} vs {y['content'][:30]!r}"
    return f"{len(a)} vs {len(b)} turns"


def _field(row: dict[str, Any], name: str, where: str) -> Any:
    if name not in row:
        raise UserError(f"{where}: no '{name}' field (fields: {', '.join(sorted(row)) or 'none'})")
    if row[name] is None:
        raise UserError(f"{where}: '{name}' is null")
    return row[name]


def _text(value: str, name: str, where: str) -> None:
    if not value.strip():
        raise UserError(f"{where}: '{name}' is empty")
    problem = unicode_problem(value)
    if problem:
        raise UserError(f"{where}: '{name}' {problem}")


def _answer(value: str, name: str, where: str) -> str:
    """An answer, stripped: HH-RLHF writes "Assistant: text", and a stray space is no part of the answer."""
    _text(value, name, where)
    return value.strip()


def _score(row: dict[str, Any], name: str, where: str) -> float | None:
    value = row.get(name)
    if value is None:
        return None
    # bool is an int subclass, but a True score means a wrong column
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"{where}: '{name}' must be a finite number, got {type(value).__name__} {str(value)[:40]!r}")
    return float(value)
