"""The input checks the advantage estimators share: knob errors (a negative kl_beta, a NaN eps) raise UserError,
bad data (an empty batch, non-finite rewards, a mask of the wrong shape, a completion without tokens, a per-token
tensor that does not fit its mask) raises ExperimentError naming the estimator, the row and the token."""

from __future__ import annotations

import math

import torch

from purplerl.errors import ExperimentError, UserError


def check_rewards_BG(rewards_BG: torch.Tensor, who: str, min_group_size: int = 2) -> None:
    """Raise ExperimentError unless rewards are a finite [B, G] tensor with B >= 1 and G >= min_group_size."""
    if rewards_BG.ndim != 2:
        raise ExperimentError(f"{who}: rewards must have shape [B, G], got {tuple(rewards_BG.shape)}")
    num_groups, group_size = rewards_BG.shape
    if num_groups == 0:
        raise ExperimentError(f"{who}: empty batch (B=0 groups of rewards)")
    if group_size < min_group_size:
        raise ExperimentError(f"{who}: group size G={group_size}; this estimator needs G >= {min_group_size}")
    bad = ~torch.isfinite(rewards_BG)
    if bad.any():
        b, g = (int(i) for i in bad.nonzero()[0])
        raise ExperimentError(f"{who}: non-finite reward {rewards_BG[b, g].item()} at group {b}, "
                              f"completion {g} ({int(bad.sum())} non-finite in all)")


def check_knobs(who: str, kl_beta: float, eps: float) -> None:
    """UserError unless kl_beta and eps are finite numbers >= 0."""
    if not (math.isfinite(kl_beta) and kl_beta >= 0):
        raise UserError(f"{who}: kl_beta must be a finite number >= 0, got {kl_beta}")
    if not (math.isfinite(eps) and eps >= 0):
        raise UserError(f"{who}: eps must be a finite number >= 0, got {eps}")


def check_mask(rewards_BG: torch.Tensor, mask_NT: torch.Tensor, who: str) -> torch.Tensor:
    """The boolean completion-token mask, after checking it has B*G rows and no row is empty."""
    num_rows = rewards_BG.shape[0] * rewards_BG.shape[1]
    if mask_NT.ndim != 2 or mask_NT.shape[0] != num_rows:
        raise ExperimentError(f"{who}: mask must have shape [B*G={num_rows}, T] (rewards {tuple(rewards_BG.shape)}), "
                              f"got {tuple(mask_NT.shape)}")
    on_NT = mask_NT != 0
    empty_N = ~on_NT.any(dim=1)
    if empty_N.any():
        n = int(empty_N.nonzero()[0])
        raise ExperimentError(f"{who}: row {n} (group {n // rewards_BG.shape[1]}, completion "
                              f"{n % rewards_BG.shape[1]}) has no completion tokens to carry its advantage")
    return on_NT


def check_token_tensor(who: str, what: str, name: str, x_NT: torch.Tensor, mask_NT: torch.Tensor,
                       on_NT: torch.Tensor) -> None:
    """ExperimentError unless x_NT is shaped as the mask and finite on it (off-mask entries are ignored)."""
    if x_NT.shape != mask_NT.shape:
        raise ExperimentError(f"{who}: {name} shape {tuple(x_NT.shape)} != mask shape {tuple(mask_NT.shape)}")
    bad_NT = on_NT & ~torch.isfinite(x_NT)
    if bad_NT.any():
        n, t = (int(i) for i in bad_NT.nonzero()[0])
        raise ExperimentError(f"{who}: non-finite {what} {x_NT[n, t].item()} at row {n}, token {t}")
