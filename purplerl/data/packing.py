"""Packing (`data.packing`): a step's sequences laid end to end in rows of at most a token budget, instead of one
right-padded row each, so a forward pass spends less work on padding.

The batch a step trains on stays the same (the same examples, the same loss): only its layout changes. Rows are
filled first-fit by decreasing length (Johnson 1973: within 11/9 of the fewest rows, plus a constant) to the width
that leaves the least padding (`pack_rows`). Each sequence keeps its own positions (0, 1, ... from its first token)
and attends only to itself (purplerl.algorithms.packing), so each sequence's loss is what it is alone, to float
precision. A sequence's first token is never a target: in a packed row the token before it is another sequence's.
"""

from __future__ import annotations

import dataclasses

import torch

from purplerl.errors import ExperimentError
from purplerl.types import TrainBatch

# per-token tensors a packed batch carries, besides the ids and the masks
_PER_TOKEN = ("sampling_logprobs_NT", "advantages_NT", "ref_logprobs_NT", "old_values_NT", "returns_NT")


def _first_fit(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing into rows of `width`, ties in index order."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        row = next((r for r, room in enumerate(free) if room >= lengths[i]), None)
        if row is None:
            rows.append([])
            free.append(width)
            row = len(rows) - 1
        rows[row].append(i)
        free[row] -= lengths[i]
    return rows


def pack_rows(lengths: list[int], budget: int) -> list[list[int]]:
    """Which sequences (by index) fill each row, rows of at most `budget` tokens: of the first-fit-decreasing
    packings into k rows' worth of width (k = 1, 2, ...: the total / k, at least the longest sequence), the one
    with the fewest tokens in its rectangle (rows x widest row). A step's few sequences packed up to the budget
    would leave its last row mostly padding; at k = their number this is one sequence a row, so a packed batch
    never holds more padding than the padded one. A sequence longer than the budget is refused (the recipe cuts
    sequences to it before)."""
    if any(n > budget for n in lengths):
        raise ExperimentError(f"a sequence of {max(lengths)} tokens does not fit a packed row of {budget}")
    best: list[list[int]] = []
    best_cost = None
    for k in range(1, len(lengths) + 1):
        width = max(max(lengths), -(-sum(lengths) // k))
        if width > budget:
            continue
        rows = _first_fit(lengths, width)
        cost = len(rows) * max(sum(lengths[i] for i in row) for row in rows)
        if best_cost is None or cost < best_cost:
            best, best_cost = rows, cost
    return best


def pack_batch(batch: TrainBatch, budget: int, pad_id: int) -> TrainBatch:
    """The sequences of `batch` (one right-padded row each) packed into rows of at most `budget` tokens. Sequences
    are renumbered in the packed reading order; pairs_P2 and the per-sequence tensors follow them."""
    if batch.position_ids_NT is not None:
        raise ExperimentError("the batch is packed already")
    lengths = [int(n) for n in batch.attention_mask_NT.sum(-1)]
    rows = pack_rows(lengths, budget)
    order = [i for row in rows for i in row]  # new sequence index -> old row
    width = max(sum(lengths[i] for i in row) for row in rows)
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=batch.input_ids_NT.dtype)
    positions = torch.zeros(shape, dtype=torch.long)
    attention = torch.zeros(shape, dtype=batch.attention_mask_NT.dtype)
    per_token = {name: getattr(batch, name) for name in ("loss_mask_NT", *_PER_TOKEN)
                 if getattr(batch, name) is not None}
    packed = {name: torch.zeros(shape, dtype=t.dtype) for name, t in per_token.items()}
    first_key = None if batch.first_key_NT is None else torch.zeros(shape, dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            n, end = lengths[i], start + lengths[i]
            ids[r, start:end] = batch.input_ids_NT[i, :n]
            attention[r, start:end] = 1
            positions[r, start:end] = torch.arange(n)
            for name, t in per_token.items():
                packed[name][r, start:end] = t[i, :n]
            if first_key is not None:  # a gist row's first keys are columns of its row: they move with it
                first_key[r, start:end] = batch.first_key_NT[i, :n] + start
            packed["loss_mask_NT"][r, start] = 0  # the token before a sequence's first is not its own
            start = end
        positions[r, start:] = torch.arange(width - start)  # padding: a block of its own
    new_index = torch.empty(len(order), dtype=torch.long)
    new_index[torch.tensor(order)] = torch.arange(len(order))
    per_sequence = {name: getattr(batch, name)[torch.tensor(order)] for name in ("kto_labels_N", "is_rh_N")
                    if getattr(batch, name) is not None}
    pairs = None if batch.pairs_P2 is None else new_index[batch.pairs_P2]
    return dataclasses.replace(batch, input_ids_NT=ids, attention_mask_NT=attention, position_ids_NT=positions,
                               first_key_NT=first_key, pairs_P2=pairs, **packed, **per_sequence)
