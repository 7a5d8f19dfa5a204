"""Step-labelled answers for process reward models: rows, tokens, batches, and a sampled answer cut into steps.

Rows take TRL's stepwise-supervision layout: `prompt` (a text or chat messages, read as preference rows read it),
`completions` (the answer's steps in order, each a non-blank text) and `labels` (one boolean per step: true where the
step is correct). `load_step_rows` reads them from any row source (purplerl.data.sources: a .jsonl/.json/.parquet
file, a prepared dir, 'hf:ORG/NAME'); each problem is one UserError naming the row.

`encode_steps` makes the tokens a PRM reads: the prompt as the policy sees it when sampling
(purplerl.data.preference.encode_prompt), then each step with the separator appended, each tokenized on its own as
TRL's PRMTrainer does, so that a step's last token is its separator's last. Training and scoring encode alike: a
sampled answer is cut at every separator (`split_steps`) and each piece is a step. Steps that end past
max_answer_tokens are not read: training leaves them out (their label is about tokens the model never saw), and so
does scoring, except that an answer whose first step is already too long is read at its last token that fits, so
every answer gets a score. A step of the data that holds the separator itself is one step when training, but would
be cut in two when scored: choose a separator the steps do not contain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from purplerl.data.preference import Loaded, encode_prompt, load_parsed
from purplerl.data.preference_rows import prompt_messages
from purplerl.errors import ExperimentError, UserError
from purplerl.files import unicode_problem
from purplerl.prompting import Template
from purplerl.types import StepLabelledCompletion, TrainBatch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from purplerl.config import RowSourceConfig


@dataclass(frozen=True)
class EncodedSteps:
    """One answer's tokens and where its steps end."""

    ids: tuple[int, ...]  # the prompt's tokens, then each step's with its separator's, cut to max_answer_tokens
    ends: tuple[int, ...]  # position in `ids` of the last token of each step that fits whole, in order
    steps: int  # the answer's steps, those cut off included
    prompt_cut: bool  # the prompt was longer than max_prompt_tokens and lost its start
    labels: tuple[bool, ...] | None = None  # training: the label of each step in `ends`; None for an answer to score

    @property
    def read_at(self) -> tuple[int, ...]:
        """The positions a scorer reads: each whole step's last token, or, when not even the first step fits, the
        last token there is."""
        return self.ends or (len(self.ids) - 1,)


# ------------------------------------------------------------------------------------------------- rows


def steps_from_row(row: dict[str, Any], where: str) -> StepLabelledCompletion:
    """The step-labelled answer held by `row`: `prompt`, `completions` (the steps), `labels` (a boolean per step)."""
    prompt, steps, labels = (_field(row, name, where) for name in ("prompt", "completions", "labels"))
    if not isinstance(steps, list | tuple) or not steps:
        raise UserError(f"{where}: 'completions' must be a non-empty list of steps (texts), got "
                        f"{type(steps).__name__} {str(steps)[:40]!r}")
    for i, step in enumerate(steps):
        if not isinstance(step, str):
            raise UserError(f"{where}: 'completions'[{i}] must be a text, got {type(step).__name__}")
        if not step.strip():
            raise UserError(f"{where}: 'completions'[{i}] is an empty step")
        problem = unicode_problem(step)
        if problem:
            raise UserError(f"{where}: 'completions'[{i}] {problem}")
    if not isinstance(labels, list | tuple):
        raise UserError(f"{where}: 'labels' must be a list of booleans, one per step, got {type(labels).__name__}")
    if len(labels) != len(steps):
        raise UserError(f"{where}: {len(steps)} steps in 'completions' but {len(labels)} 'labels': give one label "
                        "per step")
    for i, label in enumerate(labels):
        if not isinstance(label, bool):  # 1 and "true" are refused: a label column of another meaning
            raise UserError(f"{where}: 'labels'[{i}] must be true (a correct step) or false, got "
                            f"{type(label).__name__} {repr(label)[:40]}")
    return StepLabelledCompletion(prompt_messages(prompt, where), tuple(steps), tuple(labels), where)


def _field(row: dict[str, Any], name: str, where: str) -> Any:
    if row.get(name) is None:
        missing = "is null" if name in row else f"is missing (fields: {', '.join(sorted(row)) or 'none'})"
        raise UserError(f"{where}: '{name}' {missing}")
    return row[name]


def load_step_rows(data: RowSourceConfig, split: str | None = None,
                   skip_bad_rows: bool = False) -> Loaded[StepLabelledCompletion]:
    """The step-labelled answers of `data.source`'s split (`None`: data.split)."""
    return load_parsed(data, split, skip_bad_rows, steps_from_row)


