"""The layout of packed rows (purplerl.algorithms.packing), on hand-worked rows: which block each token is in, who
may attend to whom, and the way back to one sequence per row."""

from __future__ import annotations

import torch

from purplerl.algorithms.packing import (
    additive_mask,
    block_causal_mask,
    block_ids,
    count_sequences,
    sequence_index,
    unpack,
    unpack_inputs,
)

# row 0: a sequence of 3 tokens, one of 2, one pad; row 1: a sequence of 4, two pads
POSITIONS = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
ATTENTION = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 9.0], [6.0, 7.0, 8.0, 10.0, 9.0, 9.0]])


def test_blocks_restart_where_the_positions_do() -> None:
    assert block_ids(POSITIONS).tolist() == [[1, 1, 1, 2, 2, 3], [1, 1, 1, 1, 2, 2]]
    assert sequence_index(POSITIONS, ATTENTION).tolist() == [[0, 0, 0, 1, 1, -1], [2, 2, 2, 2, -1, -1]]
    assert count_sequences(POSITIONS, ATTENTION) == 3


def test_the_mask_is_causal_inside_each_block_and_closed_between_blocks() -> None:
    mask = block_causal_mask(POSITIONS)
    assert mask.shape == (2, 1, 6, 6)
    assert mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],  # the second sequence's first token sees only itself
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding: a block of its own, never an empty row
    ]
    assert mask[1, 0, 5].int().tolist() == [0, 0, 0, 0, 1, 1]
    assert bool(mask.any(-1).all())  # every query attends to something


def test_the_additive_mask_is_zero_where_allowed_and_finite_elsewhere() -> None:
    added = additive_mask(block_causal_mask(POSITIONS), torch.float32)
    assert float(added[0, 0, 4, 3]) == 0.0 and float(added[0, 0, 4, 2]) == torch.finfo(torch.float32).min
    assert bool(torch.isfinite(added).all())


def test_unpack_puts_each_sequence_in_its_own_row_from_column_0() -> None:
    assert unpack(VALUES, POSITIONS, ATTENTION).tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 10]]
    inputs = unpack_inputs({"loss_mask_NT": ATTENTION.float(), "pairs_P2": torch.tensor([[0, 2]])},
                           POSITIONS, ATTENTION)
    assert inputs["loss_mask_NT"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert inputs["pairs_P2"].tolist() == [[0, 2]]  # per-sequence inputs index sequences already


def test_a_gradient_on_the_unpacked_rows_reaches_the_packed_values() -> None:
    values = VALUES.clone().requires_grad_(True)
    weights = torch.tensor([[1.0, 10.0, 100.0, 0.0], [2.0, 20.0, 0.0, 0.0], [3.0, 30.0, 300.0, 3000.0]])
    (unpack(values, POSITIONS, ATTENTION) * weights).sum().backward()
    assert values.grad.tolist() == [[1, 10, 100, 2, 20, 0], [3, 30, 300, 3000, 0, 0]]
