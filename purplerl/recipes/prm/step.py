"""Process reward model training through the engine seam: one named LoRA adapter with a scalar head over the frozen
base, trained with binary cross-entropy on each step's label (`step_bce`, a "values" loss) at the step's last token
(its separator's last, as TRL's PRMTrainer labels it); held-out step accuracy, outcome accuracy and loss every
`prm.eval_every` steps and at the last step.

Each step: a batch of B answers (seeded, length-bucketed order) -> TrainBatch whose loss mask marks each step's last
token and whose step_labels_NT holds its label -> forward_backward(step_bce) -> optim_step. Every batch is a pure
function of (data, seed, step), so a resumed run trains on exactly the batches it would have. The trained run is
the `prm` reward term's input (purplerl.runs.process_reward).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.process_reward import outcome_accuracy, step_bce_loss
from purplerl.algorithms.registry import Loss
from purplerl.data.preference import held_out_by_prompt
from purplerl.data.sft import LengthBuckets
from purplerl.data.steps import EncodedSteps, StepFormat, encode_labelled, load_step_rows, step_batch
from purplerl.engines.base import Engine, ScalarHeads
from purplerl.errors import UserError
from purplerl.train.loop import adam_params
from purplerl.train.recipe import Bind
from purplerl.train.steps import EarlyStop, StepFn, never_stop

ADAPTER = "prm"  # the adapter (and head) a run trains and its checkpoints hold


def heldout_metrics(engine: ScalarHeads, answers: list[EncodedSteps], pad_id: int,
                    batch_size: int) -> dict[str, float]:
    """eval/*: step accuracy, outcome accuracy (every step right, algorithms.process_reward) and the step loss on
    the held-out answers, over all their steps at once."""
    values, labels, masks = [], [], []
    for start in range(0, len(answers), batch_size):
        batch = step_batch(answers[start:start + batch_size], pad_id)
        values_NT = engine.values(batch.input_ids_NT, batch.attention_mask_NT)
        for row in range(batch.num_sequences):  # rows of batches of other widths: concatenated by their steps
            at = batch.loss_mask_NT[row] != 0
            values.append(values_NT[row, at])
            labels.append(batch.step_labels_NT[row, at])
            masks.append(torch.ones(int(at.sum())))
    values_NS, labels_NS, mask_NS = (torch.nn.utils.rnn.pad_sequence(x, batch_first=True)
                                     for x in (values, labels, masks))
    loss, metrics = step_bce_loss(values_NS, labels_NS, mask_NS)
    return {"eval/loss": float(loss), "eval/step_accuracy": metrics["step_accuracy"],
            "eval/outcome_accuracy": outcome_accuracy(values_NS, labels_NS, mask_NS),
            "eval/step_prob": metrics["step_prob"]}


def prm_prepare(config: Any) -> Bind:
    """Load and split the step-labelled answers before the engine loads; bind them to the engine's tokenizer."""
    d, p, t = config.data, config.prm, config.training
    if not d.source:
        raise UserError("name the step-labelled answers: --data FILE (data.source)")
    loaded = load_step_rows(d, skip_bad_rows=d.skip_bad_rows)
    if loaded.skipped:
        print(f"{loaded.where}: left out {len(loaded.skipped)} bad rows, the first: {loaded.skipped[0]}",
              file=sys.stderr)
    train, held = held_out_by_prompt(loaded.items, p.eval_fraction, t.seed)
    if not train or (p.eval_fraction > 0 and not held):
        raise UserError(f"holding out eval_fraction={p.eval_fraction} of the {len(loaded.items)} answers' prompts "
                        f"leaves {len(train)} to train on and {len(held)} to evaluate: change prm.eval_fraction")
    fmt = StepFormat(d.template, d.system_prompt, d.max_prompt_tokens, d.max_answer_tokens, p.separator)
    loss = Loss("step_bce")

    def bind(engine: Engine, run_dir: Path) -> tuple[StepFn, EarlyStop]:
        if ADAPTER not in engine.adapters:  # a resumed run's adapter came with its checkpoint
            engine.create_adapter(ADAPTER, init=config.model.init_adapter, head=True)
        tokenizer = engine.tokenizer
        pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        (examples, cuts), (held_out, _) = encode_labelled(tokenizer, train, fmt), encode_labelled(tokenizer, held, fmt)
        order = LengthBuckets([len(e.ids) for e in examples], t.batch_size, t.seed)
        data_metrics = {**cuts, "data/held_out_answers": float(len(held_out)),
                        "data/skipped_rows": float(len(loaded.skipped))}

        def step_fn(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
            batch = step_batch([examples[i] for i in order.batch(step - 1)], pad_id)
            engine.use_adapter(ADAPTER)
            trained = {**engine.forward_backward(batch, loss), **engine.optim_step(adam_params(t))}
            out = {**{f"train/{k}": v for k, v in trained.items()}, **data_metrics}
            if held_out and (step == t.steps or (p.eval_every and step % p.eval_every == 0)):
                out.update(heldout_metrics(engine, held_out, pad_id, t.batch_size))
            return out, []

        return step_fn, never_stop

    return bind
