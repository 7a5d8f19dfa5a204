"""Preference training through the engine seam (`purplerl prefs`): DPO (sigmoid, cDPO, hinge, IPO), SimPO, KTO and
ORPO, each a registered `consumes="sequences"` loss (purplerl.algorithms.preference), with the SFT recipe's run dir,
checkpoints, resume and report.

Each step: B pairs (2B rows: chosen, rejected) -> TrainBatch -> forward_backward(loss) -> optim_step; for KTO, B
labelled answers plus B KL rows (a prompt with another example's answer: KTO's reference point, Ethayarajh et al.
2024). Batches are length-bucketed and a pure function of (data, seed, step), so a resumed run trains on the same
batches. With `data.packing` their 2B sequences are laid end to end in rows (purplerl.data.packing), and the engine
hands the loss each sequence's logprobs as if unpacked. Held-out pairs are scored every `prefs.eval_every` steps with
the same loss function.

The reference is the frozen base with adapters off (a DPO from an SFT model starts from that model merged, e.g.
`purplerl export --merge`). It scores every training and held-out sequence once, before the first step, and the
values are kept with the run (reference_logprobs.safetensors, keyed by the model and every token): a resumed run
reads them back instead of scoring the data again. SimPO and ORPO need no reference and skip it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from purplerl.algorithms.registry import LOSS_REGISTRY, Loss
from purplerl.data.packing import pack_batch
from purplerl.data.preference import (
    EncodedPair,
    encode_answer,
    encode_pairs,
    end_of_turn_id,
    held_out_by_prompt,
    load_labelled,
    load_pairs,
    pair_batch,
    unpaired,
)
from purplerl.data.sft import Encoded, LengthBuckets, pad_batch
from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError, UserError
from purplerl.files import write_durably
from purplerl.train.loop import adam_params
from purplerl.train.recipe import Bind
from purplerl.train.steps import EarlyStop, StepFn, never_stop
from purplerl.types import LabelledCompletion, PreferencePair, TrainBatch

REFERENCE_FILE = "reference_logprobs.safetensors"
SCORE_CHUNK = 32  # sequences per reference/eval pass (the engine micro-batches within it)


@dataclass(frozen=True)
class Labelled:
    """One KTO example: the answer and its KL row (the same prompt with another example's answer)."""

    answer: Encoded
    kl: Encoded
    desirable: bool


Example = EncodedPair | Labelled


def _sequences(examples: Sequence[Example]) -> list[Encoded]:
    return [s for e in examples for s in ((e.chosen, e.rejected) if isinstance(e, EncodedPair) else (e.answer, e.kl))]


def examples_batch(examples: Sequence[Example], pad_id: int) -> TrainBatch:
    """Example i as rows (2i, 2i + 1), the order of `_sequences`: a pair's chosen and rejected answers (pairs_P2),
    or a labelled answer (kto_labels_N 1 or 0) and its KL row (-1)."""
    if isinstance(examples[0], EncodedPair):
        return pair_batch(examples, pad_id)
    batch = pad_batch(_sequences(examples), pad_id)
    labels = [label for e in examples for label in (int(e.desirable), -1)]
    return dataclasses.replace(batch, kto_labels_N=torch.tensor(labels, dtype=torch.long))


def with_reference(batch: TrainBatch, values: Sequence[torch.Tensor]) -> TrainBatch:
    """The batch with ref_logprobs_NT: each row's reference logprobs placed on its loss tokens."""
    ref_NT = torch.zeros_like(batch.loss_mask_NT, dtype=torch.float32)
    for row, value in enumerate(values):
        ref_NT[row, batch.loss_mask_NT[row] != 0] = value
    return dataclasses.replace(batch, ref_logprobs_NT=ref_NT)


def reference_key(config: Any, sequences: Sequence[Encoded]) -> str:
    """What the reference values depend on: the base model (name, revision, dtype) and every sequence's tokens."""
    m = config.model
    digest = hashlib.sha256(json.dumps([m.name, m.revision, m.dtype]).encode())
    for s in sequences:
        digest.update(json.dumps([s.ids, s.mask]).encode())
    return digest.hexdigest()


def score_reference(engine: Engine, sequences: Sequence[Encoded], pad_id: int) -> list[torch.Tensor]:
    """The reference's logprob of each sequence's loss tokens, in order."""
    values: list[torch.Tensor] = []
    for start in range(0, len(sequences), SCORE_CHUNK):
        batch = pad_batch(list(sequences[start:start + SCORE_CHUNK]), pad_id)
        logp_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                                  targets_NT=batch.loss_mask_NT).float().cpu()
        values += [logp_NT[row, batch.loss_mask_NT[row] != 0] for row in range(logp_NT.shape[0])]
    if any(not bool(torch.isfinite(v).all()) for v in values):
        raise ExperimentError("the reference model gave a non-finite logprob on the preference data")
    return values


