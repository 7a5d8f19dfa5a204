"""Packing a step's sequences into rows (purplerl.data.packing): first-fit decreasing, each sequence's own positions
and masks, its first token never a target, and the pairs and per-sequence tensors following the new order. Unpacked
again, a packed batch is the batch it came from."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from purplerl.algorithms.packing import unpack
from purplerl.data.packing import pack_batch, pack_rows
from purplerl.data.sft import Encoded, pad_batch
from purplerl.errors import ExperimentError

PAD = 0


def sequence(first: int, length: int, prompt: int) -> Encoded:
    return Encoded(tuple(range(first, first + length)), (0.0,) * prompt + (1.0,) * (length - prompt), str(first))


def test_rows_are_filled_first_fit_by_decreasing_length_to_the_width_padding_least() -> None:
    # sorted: 5 (index 1), 4 (3), 3 (0), 3 (4), 2 (2), 17 tokens. Rows of 8 would be [5, 3], [4, 3], [2]: 3 x 8 = 24
    # tokens. Three rows' worth (6): [5], [4, 2], [3, 3], 3 x 6 = 18; four or five (5): [5], [4], [3, 2], [3], 20.
    assert pack_rows([3, 5, 2, 4, 3], 8) == [[1], [3, 2], [0, 4]]
    assert pack_rows([4, 4], 8) == [[0, 1]]
    assert pack_rows([35, 34, 33, 32], 128) == [[0, 3], [1, 2]]  # 2 x 67, where one row of 128 would hold 3
    with pytest.raises(ExperimentError, match="a sequence of 9 tokens does not fit a packed row of 8"):
        pack_rows([2, 9], 8)


def test_a_packed_batch_holds_each_sequence_at_its_own_positions() -> None:
    batch = pad_batch([sequence(10, 3, 1), sequence(20, 5, 2), sequence(30, 2, 1)], PAD)
    packed = pack_batch(batch, 8, PAD)  # rows of 5: [5], [3, 2]
    assert packed.input_ids_NT.tolist() == [[20, 21, 22, 23, 24], [10, 11, 12, 30, 31]]
    assert packed.position_ids_NT.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    # a sequence's first token is no target: in a packed row the token before it is another sequence's
    assert packed.loss_mask_NT.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 0, 1]]
    assert (packed.num_sequences, packed.num_loss_tokens) == (3, batch.num_loss_tokens)


def test_the_padding_after_a_row_is_a_block_of_its_own() -> None:
    packed = pack_batch(pad_batch([sequence(10, 5, 1), sequence(20, 2, 1), sequence(30, 2, 1)], PAD), 8, PAD)
    assert packed.input_ids_NT.tolist() == [[10, 11, 12, 13, 14], [20, 21, 30, 31, PAD]]
    assert packed.position_ids_NT.tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 0]]
    assert packed.attention_mask_NT.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert packed.num_sequences == 3


def test_unpacked_again_the_batch_is_the_one_it_came_from_in_packed_order() -> None:
    batch = pad_batch([sequence(10, 3, 1), sequence(20, 5, 2), sequence(30, 2, 1), sequence(40, 4, 3)], PAD)
    batch = dataclasses.replace(batch, ref_logprobs_NT=-batch.loss_mask_NT * torch.arange(1.0, 6.0),
                                pairs_P2=torch.tensor([[0, 1], [2, 3]]), margins_P=torch.tensor([0.5, 1.5]))
    packed = pack_batch(batch, 8, PAD)
    order = [1, 2, 3, 0]  # rows of 7: [5, 2] and [4, 3]: the packed reading order of the old rows
    for name in ("input_ids_NT", "attention_mask_NT", "loss_mask_NT", "ref_logprobs_NT"):
        got = unpack(getattr(packed, name), packed.position_ids_NT, packed.attention_mask_NT)
        want = getattr(batch, name)[order]
        assert torch.equal(got * want.ne(0), want.to(got.dtype)), name
    assert packed.pairs_P2.tolist() == [[3, 0], [1, 2]] and packed.margins_P.tolist() == [0.5, 1.5]


def test_per_sequence_labels_follow_their_sequences() -> None:
    batch = pad_batch([sequence(10, 3, 1), sequence(20, 5, 2)], PAD)
    batch = dataclasses.replace(batch, kto_labels_N=torch.tensor([1, -1]))
    packed = pack_batch(batch, 8, PAD)
    assert packed.kto_labels_N.tolist() == [-1, 1]
    with pytest.raises(ExperimentError, match="packed already"):
        pack_batch(packed, 8, PAD)
    with pytest.raises(ExperimentError, match="cannot be split into rows"):
        packed.select(torch.tensor([0]))


@pytest.mark.parametrize(("positions", "message"), [
    ([[1, 2, 3]], "must start every row at 0"),
    ([[0, 2, 3]], "must count 0, 1, 2"),
])
def test_bad_position_ids_are_refused(positions: list[list[int]], message: str) -> None:
    batch = pad_batch([sequence(10, 3, 1)], PAD)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(batch, position_ids_NT=torch.tensor(positions))
