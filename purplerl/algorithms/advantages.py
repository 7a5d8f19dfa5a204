"""Advantage estimators: rewards of G completions per prompt -> one advantage per completion.

Every estimator in `ADVANTAGES` is called as `fn(rewards_BG, scale_by_std=..., eps=...)` and returns
`(advantages_BG, metrics)`. A new estimator (RLOO, Dr. GRPO, REINFORCE++) is a new function added to
the registry, never a branch in the training loop.
"""

from __future__ import annotations

from typing import Protocol

import torch

from purplerl.errors import ExperimentError

# Rewards whose max and min differ by less than this count as one value (a zero-variance group).
_EQUAL_TOL = 1e-8


class AdvantageFn(Protocol):
    def __call__(self, rewards_BG: torch.Tensor, *, scale_by_std: bool = ...,
                 eps: float = ...) -> tuple[torch.Tensor, dict[str, float]]: ...


def check_rewards_BG(rewards_BG: torch.Tensor, who: str) -> None:
    """Raise ExperimentError unless rewards are a finite [B, G] tensor with B >= 1 and G >= 2."""
    if rewards_BG.ndim != 2:
        raise ExperimentError(f"{who}: rewards must have shape [B, G], got {tuple(rewards_BG.shape)}")
    num_groups, group_size = rewards_BG.shape
    if num_groups == 0:
        raise ExperimentError(f"{who}: empty batch (B=0 groups of rewards)")
    if group_size < 2:
        raise ExperimentError(f"{who}: group size G={group_size}; group-relative advantages need G >= 2")
    bad = ~torch.isfinite(rewards_BG)
    if bad.any():
        b, g = (int(i) for i in bad.nonzero()[0])
        raise ExperimentError(f"{who}: non-finite reward {rewards_BG[b, g].item()} at group {b}, "
                              f"completion {g} ({int(bad.sum())} non-finite in all)")


def grpo_advantages(rewards_BG: torch.Tensor, scale_by_std: bool = False,
                    eps: float = 1e-6) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO advantages: reward minus its group mean, optionally divided by (group std + eps).

    DeepSeekMath (arXiv 2402.03300) divides by the group std; Dr. GRPO (arXiv 2503.20783) shows that
    the division up-weights near-uniform groups, so it is off by default. The std is the population
    std (unbiased=False): a group of two rewards {0, 1} gets advantages {-1, +1} when scaled.
    A group whose rewards are all equal gets all-zero advantages (it carries no learning signal).

    Metrics: `frac_zero_variance_groups` (share of groups with max - min < 1e-8) and
    `adv_abs_mean` (mean |advantage| over the batch).
    """
    check_rewards_BG(rewards_BG, "grpo_advantages")
    rewards_BG = rewards_BG.float()
    advantages_BG = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    if scale_by_std:
        std_B1 = rewards_BG.std(dim=1, unbiased=False, keepdim=True)
        advantages_BG = advantages_BG / (std_B1 + eps)
    spread_B = rewards_BG.max(dim=1).values - rewards_BG.min(dim=1).values
    # The float mean of equal values can be off by an ulp; such groups get exact zeros, not noise.
    advantages_BG = torch.where((spread_B < _EQUAL_TOL)[:, None], 0.0, advantages_BG)
    metrics = {
        "frac_zero_variance_groups": float((spread_B < _EQUAL_TOL).float().mean().item()),
        "adv_abs_mean": float(advantages_BG.abs().mean().item()),
    }
    return advantages_BG, metrics


def zscore(x_N: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(x - mean) / (std + eps) over the whole batch, population std. A constant batch gives zeros.

    Used to normalize rewards across the batch before group advantages (the red-team trainer's
    `zscore` option). Raises ExperimentError on an empty input.
    """
    if x_N.numel() == 0:
        raise ExperimentError("zscore: empty input (no rewards to normalize)")
    x_N = x_N.float()
    if float((x_N.max() - x_N.min()).item()) < _EQUAL_TOL:
        return torch.zeros_like(x_N)
    return (x_N - x_N.mean()) / (x_N.std(unbiased=False) + eps)


ADVANTAGES: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
}
