"""Preference data (DPO, IPO, SimPO, reward models; KTO's unpaired rows): loading, tokens, batches, splits.

`load_pairs` and `load_labelled` read any row source (purplerl.data.sources: a .jsonl/.json/.parquet file, a
prepared dir, 'hf:ORG/NAME' or a dataset saved to disk; `split`, `filters` and `limit` as for SFT) and parse
each row in the shapes of the common public sets (purplerl.data.preference_rows: text or chat pairs, HH-RLHF
dialogues, UltraFeedback message lists, KTO rows). A bad row is one UserError naming FILE:LINE (JSONL) or
SOURCE row INDEX; `skip_bad_rows` leaves such rows out instead and returns their messages, for public sets
that hold a few (HH-RLHF has pairs whose two answers are the same).

`encode_pairs` turns a pair into the tokens the policy is trained on, the way it samples: the prompt rendered
by purplerl.prompting.render_prompt (chat template with the generation prompt, or plain text) and cut from the
left to max_prompt_tokens; then the answer's own tokens and the token that ends an assistant turn, cut to
max_answer_tokens. The answer is encoded apart from the prompt, as TRL's DPO trainer does, so both answers of
a pair share the prompt's tokens exactly; the loss mask is 1 on the answer's tokens only. `pair_batch` stacks
P pairs into a TrainBatch of 2P rows, pair p's chosen answer in row 2p and its rejected one in row 2p + 1.

`held_out_by_prompt` decides each prompt's side by a seeded hash of the prompt alone, so both answers of a
pair, and every row repeating a prompt, land on the same side, and adding rows never moves a prompt across.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from purplerl.data.preference_rows import labelled_from_row, pair_from_row
from purplerl.data.sft import Encoded, pad_batch
from purplerl.data.sources import read_located_rows
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.prompting import Template, render_prompt, truncate_left
from purplerl.types import LabelledCompletion, PreferencePair, PromptRecord, StepLabelledCompletion, TrainBatch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from purplerl.config import RowSourceConfig

T = TypeVar("T", PreferencePair, LabelledCompletion, StepLabelledCompletion)
_PROBE = "PURPLERL_ANSWER_PROBE"  # an answer text no template writes itself


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """The examples of one source."""

    items: tuple[T, ...]  # in source order, at most `limit`
    where: str  # the source as messages name it
    skipped: tuple[str, ...] = ()  # with skip_bad_rows: the one-line problem of each row left out


@dataclass(frozen=True)
class EncodedPair:
    """One pair's two training sequences; both start with the same prompt tokens."""

    chosen: Encoded  # prompt + chosen answer tokens; mask 1.0 on the answer's tokens (end-of-turn included)
    rejected: Encoded  # prompt + rejected answer tokens, masked the same way
    prompt_cut: bool  # the prompt was longer than max_prompt_tokens and lost its start
    chosen_cut: bool  # the chosen answer (with its end token) was longer than max_answer_tokens and lost its end
    rejected_cut: bool  # the same for the rejected answer


# ------------------------------------------------------------------------------------------------ loading


def load_pairs(data: RowSourceConfig, split: str | None = None, skip_bad_rows: bool = False) -> Loaded[PreferencePair]:
    """The preference pairs of `data.source`'s split (`None`: data.split)."""
    return load_parsed(data, split, skip_bad_rows, pair_from_row)


def load_labelled(data: RowSourceConfig, split: str | None = None,
                  skip_bad_rows: bool = False) -> Loaded[LabelledCompletion]:
    """The unpaired (KTO) examples of `data.source`'s split: rows with `prompt`, `completion`, `label`."""
    return load_parsed(data, split, skip_bad_rows, labelled_from_row)


