"""Supervised fine-tuning steps through the engine seam: the `cross_entropy` loss on the assistant's tokens of
length-bucketed batches, and a held-out loss every `sft.eval_every` steps. Recipes (`purplerl sft`, `purplerl
align`) run it with `execute_run(config, run_dir, resume, prepare=sft_prepare)`.

Each step: B conversations of similar length -> TrainBatch (loss mask = assistant tokens) ->
forward_backward(cross_entropy) -> optim_step. The held-out loss is the mean NLL per assistant token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from purplerl.algorithms.registry import CrossEntropyParams, Loss
from purplerl.data.sft import (
    Conversation,
    Encoded,
    LengthBuckets,
    encode,
    held_out,
    load_conversations,
    pad_batch,
)
from purplerl.engines.base import Engine
from purplerl.errors import UserError
from purplerl.train.loop import EarlyStop, StepFn, adam_params, never_stop
from purplerl.train.recipe import Bind


def _encode_all(engine: Engine, conversations: list[Conversation], config: Any, what: str) -> list[Encoded]:
    d = config.data
    encoded = [encode(engine.tokenizer, c, d.template, d.system_prompt, config.sft.max_tokens) for c in conversations]
    kept = [e for e in encoded if e is not None]
    if not kept and conversations:
        raise UserError(f"no {what} conversation keeps an assistant token within sft.max_tokens="
                        f"{config.sft.max_tokens}")
    return kept


def heldout_loss(engine: Engine, examples: list[Encoded], pad_id: int, batch_size: int) -> float:
    """Mean NLL per assistant token of the held-out conversations under the current policy."""
    total, tokens = 0.0, 0.0
    for start in range(0, len(examples), batch_size):
        batch = pad_batch(examples[start:start + batch_size], pad_id)
        logp_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
        total += float(-(logp_NT * batch.loss_mask_NT).sum())
        tokens += float(batch.loss_mask_NT.sum())
    return total / tokens


def sft_prepare(config: Any) -> Bind:
    """Load (and check) the conversations before the engine loads; bind them to the engine's tokenizer."""
    s = config.sft
    conversations = load_conversations(config.data, s)
    if s.eval_split is not None:
        train, evaluation = conversations, load_conversations(config.data, s, s.eval_split)
    else:
        train, evaluation = held_out(conversations, s.eval_fraction, config.training.seed)
    evaluation = evaluation[: s.eval_limit]

    def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
        pad_id = int(engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None
                     else engine.tokenizer.eos_token_id)
        examples = _encode_all(engine, train, config, "training")
        held = _encode_all(engine, evaluation, config, "held-out")
        buckets = LengthBuckets([len(e.ids) for e in examples], config.training.batch_size, config.training.seed)
        loss = Loss("cross_entropy", CrossEntropyParams())

        def step_fn(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
            batch = pad_batch([examples[i] for i in buckets.batch(step - 1)], pad_id)
            metrics = {**engine.forward_backward(batch, loss), **engine.optim_step(adam_params(config.training))}
            out = {f"train/{k}": float(v) for k, v in metrics.items()}
            out.update({"tokens/padded": float(batch.input_ids_NT.numel()), "tokens/trained": float(
                batch.loss_mask_NT.sum()), "data/skipped_too_long": float(len(train) - len(examples))})
            if held and s.eval_every and (step % s.eval_every == 0 or step == config.training.steps):
                out["eval/loss"] = heldout_loss(engine, held, pad_id, config.training.batch_size)
            return out, []

        return step_fn, never_stop

    return bind
