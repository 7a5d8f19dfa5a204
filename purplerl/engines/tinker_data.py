"""Pure tensor helpers of the Tinker engine: purplerl's target-aligned batches <-> Tinker's per-datum arrays.

A Tinker `Datum` of a sequence of L tokens holds the model input (tokens 0..L-2) and, per target, arrays of
length L-1 (target_tokens = tokens 1..L-1, weights, logprobs, advantages). purplerl's per-token tensors are
aligned to targets too, with entry 0 always off the loss: entry t of a row is entry t-1 of its datum.
"""

from __future__ import annotations

import sys
from typing import Literal

import torch

from purplerl.algorithms.losses import aggregate_loss
from purplerl.algorithms.registry import Loss
from purplerl.config import ModelConfig
from purplerl.errors import ExperimentError, UserError
from purplerl.types import TrainBatch

Reduction = Literal["sum", "sequence_mean"]


def row_lengths(attention_mask_NT: torch.Tensor) -> list[int]:
    """Real tokens of each right-padded row; a datum needs at least one target (2 tokens)."""
    lengths = [int(n) for n in attention_mask_NT.sum(-1).tolist()]
    short = [i for i, n in enumerate(lengths) if n < 2]
    if short:
        raise ExperimentError(f"sequence {short[0]} has {lengths[short[0]]} tokens: a datum needs at least 2")
    return lengths


def datum_slice(values_NT: torch.Tensor, row: int, length: int) -> torch.Tensor:
    """The datum-aligned entries [length - 1] of one row of a target-aligned tensor."""
    return values_NT[row, 1:length]


def scatter_targets(rows: list[list[float]], lengths: list[int], width: int,
                    keep_NT: torch.Tensor | None = None) -> torch.Tensor:
    """Target-aligned float32 [N, width] from per-datum values (entry t of a datum -> column t+1); columns
    where `keep_NT` is 0 are zeroed (the positions nobody asked for)."""
    out_NT = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (values, length) in enumerate(zip(rows, lengths, strict=True)):
        if len(values) != length - 1:
            raise ExperimentError(f"the service returned {len(values)} logprobs for sequence {i} of "
                                  f"{length} tokens (expected {length - 1})")
        out_NT[i, 1:length] = torch.tensor(values, dtype=torch.float32)
    return out_NT if keep_NT is None else out_NT * (keep_NT != 0)


def aggregation_coefficients(loss: Loss, mask_NT: torch.Tensor) -> torch.Tensor:
    """d(aggregated loss) / d(per-token loss) [N, T]: every aggregation is a fixed weighting of the per-token
    losses (algorithms.losses), so this weight turns a per-token built-in loss into purplerl's scalar."""
    per_token_NT = torch.zeros(mask_NT.shape, dtype=torch.float32, requires_grad=True)
    total = aggregate_loss(per_token_NT, mask_NT.float(), loss.aggregation, total_tokens=float(mask_NT.sum()),
                           total_sequences=int(mask_NT.shape[0]), length_norm=loss.length_norm)
    (coefficients_NT,) = torch.autograd.grad(total, per_token_NT)
    return coefficients_NT


def reduction_scale(on_NT: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Per-row factor [N, 1] that undoes the service's own reduction of a datum's token losses, for datums
    whose weights are 1 on `on_NT` and whose per-token loss is linear in its advantages.

    'sum' (the Tinker API: loss = sum over tokens) needs none. 'sequence_mean' (SkyRL's server) divides each
    datum's summed loss by the sum of its weights and averages the gradient over the step's datums, so the
    advantages are multiplied by (loss tokens of the row) * (datums in the step)."""
    if reduction == "sum":
        return torch.ones((on_NT.shape[0], 1))
    tokens_N1 = on_NT.float().sum(-1, keepdim=True).clamp(min=1.0)
    return tokens_N1 * on_NT.shape[0]


def refuse_temperature(temperature: float, what: str) -> None:
    if temperature != 1.0:
        raise UserError(f"{what} at temperature {temperature:g}: the Tinker API scores at temperature 1 only")


def loss_metrics(value: torch.Tensor, metrics: dict[str, float], batch: TrainBatch) -> dict[str, float]:
    """A loss's metrics as the engine reports them: its value, its own metrics and the loss tokens."""
    return {"loss": float(value), **{k: float(v) for k, v in metrics.items()}, "tokens": float(batch.num_loss_tokens)}


def refuse_unmappable(cfg: ModelConfig) -> None:
    """The model settings the Tinker API cannot map, refused in one line (lora_alpha: a note)."""
    if cfg.finetune != "lora":
        raise UserError("the tinker engine trains LoRA adapters only: use --model.finetune lora")
    if cfg.init_adapter:
        raise UserError("the tinker engine cannot start from a local PEFT adapter (model.init_adapter)")
    if cfg.lora_targets != "all-linear":
        raise UserError("the tinker engine adapts every linear layer: model.lora_targets must be 'all-linear'")
    if cfg.lora_dropout > 0:
        raise UserError("the tinker engine has no LoRA dropout: set model.lora_dropout 0")
    if "lora_alpha" in cfg.model_fields_set:  # the API takes a rank only: the service scales the update itself
        print(f"note: the Tinker service applies its own LoRA scale; model.lora_alpha ({cfg.lora_alpha:g}) is not "
              f"sent", file=sys.stderr)