def read_reference(path: Path, key: str) -> list[torch.Tensor] | None:
    """The values a run kept, or None when there are none for this key (another model or data: scored again)."""
    if not path.is_file():
        return None
    try:
        tensors = load_safetensors(path.read_bytes())
    except SafetensorError:
        return None  # damaged (it is written atomically, so by hand): scoring again is exact
    if tensors.get("key") is None or bytes(tensors["key"].tolist()).decode() != key:
        return None
    return list(torch.split(tensors["values"], tensors["counts"].tolist()))


def write_reference(path: Path, key: str, values: Sequence[torch.Tensor]) -> None:
    counts = torch.tensor([len(v) for v in values], dtype=torch.long)
    flat = torch.cat(list(values)) if values else torch.zeros(0)
    write_durably(path, save_safetensors({"values": flat.contiguous(), "counts": counts,
                                          "key": torch.tensor(list(key.encode()), dtype=torch.uint8)}))


def loss_of(config: Any) -> Loss:
    """The registered loss and its parameters from the `prefs` section."""
    p = config.prefs
    loss_def = LOSS_REGISTRY[p.loss]
    given = {"beta": p.beta, "loss_type": p.dpo_form, "label_smoothing": p.label_smoothing, "gamma": p.gamma,
             "sft_weight": p.sft_weight,
             "desirable_weight": p.desirable_weight, "undesirable_weight": p.undesirable_weight}
    names = {f.name for f in dataclasses.fields(loss_def.params)}
    return Loss(p.loss, loss_def.params(**{k: v for k, v in given.items() if k in names and v is not None}))


def load_items(config: Any, split: str | None = None) -> list[PreferencePair] | list[LabelledCompletion]:
    """The pairs, or KTO's labelled answers (rows in KTO's shape, or pairs unpaired)."""
    if config.data.source is None:
        raise UserError("--data names the preference data: a .jsonl/.json/.parquet file, a prepared dir or "
                        "'hf:ORG/NAME' (pairs: prompt/chosen/rejected; KTO: prompt/completion/label)")
    kto = config.prefs.loss == "kto"
    loaded = (load_labelled if kto and config.prefs.unpaired else load_pairs)(config.data, split,
                                                                              config.data.skip_bad_rows)
    if loaded.skipped:
        print(f"{loaded.where}: left out {len(loaded.skipped)} bad rows, the first: {loaded.skipped[0]}",
              file=sys.stderr)
    items = list(loaded.items)
    return unpaired(items) if kto and not config.prefs.unpaired else items


def check_both_labels(items: Sequence[LabelledCompletion], source: str) -> None:
    """KTO weighs desirable against undesirable answers: data holding one label trained silently on one side,
    logging the other as 0. One line unless prefs.one_label says that is meant."""
    desirable = sum(item.desirable for item in items)
    if desirable in (0, len(items)):
        side = "desirable" if desirable else "undesirable"
        raise UserError(f"{source}: all {len(items)} KTO training examples are {side}: KTO trains on both labels; "
                        "add the other label's rows, or set prefs.one_label true to train one side")


