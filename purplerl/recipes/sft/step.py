"""Supervised fine-tuning steps through the engine seam: the `cross_entropy` loss on the assistant's tokens of
length-bucketed batches, and a held-out loss every `sft.eval_every` steps. Recipes (`purplerl sft`, `purplerl
align`) run it with `execute_run(config, run_dir, resume, prepare=sft_prepare)`.

Each step: B conversations of similar length -> TrainBatch (loss mask = assistant tokens; with `data.packing`, laid
end to end in rows of up to sft.max_tokens, purplerl.data.packing) -> forward_backward(cross_entropy) -> optim_step.
The held-out loss is the mean NLL per assistant token.

With `data.streaming` the conversations are read lazily (purplerl.data.stream): each step takes the next B of the
shuffled stream, this rank's share of them, in the stream's order rather than by length; the held-out ones are those
whose uid hashes below sft.eval_fraction (or the first sft.eval_limit of sft.eval_split), and the stream's position
is saved with each checkpoint, so a resumed run continues at the exact next conversation.
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from purplerl.algorithms.registry import CrossEntropyParams, Loss
from purplerl.data.packing import pack_batch
from purplerl.data.sft import (
    Conversation,
    Encoded,
    LengthBuckets,
    encode,
    held_out,
    is_held_out,
    load_conversations,
    pad_batch,
    stream_conversations,
)
from purplerl.data.stream import ExampleStream
from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError, UserError
from purplerl.train.loop import adam_params
from purplerl.train.recipe import Bind
from purplerl.train.steps import EarlyStop, StepFn, never_stop
from purplerl.types import TrainBatch

LOSS = Loss("cross_entropy", CrossEntropyParams())


def _encode_all(engine: Engine, conversations: list[Conversation], config: Any, what: str,
                gist_tokens: int | None = None) -> list[Encoded]:
    d = config.data
    gist_tokens = config.dialogue.gist_tokens if gist_tokens is None else gist_tokens
    encoded = [encode(engine.tokenizer, c, d.template, d.system_prompt, config.sft.max_tokens,
                      gist_tokens) for c in conversations]
    kept = [e for e in encoded if e is not None]
    if not kept and conversations:
        raise UserError(f"no {what} conversation keeps an assistant token within sft.max_tokens="
                        f"{config.sft.max_tokens}")
    return kept


def _answer_mask(batch: TrainBatch, examples: list[Encoded]) -> torch.Tensor:
    """The loss mask on each row's last assistant turn only."""
    columns_T = torch.arange(batch.loss_mask_NT.shape[1])
    starts_N1 = torch.tensor([e.answer_from for e in examples])[:, None]
    return batch.loss_mask_NT * (columns_T[None] >= starts_N1)


def heldout_metrics(engine: Engine, examples: list[Encoded], pad_id: int, batch_size: int,
                    suffix: str = "") -> dict[str, float]:
    """eval/loss: mean NLL per assistant token of the held-out conversations under the current policy;
    eval/answer_nll: the same over each one's last answer; eval/answer_keys: the keys an answer token attends, on
    average (gist rows: their last gist block and the answer's own turn, purplerl.data.gist)."""
    total = answer = tokens = answer_tokens = keys = 0.0
    for start in range(0, len(examples), batch_size):
        part = examples[start:start + batch_size]
        batch = pad_batch(part, pad_id)
        if batch.first_key_NT is None:
            logp_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
        else:
            logp_NT = engine.gist_logprobs(batch.input_ids_NT, batch.attention_mask_NT, batch.first_key_NT,
                                           targets_NT=batch.loss_mask_NT)
        answer_NT = _answer_mask(batch, part)
        total += float(-(logp_NT * batch.loss_mask_NT).sum())
        answer += float(-(logp_NT * answer_NT).sum())
        tokens, answer_tokens = tokens + float(batch.loss_mask_NT.sum()), answer_tokens + float(answer_NT.sum())
        first_NT = batch.first_key_NT if batch.first_key_NT is not None else torch.zeros_like(batch.input_ids_NT)
        # token t is scored from the query at t - 1, which attends keys first_key .. t - 1
        reach_NT = torch.arange(batch.input_ids_NT.shape[1])[None] - F.pad(first_NT, (1, 0))[:, :-1]
        keys += float((reach_NT * answer_NT).sum())
    return {f"eval/loss{suffix}": total / tokens, f"eval/answer_nll{suffix}": answer / max(answer_tokens, 1.0),
            f"eval/answer_keys{suffix}": keys / max(answer_tokens, 1.0)}


def _pad_id(engine: Engine) -> int:
    tokenizer = engine.tokenizer
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)


HeldOut = dict[str, list[Encoded]]  # metric suffix -> the held-out conversations, encoded for it