def split_steps(text: str, separator: str) -> list[str]:
    """A sampled answer's steps: its text cut at every separator, blank pieces (after a trailing separator) left
    out; an answer without a non-blank piece is one step, its text."""
    if not separator:
        raise ValueError("the step separator must not be empty")
    return [piece for piece in text.split(separator) if piece.strip()] or [text]


# ------------------------------------------------------------------------------------------------ tokens


@dataclass(frozen=True)
class StepFormat:
    """How an answer's steps become tokens: the prompt format, the limits and the separator (a run's settings)."""

    template: Template
    system_prompt: str | None
    max_prompt_tokens: int
    max_answer_tokens: int
    separator: str


def encode_steps(tokenizer: PreTrainedTokenizerBase, prompt: tuple[dict[str, str], ...], steps: Sequence[str],
                 uid: str, fmt: StepFormat) -> EncodedSteps:
    """An answer's steps after its prompt, each step with the separator appended and tokenized on its own; the
    answer cut to fmt.max_answer_tokens."""
    if fmt.max_answer_tokens < 1 or not fmt.separator or not steps:
        raise ValueError(f"{uid}: need max_answer_tokens >= 1, a separator and a step")
    prompt_ids, prompt_cut = encode_prompt(tokenizer, prompt, uid, fmt.template, fmt.system_prompt,
                                           fmt.max_prompt_tokens)
    answer: list[int] = []
    ends: list[int] = []
    for step in steps:
        piece = tokenizer.encode(step + fmt.separator, add_special_tokens=False)
        room = fmt.max_answer_tokens - len(answer)
        answer += piece[:room]
        if len(piece) > room:
            break
        ends.append(len(prompt_ids) + len(answer) - 1)
    return EncodedSteps(tuple(prompt_ids + answer), tuple(ends), len(steps), prompt_cut)


def encode_labelled(tokenizer: PreTrainedTokenizerBase, rows: Sequence[StepLabelledCompletion],
                    fmt: StepFormat) -> tuple[list[EncodedSteps], dict[str, float]]:
    """Each row's tokens with the labels of its steps that fit, and how much was cut to fit (metrics); a row
    without one whole step is a UserError naming it."""
    out = []
    for row in rows:
        encoded = encode_steps(tokenizer, row.prompt, row.steps, row.source_row, fmt)
        if not encoded.ends:
            raise UserError(f"{row.source_row}: its first step, with the separator, is longer than "
                            f"data.max_answer_tokens={fmt.max_answer_tokens} tokens, which leaves no step to learn "
                            "from: raise data.max_answer_tokens or leave the row out")
        out.append(EncodedSteps(encoded.ids, encoded.ends, encoded.steps, encoded.prompt_cut,
                                row.labels[:len(encoded.ends)]))
    kept = sum(len(e.ends) for e in out)
    metrics = {"data/answers": float(len(out)), "data/steps": float(kept),
               "data/steps_truncated": float(sum(e.steps for e in out) - kept),
               "data/prompts_truncated": float(sum(e.prompt_cut for e in out)),
               "data/label_rate": sum(sum(e.labels) for e in out) / kept if kept else 0.0}
    return out, metrics


def step_batch(encoded: Sequence[EncodedSteps], pad_id: int) -> TrainBatch:
    """Right-padded answers as a TrainBatch whose loss mask is 1 at each position a scorer reads (`read_at`), with
    step_labels_NT holding each step's label there when every answer has its labels."""
    if not encoded:
        raise ExperimentError("no answers to build a batch from")
    labelled = all(e.labels is not None for e in encoded)  # a training batch (encode_labelled: each has a step)
    width = max(len(e.ids) for e in encoded)
    ids_NT = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    attention_NT = torch.zeros((len(encoded), width), dtype=torch.long)
    mask_NT = torch.zeros((len(encoded), width), dtype=torch.float32)
    labels_NT = torch.zeros((len(encoded), width), dtype=torch.float32)
    for i, e in enumerate(encoded):
        ids_NT[i, :len(e.ids)] = torch.tensor(e.ids)
        attention_NT[i, :len(e.ids)] = 1
        at = torch.tensor(e.read_at)
        mask_NT[i, at] = 1.0
        if labelled:
            labels_NT[i, at] = torch.tensor(e.labels, dtype=torch.float32)
    return TrainBatch(ids_NT, attention_NT, mask_NT, step_labels_NT=labels_NT if labelled else None)
