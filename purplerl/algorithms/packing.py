"""Packed rows: several sequences laid end to end in one row, each attending only to itself.

A packed batch says where its sequences start through `position_ids_NT`: each token's position inside its own
sequence, 0 where a sequence starts and one more at each following token (purplerl.types.TrainBatch). From those
alone come the attention mask (block-diagonal and causal: no token sees another sequence) and the way back to one
sequence per row. The sequences of a packed batch are numbered in reading order (row by row, left to right): that is
the index `pairs_P2` and the per-sequence tensors use.

The padding after a row's last sequence restarts at 0 too, so it forms a block of its own: a padding query then
attends to itself at least, and no softmax row is empty (an all-masked row is NaN in SDPA's math kernel, and a NaN
times a zero gradient is still NaN).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def block_ids(position_ids_NT: torch.Tensor) -> torch.Tensor:
    """long [N, T]: the block of each token inside its row (a new block wherever the position restarts at 0)."""
    return torch.cumsum((position_ids_NT == 0).long(), dim=-1)


def first_key_mask(first_key_NT: torch.Tensor) -> torch.Tensor:
    """bool [N, 1, T, T]: query q may attend key k when first_key[q] <= k <= q. Every mask purplerl trains under is
    of this form, causal with a first key per query: a packed row's (its sequence's start) and a gist row's (the
    gist block before its segment, purplerl.data.gist)."""
    width = first_key_NT.shape[-1]
    keys_T = torch.arange(width, device=first_key_NT.device)
    causal_TT = keys_T[None, :] <= keys_T[:, None]
    return (causal_TT & (keys_T[None, None, :] >= first_key_NT[:, :, None]))[:, None]


def sequence_starts(position_ids_NT: torch.Tensor) -> torch.Tensor:
    """long [N, T]: the column where each token's sequence starts (its column minus its position)."""
    return torch.arange(position_ids_NT.shape[-1], device=position_ids_NT.device) - position_ids_NT


def block_causal_mask(position_ids_NT: torch.Tensor) -> torch.Tensor:
    """bool [N, 1, T, T]: query q may attend key k when both are in one block and k <= q."""
    return first_key_mask(sequence_starts(position_ids_NT))


def first_keys(position_ids_NT: torch.Tensor | None, first_key_NT: torch.Tensor | None) -> torch.Tensor | None:
    """long [N, T]: the first key of each query under both constraints (its packed sequence's start, a gist row's
    first key), or None when the rows are plain causal."""
    if position_ids_NT is None:
        return first_key_NT
    starts_NT = sequence_starts(position_ids_NT)
    return starts_NT if first_key_NT is None else torch.maximum(starts_NT, first_key_NT)


def additive_mask(allowed_N1TT: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The boolean mask as the additive one eager attention adds to its scores: 0 where allowed, the dtype's most
    negative finite number where not (finite: an -inf row would turn the softmax into NaN)."""
    return torch.zeros(allowed_N1TT.shape, dtype=dtype, device=allowed_N1TT.device).masked_fill(
        ~allowed_N1TT, torch.finfo(dtype).min)


def sequence_index(position_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor) -> torch.Tensor:
    """long [N, T]: the sequence (in reading order) each real token belongs to, -1 on padding."""
    real_NT = attention_mask_NT != 0
    starts = ((position_ids_NT == 0) & real_NT).reshape(-1)
    index_NT = (torch.cumsum(starts.long(), 0) - 1).view_as(position_ids_NT)
    return torch.where(real_NT, index_NT, -1)


def count_sequences(position_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor) -> int:
    return int(((position_ids_NT == 0) & (attention_mask_NT != 0)).sum())


def unpack(values_NT: torch.Tensor, position_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor) -> torch.Tensor:
    """[S, L]: each of the S sequences of a packed batch in its own row, from column 0 (its position), 0 after its
    end; L is the longest sequence. The layout of the same sequences right-padded one per row, and differentiable: a
    gradient on the result flows back to the packed values."""
    index_NT = sequence_index(position_ids_NT, attention_mask_NT)
    real_NT = index_NT >= 0
    rows_R, cols_R = index_NT[real_NT], position_ids_NT[real_NT]
    count = count_sequences(position_ids_NT, attention_mask_NT)
    width = int(cols_R.max()) + 1 if cols_R.numel() else 0
    out = values_NT.new_zeros((count, width))
    return out.index_put((rows_R, cols_R), values_NT[real_NT])


def unpack_inputs(inputs: Mapping[str, torch.Tensor], position_ids_NT: torch.Tensor,
                  attention_mask_NT: torch.Tensor) -> dict[str, torch.Tensor]:
    """A loss's inputs (TrainBatch.inputs) with every per-token tensor unpacked to one sequence per row; the
    per-sequence ones (pairs_P2, kto_labels_N, ...) already index sequences and stay as they are."""
    return {name: unpack(value, position_ids_NT, attention_mask_NT) if name.endswith("_NT") else value
            for name, value in inputs.items()}


LAYOUT = ("position_ids_NT", "first_key_NT")  # the tensors that say how a batch's rows attend


def row_layout(position_ids_NT: torch.Tensor | None, first_key_NT: torch.Tensor | None,
               device: torch.device | None) -> dict[str, torch.Tensor]:
    """The layout tensors given, by name (on `device` unless None): how the rows of a batch attend."""
    given = {"position_ids_NT": position_ids_NT, "first_key_NT": first_key_NT}
    return {name: t if device is None else t.to(device) for name, t in given.items() if t is not None}


def layout_of(part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The layout tensors among a micro-batch's tensors."""
    return {name: part[name] for name in LAYOUT if name in part}