def load_parsed(data: RowSourceConfig, split: str | None, skip_bad_rows: bool,
                parse: Callable[[dict[str, Any], str], T]) -> Loaded[T]:
    """The examples `parse(row, where)` makes of the rows of `data.source`'s split, at most data.limit; with
    `skip_bad_rows` a row it refuses (UserError) is left out and its message kept."""
    rows, where = read_located_rows(data, split)
    items: list[T] = []
    skipped: list[str] = []
    for location, row in rows:
        try:
            items.append(parse(row, location))
        except UserError as err:
            if not skip_bad_rows:
                raise
            skipped.append(first_line(err))
    if not items:
        raise UserError(f"no usable rows in {where}: all {len(skipped)} are bad, the first: {skipped[0]}")
    if data.limit is not None:
        items = items[:data.limit]
    return Loaded(tuple(items), where, tuple(skipped))


def unpaired(pairs: Sequence[PreferencePair]) -> list[LabelledCompletion]:
    """Each pair as two KTO examples: the chosen answer desirable, the rejected one not (as TRL unpairs)."""
    return [LabelledCompletion(p.prompt, answer, desirable, p.source_row)
            for p in pairs for answer, desirable in ((p.chosen, True), (p.rejected, False))]


# ----------------------------------------------------------------------------------------------- encoding


def encode_pairs(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PreferencePair], template: Template,
                 system_prompt: str | None, max_prompt_tokens: int,
                 max_answer_tokens: int) -> tuple[list[EncodedPair], dict[str, float]]:
    """Each pair's two sequences, and how many prompts and answers were cut to fit (metrics)."""
    if max_answer_tokens < 1:
        raise ValueError(f"max_answer_tokens must be >= 1, got {max_answer_tokens}")
    end_id = end_of_turn_id(tokenizer, template)
    out = []
    for pair in pairs:
        prompt, prompt_cut = encode_prompt(tokenizer, pair.prompt, pair.source_row, template, system_prompt,
                                           max_prompt_tokens)
        chosen, chosen_cut = _answer_ids(tokenizer, pair.chosen, end_id, max_answer_tokens)
        rejected, rejected_cut = _answer_ids(tokenizer, pair.rejected, end_id, max_answer_tokens)
        if chosen == rejected:  # both cut to a shared beginning: the loss would prefer nothing and learn nothing
            raise UserError(f"{pair.source_row}: 'chosen' and 'rejected' are the same once cut to "
                            f"data.max_answer_tokens={max_answer_tokens} tokens, so neither is preferred: raise "
                            "data.max_answer_tokens or leave the pair out")
        out.append(EncodedPair(_sequence(prompt, chosen, f"{pair.source_row} chosen"),
                               _sequence(prompt, rejected, f"{pair.source_row} rejected"),
                               prompt_cut, chosen_cut, rejected_cut))
    metrics = {"data/pairs": float(len(out)),
               "data/prompts_truncated": float(sum(p.prompt_cut for p in out)),
               "data/chosen_truncated": float(sum(p.chosen_cut for p in out)),
               "data/rejected_truncated": float(sum(p.rejected_cut for p in out))}
    return out, metrics


