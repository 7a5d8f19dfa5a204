"""Reward-model training through the engine seam: K ensemble members, each a named LoRA adapter with a scalar head
over the one frozen base, trained on preference pairs with the Bradley-Terry loss (`bradley_terry`, a "values"
loss); held-out pair accuracy and reward margin every `reward_model.eval_every` steps and at the last step.

Each step, for each member k: its batch of B pairs (its own seeded, length-bucketed order: members differ by seed,
in their LoRA and head init and in their data order; Lakshminarayanan et al. 2017's deep ensembles, as Coste et al.
2023 train theirs) -> TrainBatch of 2B rows (chosen, rejected) -> forward_backward(bradley_terry) -> optim_step.
Every batch is a pure function of (data, seed, member, step), so a resumed run trains on exactly the batches it
would have. The trained run is the `reward_model` reward term's input (purplerl.runs.reward_model).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.pairwise import BradleyTerryParams
from purplerl.algorithms.registry import Loss
from purplerl.algorithms.reward_model import ensemble_pair_metrics
from purplerl.data.preference import EncodedPair, encode_pairs, held_out_by_prompt, load_pairs, pair_batch
from purplerl.data.sft import LengthBuckets
from purplerl.engines.base import Engine, ScalarHeads
from purplerl.errors import UserError
from purplerl.runs.reward_model import member_scores
from purplerl.train.loop import adam_params, mean_metrics
from purplerl.train.recipe import Bind
from purplerl.train.steps import EarlyStop, StepFn, never_stop
from purplerl.types import PreferencePair


def member_names(ensemble: int) -> list[str]:
    return [f"member{k}" for k in range(ensemble)]


def member_seed(seed: int, member: int) -> int:
    """Member k's data-order seed; member 0 keeps the run's (a one-member run orders its data as the seed says)."""
    return seed if member == 0 else (seed * 1_000_003 + 7_919 * member) % (2**63 - 1)


def pair_margins(pairs: list[PreferencePair]) -> torch.Tensor:
    """margins_P: score_chosen - score_rejected of each pair; UserError naming a pair without both scores."""
    for pair in pairs:
        if pair.score_chosen is None or pair.score_rejected is None:
            raise UserError(f"{pair.source_row}: reward_model.margin reads each pair's score_chosen and "
                            "score_rejected, and this row lacks them")
    return torch.tensor([p.score_chosen - p.score_rejected for p in pairs], dtype=torch.float32)


def heldout_metrics(engine: ScalarHeads, members: list[str], pairs: list[EncodedPair], pad_id: int,
                    batch_size: int) -> dict[str, float]:
    """eval/*: the ensemble's accuracy, margin and loss on the held-out pairs (algorithms.reward_model)."""
    chunks = []
    for start in range(0, len(pairs), batch_size):
        batch = pair_batch(pairs[start:start + batch_size], pad_id)
        chunks.append(member_scores(engine, members, batch.input_ids_NT, batch.attention_mask_NT))
    scores_KN = torch.cat(chunks, dim=1)  # pair p's chosen answer in column 2p, its rejected one in 2p + 1
    metrics = ensemble_pair_metrics(scores_KN[:, 0::2], scores_KN[:, 1::2])
    if len(members) == 1:
        metrics = {k: v for k, v in metrics.items() if k not in ("member_accuracy", "std")}
    return {f"eval/{k}": v for k, v in metrics.items()}


def reward_model_prepare(config: Any) -> Bind:
    """Load and split the pairs before the engine loads; bind them to the engine's tokenizer and members."""
    d, rm, t = config.data, config.reward_model, config.training
    if not d.source:
        raise UserError("name the preference pairs: --data FILE (data.source)")
    loaded = load_pairs(d, skip_bad_rows=d.skip_bad_rows)
    if loaded.skipped:
        print(f"{loaded.where}: left out {len(loaded.skipped)} bad rows, the first: {loaded.skipped[0]}",
              file=sys.stderr)
    train, held = held_out_by_prompt(loaded.items, rm.eval_fraction, t.seed)
    if not train or (rm.eval_fraction > 0 and not held):
        raise UserError(f"holding out eval_fraction={rm.eval_fraction} of the {len(loaded.items)} pairs' prompts "
                        f"leaves {len(train)} to train on and {len(held)} to evaluate: change "
                        "reward_model.eval_fraction")
    margins = pair_margins(train) if rm.margin else None
    members = member_names(rm.ensemble)
    loss = Loss("bradley_terry", BradleyTerryParams(margin=rm.margin, center_coef=rm.center_coef))

    def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
        for name in members:
            if name not in engine.adapters:  # a resumed run's members came with its checkpoint
                engine.create_adapter(name, init=config.model.init_adapter, head=True)
        tokenizer = engine.tokenizer
        pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)

        def encoded(pairs: list[PreferencePair]) -> tuple[list[EncodedPair], dict[str, float]]:
            return encode_pairs(tokenizer, pairs, d.template, d.system_prompt, d.max_prompt_tokens,
                                d.max_answer_tokens)

        (examples, cuts), (held_out, _) = encoded(train), encoded(held)
        lengths = [max(len(p.chosen.ids), len(p.rejected.ids)) for p in examples]
        orders = [LengthBuckets(lengths, t.batch_size, member_seed(t.seed, k)) for k in range(len(members))]
        data_metrics = {**cuts, "data/held_out_pairs": float(len(held_out)),
                        "data/skipped_rows": float(len(loaded.skipped))}

        def step_fn(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
            rows = []
            for name, order in zip(members, orders, strict=True):
                picked = order.batch(step - 1)
                batch = pair_batch([examples[i] for i in picked], pad_id)
                if margins is not None:
                    batch = dataclasses.replace(batch, margins_P=margins[picked])
                engine.use_adapter(name)
                rows.append({**engine.forward_backward(batch, loss), **engine.optim_step(adam_params(t))})
            out = {**{f"train/{k}": v for k, v in mean_metrics(rows).items()}, **data_metrics}
            if held_out and (step == t.steps or (rm.eval_every and step % rm.eval_every == 0)):
                out.update(heldout_metrics(engine, members, held_out, pad_id, t.batch_size))
            return out, []

        return step_fn, never_stop

    return bind