def held_encodings(engine: Engine, conversations: list[Conversation], config: Any) -> HeldOut:
    """The held-out conversations as the run reads them ("": its metrics), and with gist tokens read whole too
    ("_full_context": what the compression costs and saves, on the same conversations)."""
    held = {"": _encode_all(engine, conversations, config, "held-out")}
    if config.dialogue.gist_tokens:
        held["_full_context"] = _encode_all(engine, conversations, config, "held-out", gist_tokens=0)
    return held


def _train(engine: Engine, examples: list[Encoded], config: Any, held: HeldOut, step: int) -> dict[str, float]:
    """One step on `examples` (packed when data.packing), with the held-out loss when it is due."""
    pad_id = _pad_id(engine)
    batch: TrainBatch = pad_batch(examples, pad_id)
    if config.data.packing:
        batch = pack_batch(batch, config.sft.max_tokens, pad_id)
    metrics = {**engine.forward_backward(batch, LOSS), **engine.optim_step(adam_params(config.training))}
    out = {f"train/{k}": float(v) for k, v in metrics.items()}
    out.update({"tokens/padded": float(batch.input_ids_NT.numel()), "tokens/trained": float(batch.loss_mask_NT.sum())})
    s = config.sft
    if held.get("") and s.eval_every and (step % s.eval_every == 0 or step == config.training.steps):
        for suffix, examples in held.items():
            out.update(heldout_metrics(engine, examples, pad_id, config.training.batch_size, suffix))
    return out


class StreamedSteps:
    """The steps of a streamed run: a step function with the stream's position (purplerl.train.position)."""

    def __init__(self, engine: Engine, config: Any, stream: ExampleStream[Conversation], held: HeldOut) -> None:
        self.engine, self.config, self.stream, self.held = engine, config, stream, held

    def __call__(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        conversations = self.stream.take(self.config.training.batch_size)
        d, max_tokens = self.config.data, self.config.sft.max_tokens
        encoded = [encode(self.engine.tokenizer, c, d.template, d.system_prompt, max_tokens,
                          self.config.dialogue.gist_tokens) for c in conversations]
        examples = [e for e in encoded if e is not None]
        if not examples:
            raise ExperimentError(f"none of this step's {len(conversations)} conversations keeps an assistant token "
                                  f"within sft.max_tokens={max_tokens}")
        out = _train(self.engine, examples, self.config, self.held, step)
        out.update({"data/consumed": float(self.stream.consumed), "data/epoch": float(self.stream.epoch),
                    "data/step_skipped_too_long": float(len(conversations) - len(examples))})
        return out, []

    def position(self) -> dict[str, Any]:
        return self.stream.position()

    def seek(self, position: dict[str, Any]) -> None:
        self.stream.seek(position)


def _streamed_prepare(config: Any) -> Bind:
    """Check the stream yields a training conversation and collect the held-out ones before the engine loads."""
    d, s, seed = config.data, config.sft, config.training.seed
    fraction = 0.0 if s.eval_split is not None else s.eval_fraction

    def train_items():
        return (c for c in stream_conversations(d, s) if not is_held_out(c.uid, fraction, seed))

    if next(train_items(), None) is None:
        raise UserError(f"no training conversations in {d.source} (split '{d.split}')")
    held = (stream_conversations(d, s, s.eval_split) if s.eval_split is not None else
            (c for c in stream_conversations(d, s) if is_held_out(c.uid, fraction, seed)))
    evaluation = list(islice(held, s.eval_limit))

    def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
        stream = ExampleStream(train_items, d.shuffle_buffer, seed, f"{d.source} (split '{d.split}')",
                               engine.world.rank, engine.world.size)
        return StreamedSteps(engine, config, stream, held_encodings(engine, evaluation, config)), never_stop

    return bind


def sft_prepare(config: Any) -> Bind:
    """Load (and check) the conversations before the engine loads; bind them to the engine's tokenizer."""
    s = config.sft
    if config.data.streaming:
        return _streamed_prepare(config)
    conversations = load_conversations(config.data, s)
    if s.eval_split is not None:
        train, evaluation = conversations, load_conversations(config.data, s, s.eval_split)
    else:
        train, evaluation = held_out(conversations, s.eval_fraction, config.training.seed)
    evaluation = evaluation[: s.eval_limit]

    def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
        examples = _encode_all(engine, train, config, "training")
        held = held_encodings(engine, evaluation, config)
        buckets = LengthBuckets([len(e.ids) for e in examples], config.training.batch_size, config.training.seed)

        def step_fn(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
            out = _train(engine, [examples[i] for i in buckets.batch(step - 1)], config, held, step)
            out["data/skipped_too_long"] = float(len(train) - len(examples))
            return out, []

        return step_fn, never_stop

    return bind