def encode_answer(tokenizer: PreTrainedTokenizerBase, prompt: tuple[dict[str, str], ...], answer: str, uid: str,
                  template: Template, system_prompt: str | None, max_prompt_tokens: int,
                  max_answer_tokens: int, end_id: int | None = None) -> Encoded:
    """One answer to a prompt as `encode_pairs` encodes each side of a pair (a reward model scores it so);
    `end_id`: the template's end-of-turn token (end_of_turn_id), when the caller has it already."""
    if max_answer_tokens < 1:
        raise ValueError(f"max_answer_tokens must be >= 1, got {max_answer_tokens}")
    ids, _ = encode_prompt(tokenizer, prompt, uid, template, system_prompt, max_prompt_tokens)
    end_id = end_of_turn_id(tokenizer, template) if end_id is None else end_id
    answer_ids, _ = _answer_ids(tokenizer, answer, end_id, max_answer_tokens)
    return _sequence(ids, answer_ids, uid)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: tuple[dict[str, str], ...], uid: str,
                  template: Template, system_prompt: str | None, max_prompt_tokens: int) -> tuple[list[int], bool]:
    """The prompt's tokens as the policy sees them when sampling, cut from the left to max_prompt_tokens,
    and whether it was cut."""
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    full = render_prompt(tokenizer, PromptRecord(messages=prompt, uid=uid), template, system_prompt, sys.maxsize)
    ids = truncate_left(full, max_prompt_tokens, tokenizer.bos_token_id)
    return ids, len(ids) < len(full)


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase, template: Template) -> int:
    """The token that ends an assistant's answer: with a chat template, the special token the template writes
    right after an assistant message (ChatML's <|im_end|>, Llama 3's <|eot_id|>, Gemma's <end_of_turn>, which
    is not Gemma's EOS); else, or when the template writes none, the EOS token."""
    if template == "chat" and getattr(tokenizer, "chat_template", None):
        import jinja2  # deferred, as in purplerl.prompting

        probe = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": _PROBE}]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False)
        except jinja2.TemplateError as err:
            raise UserError(f"chat template of '{tokenizer.name_or_path}' cannot render an assistant answer: "
                            f"{first_line(err)}; use data.template: base") from err
        tail = text[text.rfind(_PROBE) + len(_PROBE):] if _PROBE in text else ""
        ids = tokenizer.encode(tail, add_special_tokens=False)
        if ids and ids[0] in tokenizer.all_special_ids:
            return int(ids[0])
    if tokenizer.eos_token_id is None:
        raise UserError(f"tokenizer '{tokenizer.name_or_path}' has no EOS token to end an answer with")
    return int(tokenizer.eos_token_id)


def _answer_ids(tokenizer: PreTrainedTokenizerBase, answer: str, end_id: int,
                max_answer_tokens: int) -> tuple[list[int], bool]:
    ids = [*tokenizer.encode(answer, add_special_tokens=False), end_id]
    return ids[:max_answer_tokens], len(ids) > max_answer_tokens


def _sequence(prompt: list[int], answer: list[int], uid: str) -> Encoded:
    return Encoded(tuple(prompt + answer), (0.0,) * len(prompt) + (1.0,) * len(answer), uid)


def pair_batch(encoded: Sequence[EncodedPair], pad_id: int) -> TrainBatch:
    """P pairs as a right-padded TrainBatch of 2P rows: pair p's chosen answer in row 2p, its rejected one in
    row 2p + 1, and pairs_P2[p] = (2p, 2p + 1)."""
    if not encoded:
        raise ExperimentError("no preference pairs to build a batch from")
    batch = pad_batch([side for pair in encoded for side in (pair.chosen, pair.rejected)], pad_id)
    return dataclasses.replace(batch, pairs_P2=torch.arange(2 * len(encoded), dtype=torch.long).view(-1, 2))


# ------------------------------------------------------------------------------------------------- splits


def prompt_key(prompt: tuple[dict[str, str], ...]) -> str:
    """The text a prompt is identified by: its turns' roles and stripped contents."""
    return json.dumps([[m["role"], m["content"].strip()] for m in prompt], ensure_ascii=False)


def held_out_by_prompt(items: Sequence[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """(train, held-out), each in input order. An item is held out when a `seed`ed hash of its prompt falls in
    the first `fraction` of the hash range: about `fraction` of the distinct prompts are held out (exactly, in
    expectation), and a prompt's side depends on nothing but the prompt and the seed."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    train: list[T] = []
    held: list[T] = []
    for item in items:
        (held if _unit_hash(prompt_key(item.prompt), seed) < fraction else train).append(item)
    return train, held


def _unit_hash(key: str, seed: int) -> float:
    digest = hashlib.sha256(f"{seed}\0{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def shuffled(items: Sequence[T], seed: int) -> list[T]:
    """The items in a `seed`ed random order (the same order for the same seed and items)."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return order
