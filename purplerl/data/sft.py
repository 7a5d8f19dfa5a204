"""Supervised fine-tuning data: conversations, their tokens with a mask on the assistant's tokens, and
length-bucketed batches.

A row is either chat `messages` whose last turn is the assistant's (every assistant turn is trained on), or a
`prompt` (text or messages) with a `completion`. Rendering uses the chat template (or plain text for
`template: base`) and marks exactly the characters each assistant turn adds, via the tokenizer's offsets: the
loss never sees the prompt, the system message or the user's turns.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from purplerl.config import SFTConfig, SFTDataConfig
from purplerl.data.gist import first_keys, gist_token_id, insert_gists
from purplerl.data.sources import read_rows
from purplerl.data.stream import stream_rows
from purplerl.errors import UserError
from purplerl.files import unicode_problem
from purplerl.prompting import with_system_prompt
from purplerl.types import TrainBatch

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Conversation:
    messages: tuple[dict[str, str], ...]  # chat turns; the last one is the assistant's
    uid: str  # stable id: the row's own id, or a hash of its text


@dataclass(frozen=True)
class Encoded:
    ids: tuple[int, ...]  # the rendered conversation's tokens
    mask: tuple[float, ...]  # 1.0 on tokens of assistant turns (targets), else 0.0
    uid: str
    answer_from: int = 0  # the column where the last assistant turn starts
    # with gist tokens (purplerl.data.gist): the column where each gist block starts, and each token's first key
    gist_blocks: tuple[int, ...] = ()
    first_key: tuple[int, ...] | None = None


def chat_messages(value: Any, where: str) -> tuple[dict[str, str], ...]:
    """Chat messages checked to be {role: system|user|assistant, content: text}; a text is one user message."""
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: expected chat messages (a non-empty list of {{role, content}}) or a text")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise UserError(f"{where}: message {i} must be {{role: system|user|assistant, content: text}}")
        problem = unicode_problem(m["content"])
        if problem:
            raise UserError(f"{where}: message {i} {problem}")
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


def to_conversation(row: dict[str, Any], index: int, sft: SFTConfig, where: str) -> Conversation:
    here = f"{where} row {index + 1}"
    if sft.messages_field in row:
        messages = chat_messages(row[sft.messages_field], here)
    elif sft.prompt_field in row and sft.completion_field in row:
        completion = row[sft.completion_field]
        if not isinstance(completion, str) or not completion.strip():
            raise UserError(f"{here}: '{sft.completion_field}' must be a non-empty text")
        messages = (*chat_messages(row[sft.prompt_field], here), {"role": "assistant", "content": completion})
    else:
        raise UserError(f"{here} has neither '{sft.messages_field}' nor '{sft.prompt_field}' + "
                        f"'{sft.completion_field}' (fields: {', '.join(sorted(row)) or 'none'})")
    if messages[-1]["role"] != "assistant":
        raise UserError(f"{here}: the last message must be the assistant's (it is what SFT trains on)")
    uid = row.get("uid") or row.get("id")
    if not isinstance(uid, str | int) or isinstance(uid, bool):
        uid = hashlib.sha256(repr(messages).encode()).hexdigest()[:12]
    return Conversation(messages, str(uid))


def load_conversations(data: SFTDataConfig, sft: SFTConfig, split: str | None = None) -> list[Conversation]:
    rows, where = read_rows(data, split)
    conversations = [to_conversation(row, i, sft, where) for i, row in enumerate(rows)]
    return conversations[: data.limit] if data.limit is not None else conversations


def stream_conversations(data: SFTDataConfig, sft: SFTConfig, split: str | None = None) -> Iterator[Conversation]:
    """`load_conversations` one at a time, read lazily (`data.streaming`, purplerl.data.stream)."""
    for i, row in enumerate(stream_rows(data, split)):
        yield to_conversation(row, i, sft, data.source)


def is_held_out(uid: str, fraction: float, seed: int) -> bool:
    """Whether a streamed conversation is held out: a seeded hash of its uid below `fraction`. A stream is not held
    whole, so its share is drawn one conversation at a time (about `fraction` of them, the same on every pass)."""
    digest = hashlib.sha256(f"{seed}:{uid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def held_out(conversations: list[Conversation], fraction: float, seed: int) -> tuple[list[Conversation],
                                                                                       list[Conversation]]:
    """(train, eval): a seeded `fraction` of the conversations held out, at least one of each when possible."""
    if fraction <= 0:
        return conversations, []
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    count = min(max(1, round(fraction * len(order))), len(order) - 1)
    held = set(order[:count])
    return ([c for i, c in enumerate(conversations) if i not in held],
            [c for i, c in enumerate(conversations) if i in held])


def _chat_text(tokenizer, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)


def _spans(tokenizer, messages: list[dict[str, str]], template: str) -> tuple[str, list[tuple[int, int]]]:
    """The full text, and the character spans of the assistant turns' own text."""
    if template == "base":
        # as prompting renders a base prompt ("turn\n\nturn\n"), then the answer and the end-of-text token
        text, spans, pending = "", [], []
        for m in messages:
            if m["role"] != "assistant":
                pending.append(m["content"])
                continue
            text += "\n\n".join(pending) + "\n"
            pending = []
            start = len(text)
            text += m["content"] + (tokenizer.eos_token or "")
            spans.append((start, len(text)))
            text += "\n\n"
        return text.removesuffix("\n\n"), spans
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"tokenizer '{tokenizer.name_or_path}' has no chat template; set data.template: base")
    full = _chat_text(tokenizer, messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, through = _chat_text(tokenizer, messages[:i], True), _chat_text(tokenizer, messages[:i + 1], False)
        if not (through.startswith(before) and full.startswith(through)):
            raise UserError(f"the chat template of '{tokenizer.name_or_path}' does not render turns as a prefix of "
                            "the conversation, so the assistant's tokens cannot be located; use data.template: base")
        spans.append((len(before), len(through)))
    return full, spans


def encode(tokenizer, conversation: Conversation, template: str, system_prompt: str | None,
           max_tokens: int, gist_tokens: int = 0) -> Encoded | None:
    """Tokens and assistant mask of one conversation, cut to max_tokens (None when nothing trainable is left). With
    `gist_tokens` K > 0, K gist tokens follow each earlier assistant turn, and each token's first key says what it
    may attend (purplerl.data.gist)."""
    messages = with_system_prompt(conversation.messages, system_prompt)
    text, spans = _spans(tokenizer, messages, template)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    bos = tokenizer.bos_token_id
    mask = [1.0 if any(s <= start and end <= e and end > start for s, e in spans) else 0.0 for start, end in offsets]
    if template == "base" and bos is not None and tokenizer(text, add_special_tokens=True)["input_ids"][:1] == [bos]:
        ids, mask = [bos, *ids], [0.0, *mask]
    shift = len(ids) - len(offsets)  # the base template's bos
    columns = [sum(1 for _, end in offsets if end <= span_end) + shift for _, span_end in spans]
    answer_from = sum(1 for _, end in offsets if end <= spans[-1][0]) + shift
    blocks: list[int] = []
    if gist_tokens:
        ids, mask, blocks = insert_gists(ids, mask, columns[:-1], gist_tokens, gist_token_id(tokenizer))
        answer_from += gist_tokens * len(blocks)
    ids, mask = ids[:max_tokens], mask[:max_tokens]
    if not any(mask[1:]):  # position 0 is never a target
        return None
    blocks = [b for b in blocks if b + gist_tokens <= len(ids)]
    first_key = tuple(first_keys(len(ids), blocks, gist_tokens)) if gist_tokens else None
    return Encoded(tuple(ids), tuple(mask), conversation.uid, min(answer_from, len(ids)), tuple(blocks), first_key)


def pad_batch(examples: list[Encoded], pad_id: int) -> TrainBatch:
    """Right-padded ids, attention and loss mask [N, T] of encoded sequences."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.float32)
    gist = any(e.first_key is not None for e in examples)
    first_key = torch.zeros((len(examples), width), dtype=torch.long) if gist else None
    for i, e in enumerate(examples):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attn[i, :len(e.ids)] = 1
        mask[i, 1:len(e.ids)] = torch.tensor(e.mask[1:])  # targets: position 0 is never predicted
        if first_key is not None and e.first_key is not None:  # padding attends from 0: it is never read
            first_key[i, :len(e.ids)] = torch.tensor(e.first_key)
    return TrainBatch(ids, attn, mask, first_key_NT=first_key)


class LengthBuckets:
    """Batches of similar length, so a batch pads little: the batch of step k is a pure function of
    (lengths, batch size, seed, k), so a resumed run trains on exactly the batches it would have.

    Each epoch shuffles the examples (seeded by (seed, epoch)), sorts windows of `window` batches by length,
    cuts them into batches and shuffles the batches' order."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, window: int = 16) -> None:
        if not lengths:
            raise UserError("no training examples")
        self.lengths, self.batch_size, self.seed, self.window = list(lengths), batch_size, seed, window
        self.per_epoch = max(1, len(self.lengths) // batch_size)
        self._epochs: dict[int, list[list[int]]] = {}

    def _epoch(self, epoch: int) -> list[list[int]]:
        if epoch not in self._epochs:
            rng = random.Random(self.seed * 1_000_003 + epoch)
            order = list(range(len(self.lengths)))
            rng.shuffle(order)
            size = self.batch_size * self.window
            batches = []
            for start in range(0, len(order), size):
                chunk = sorted(order[start:start + size], key=lambda i: self.lengths[i])
                batches += [chunk[j:j + self.batch_size] for j in range(0, len(chunk), self.batch_size)]
            batches = [b for b in batches if len(b) == self.batch_size] or batches[:1]  # no ragged tail batch
            rng.shuffle(batches)
            self._epochs = {epoch: batches}  # one epoch cached: steps run in order
        return self._epochs[epoch]

    def batch(self, index: int) -> list[int]:
        batches = self._epoch(index // self.per_epoch)
        return batches[index % self.per_epoch % len(batches)]