def _partners(n: int, seed: int) -> list[int]:
    """A seeded derangement: example i's KL row borrows the answer of example partners[i] != i."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    partner = [0] * n
    for position, i in enumerate(order):
        partner[i] = order[(position + 1) % n]
    return partner


def encode_items(engine: Engine, items: Sequence[Any], config: Any, seed: int) -> tuple[list[Example], dict]:
    d, tokenizer = config.data, engine.tokenizer
    max_answer = config.data.max_answer_tokens
    if not items or isinstance(items[0], PreferencePair):
        return encode_pairs(tokenizer, items, d.template, d.system_prompt, d.max_prompt_tokens, max_answer)
    if len(items) < 2:
        raise UserError("kto needs at least 2 examples: a KL row pairs a prompt with another example's answer")
    end_id = end_of_turn_id(tokenizer, d.template)

    def answer(prompt_of: LabelledCompletion, text: str, uid: str) -> Encoded:
        return encode_answer(tokenizer, prompt_of.prompt, text, uid, d.template, d.system_prompt,
                             d.max_prompt_tokens, max_answer, end_id)

    partners = _partners(len(items), seed)
    examples = [Labelled(answer(item, item.completion, item.source_row),
                         answer(item, items[partners[i]].completion, f"{item.source_row} kl"), item.desirable)
                for i, item in enumerate(items)]
    return examples, {"data/examples": float(len(examples)),
                      "data/desirable": float(sum(e.desirable for e in examples))}


def heldout_metrics(engine: Engine, examples: Sequence[Example], reference: Sequence[torch.Tensor] | None,
                    loss: Loss, pad_id: int) -> dict[str, float]:
    """The loss and its metrics on the held-out examples under the current policy, averaged over examples."""
    per_row = 2  # sequences per example, pairs and KTO alike
    totals: dict[str, float] = {}
    for start in range(0, len(examples), SCORE_CHUNK // per_row):
        chunk = examples[start:start + SCORE_CHUNK // per_row]
        batch = examples_batch(chunk, pad_id)
        if reference is not None:
            batch = with_reference(batch, reference[start * per_row:(start + len(chunk)) * per_row])
        logp_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, targets_NT=batch.loss_mask_NT)
        value, metrics = LOSS_REGISTRY[loss.name].fn(logp_NT.float().cpu(), batch.inputs(), loss.params)
        for key, v in {"loss": float(value), **metrics}.items():
            totals[key] = totals.get(key, 0.0) + float(v) * len(chunk)
    return {f"eval/{k}": v / len(examples) for k, v in totals.items()}


def prefs_prepare(config: Any) -> Bind:
    """Load (and check) the preference data and the loss before the engine loads; bind them to its tokenizer."""
    p, seed = config.prefs, config.training.seed
    loss = loss_of(config)
    needs_reference = "ref_logprobs_NT" in LOSS_REGISTRY[p.loss].inputs
    items = load_items(config)
    if p.eval_split is not None:
        train, held = items, load_items(config, p.eval_split)
    else:
        train, held = held_out_by_prompt(items, p.eval_fraction, seed)
    held = held[: p.eval_limit]
    if not train:
        raise UserError(f"no training examples left in {config.data.source} after holding out "
                        f"prefs.eval_fraction={p.eval_fraction}")
    if p.loss == "kto" and not p.one_label:
        check_both_labels(train, config.data.source)

    def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
        tok = engine.tokenizer
        pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        examples, data_metrics = encode_items(engine, train, config, seed)
        kto_pairs_ok = len(held) >= 2 or (held and isinstance(held[0], PreferencePair))
        held_examples = encode_items(engine, held, config, seed + 1)[0] if kto_pairs_ok else []
        reference, pending = None, None
        if needs_reference:
            sequences = _sequences(examples) + _sequences(held_examples)
            key = reference_key(config, sequences)
            reference = read_reference(run_dir / REFERENCE_FILE, key)
            if reference is None:
                print(f"scoring {len(sequences)} sequences with the reference model (once per run)", file=sys.stderr)
                reference = score_reference(engine, sequences, pad_id)
                pending = key
        split = 2 * len(examples)
        train_ref, held_ref = (reference[:split], reference[split:]) if reference is not None else (None, None)
        lengths = [max(len(s.ids) for s in _sequences([e])) for e in examples]
        buckets = LengthBuckets(lengths, config.training.batch_size, seed)

        def step_fn(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
            nonlocal pending
            if pending is not None and engine.world.is_writer:  # the run dir exists from the first step on
                write_reference(run_dir / REFERENCE_FILE, pending, reference)
                pending = None
            rows = buckets.batch(step - 1)
            batch = examples_batch([examples[i] for i in rows], pad_id)
            if train_ref is not None:
                batch = with_reference(batch, [v for i in rows for v in train_ref[2 * i:2 * i + 2]])
            if config.data.packing:  # rows of the longest sequence the data settings allow
                batch = pack_batch(batch, config.data.max_prompt_tokens + config.data.max_answer_tokens, pad_id)
            metrics = {**engine.forward_backward(batch, loss), **engine.optim_step(adam_params(config.training))}
            out = {f"train/{k}": float(v) for k, v in metrics.items()}
            out.update({"tokens/trained": float(batch.loss_mask_NT.sum()), **data_metrics})
            if held_examples and p.eval_every and (step % p.eval_every == 0 or step == config.training.steps):
                out.update(heldout_metrics(engine, held_examples, held_ref, loss, pad_id))
            return out, []

        return step_fn, never_stop

    return bind
