"""Per-token policy-gradient losses and their aggregation.

Every loss in `LOSSES` has one signature,
    fn(logprobs_NT, sampling_logprobs_NT, advantages_NT, mask_NT, *, clip_low, clip_high) -> (loss_NT, metrics)
and returns the loss per token, zero off the mask, with no reduction; `aggregate_loss` (one of
`LOSS_AGGREGATIONS`) turns it into the scalar that is back-propagated. Knobs a loss does not use (clip bounds for
importance_sampling) are accepted and ignored, so the caller never branches on the loss name.

`logprobs_NT` carries the gradient (current policy); `sampling_logprobs_NT` are the log-probs recorded
when the tokens were sampled and are treated as constants.
"""

from __future__ import annotations

from typing import Protocol

import torch

from purplerl.algorithms.kl import get_kl_estimator, kl_k3
from purplerl.algorithms.logprobs import masked_mean
from purplerl.algorithms.names import LOSS_AGGREGATION_NAMES, check_names
from purplerl.errors import ExperimentError, UserError


class LossFn(Protocol):
    def __call__(self, logprobs_NT: torch.Tensor, sampling_logprobs_NT: torch.Tensor,
                 advantages_NT: torch.Tensor, mask_NT: torch.Tensor, *, clip_low: float,
                 clip_high: float) -> tuple[torch.Tensor, dict[str, float]]: ...


def _ratio(logprobs_NT: torch.Tensor, sampling_logprobs_NT: torch.Tensor, on_NT: torch.Tensor) -> torch.Tensor:
    """exp(logp - logp_sampling) on the mask, 1 off it (so padding never overflows or makes NaN)."""
    log_ratio_NT = torch.where(on_NT, logprobs_NT - sampling_logprobs_NT.detach(), 0.0)
    return torch.exp(log_ratio_NT)


@torch.no_grad()
def _ratio_metrics(logprobs_NT: torch.Tensor, sampling_logprobs_NT: torch.Tensor, ratio_NT: torch.Tensor,
                   mask_NT: torch.Tensor) -> dict[str, float]:
    on_NT = mask_NT != 0
    # Samples come from the sampling policy, so k3(sampling, current) estimates KL(sampling || current):
    # how far the trained policy has drifted from the one that generated the batch.
    kl_NT = kl_k3(torch.where(on_NT, sampling_logprobs_NT, 0.0), torch.where(on_NT, logprobs_NT, 0.0))
    # Only token means: an engine sums a loss's metrics over micro-batches and data-parallel ranks weighted by
    # their token shares, which turns a count into a wrong number (the count is the engine's own `tokens`).
    return {
        "ratio_mean": float(masked_mean(ratio_NT, mask_NT).item()),
        "approx_kl_sampling": float(masked_mean(kl_NT, mask_NT).item()),
    }


def importance_sampling_loss(logprobs_NT: torch.Tensor, sampling_logprobs_NT: torch.Tensor,
                             advantages_NT: torch.Tensor, mask_NT: torch.Tensor, *, clip_low: float = 0.2,
                             clip_high: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """-exp(logp - logp_sampling) * A per token (Tinker's `importance_sampling` loss).

    On-policy (ratio 1) the gradient of each token is -A * grad logp: exactly REINFORCE. Off-policy
    the ratio corrects for the sampler (e.g. vLLM numerics or a stale policy). Clip bounds are ignored.
    Metrics: `ratio_mean`, `approx_kl_sampling`.
    """
    on_NT = mask_NT != 0
    ratio_NT = _ratio(logprobs_NT, sampling_logprobs_NT, on_NT)
    loss_NT = torch.where(on_NT, -ratio_NT * advantages_NT, 0.0)
    return loss_NT, _ratio_metrics(logprobs_NT, sampling_logprobs_NT, ratio_NT, mask_NT)


def ppo_clip_loss(logprobs_NT: torch.Tensor, sampling_logprobs_NT: torch.Tensor, advantages_NT: torch.Tensor,
                  mask_NT: torch.Tensor, *, clip_low: float = 0.2,
                  clip_high: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate: -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A) per token.

    Schulman et al. 2017 (arXiv 1707.06347) with separate bounds; clip_high > clip_low is DAPO's
    clip-higher (arXiv 2503.14476), which leaves room to raise low-probability tokens.
    Metrics add `clip_frac` (share of masked tokens whose gradient the clip removes: r > 1 + clip_high
    with A > 0, or r < 1 - clip_low with A < 0), split into `clip_frac_high` and `clip_frac_low`.
    """
    on_NT = mask_NT != 0
    ratio_NT = _ratio(logprobs_NT, sampling_logprobs_NT, on_NT)
    unclipped_NT = ratio_NT * advantages_NT
    clipped_NT = torch.clamp(ratio_NT, 1.0 - clip_low, 1.0 + clip_high) * advantages_NT
    loss_NT = torch.where(on_NT, -torch.minimum(unclipped_NT, clipped_NT), 0.0)
    metrics = _ratio_metrics(logprobs_NT, sampling_logprobs_NT, ratio_NT, mask_NT)
    with torch.no_grad():
        high_NT = ((ratio_NT > 1.0 + clip_high) & (advantages_NT > 0)).float()
        low_NT = ((ratio_NT < 1.0 - clip_low) & (advantages_NT < 0)).float()
        metrics["clip_frac_high"] = float(masked_mean(high_NT, mask_NT).item())
        metrics["clip_frac_low"] = float(masked_mean(low_NT, mask_NT).item())
        metrics["clip_frac"] = metrics["clip_frac_high"] + metrics["clip_frac_low"]
    return loss_NT, metrics


def aggregate_token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, normalizer: float) -> torch.Tensor:
    """sum(loss * mask) / normalizer, a scalar.

    `normalizer` is the masked-token count of the FULL batch, not of this micro-batch. Each token then
    has weight 1/normalizer whichever micro-batch it lands in, so the gradients of the micro-batches add
    up to the gradient of the token mean over the full batch (dividing each micro-batch by its own count
    would over-weight micro-batches with few tokens).
    """
    if not normalizer > 0:
        raise ExperimentError(f"aggregate_token_mean: normalizer must be > 0 (the batch's loss-token count), "
                              f"got {normalizer}")
    return torch.where(mask_NT != 0, loss_NT * mask_NT, 0.0).sum() / normalizer


class AggregationFn(Protocol):
    def __call__(self, loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float,
                 total_sequences: int, length_norm: float | None) -> torch.Tensor: ...


def _masked_row_sums(loss_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    return torch.where(mask_NT != 0, loss_NT * mask_NT, 0.0).sum(dim=1)


def _check_total_sequences(mask_NT: torch.Tensor, total_sequences: int, who: str) -> None:
    if not total_sequences >= 1:
        raise ExperimentError(f"{who}: total_sequences must be >= 1 (the batch's sequence count), "
                              f"got {total_sequences}")
    if mask_NT.shape[0] > total_sequences:
        raise ExperimentError(f"{who}: micro-batch has {mask_NT.shape[0]} rows but total_sequences is "
                              f"{total_sequences}; pass the FULL batch's sequence count")


def _token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float, total_sequences: int,
                length_norm: float | None = None) -> torch.Tensor:
    total = aggregate_token_mean(loss_NT, mask_NT, total_tokens)  # checks total_tokens > 0
    num_tokens = float(mask_NT.sum().item())
    if num_tokens > total_tokens * (1 + 1e-6):
        raise ExperimentError(f"aggregate_loss(token_mean): micro-batch has {num_tokens} loss tokens but "
                              f"total_tokens is {total_tokens}; pass the FULL batch's token count")
    return total


def _seq_mean_token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float,
                         total_sequences: int, length_norm: float | None = None) -> torch.Tensor:
    _check_total_sequences(mask_NT, total_sequences, "aggregate_loss(seq_mean_token_mean)")
    count_N = mask_NT.sum(dim=1)
    # A row without loss tokens has a zero sum; dividing it by 1 makes it contribute 0, not NaN.
    row_mean_N = _masked_row_sums(loss_NT, mask_NT) / torch.where(count_N == 0, torch.ones_like(count_N), count_N)
    return row_mean_N.sum() / total_sequences


def _seq_mean_token_sum_norm(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float,
                             total_sequences: int, length_norm: float | None = None) -> torch.Tensor:
    if length_norm is None or not length_norm > 0:
        raise UserError(f"aggregate_loss(seq_mean_token_sum_norm): length_norm must be a constant > 0 "
                        f"(e.g. max_new_tokens), got {length_norm}")
    _check_total_sequences(mask_NT, total_sequences, "aggregate_loss(seq_mean_token_sum_norm)")
    return _masked_row_sums(loss_NT, mask_NT).sum() / length_norm / total_sequences


LOSS_AGGREGATIONS: dict[str, AggregationFn] = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}
check_names("loss aggregations", LOSS_AGGREGATIONS, LOSS_AGGREGATION_NAMES)


def aggregate_loss(loss_NT: torch.Tensor, mask_NT: torch.Tensor, mode: str, *, total_tokens: float,
                   total_sequences: int, length_norm: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss [N, T] to the scalar to back-propagate, one of `LOSS_AGGREGATIONS`:

    - `token_mean`: sum(loss * mask) / total_tokens. Every token weighs the same, so long answers weigh
      more (DAPO's token-level loss, arXiv 2503.14476).
    - `seq_mean_token_mean`: sum over rows of [sum_t loss * mask / sum_t mask] / total_sequences. Every
      sequence weighs the same (the original GRPO, arXiv 2402.03300); a row without loss tokens adds 0.
    - `seq_mean_token_sum_norm`: sum of all loss * mask / length_norm / total_sequences, with length_norm a
      constant (e.g. max_new_tokens). Dr. GRPO (arXiv 2503.20783): dividing each sequence by its own
      length biases the update by response length; a constant does not.

    `total_tokens` and `total_sequences` count the FULL batch, so the results (and gradients) of its
    micro-batches sum to the full-batch value. Only the mode's own knobs are checked: total_tokens > 0
    for token_mean, total_sequences >= 1 for the seq modes (ExperimentError), length_norm > 0 for
    seq_mean_token_sum_norm (UserError). An unknown mode raises UserError.
    """
    if mode not in LOSS_AGGREGATIONS:
        raise UserError(f"unknown loss aggregation '{mode}' (known: {', '.join(sorted(LOSS_AGGREGATIONS))})")
    if loss_NT.shape != mask_NT.shape or loss_NT.ndim != 2:
        raise ExperimentError(f"aggregate_loss: loss {tuple(loss_NT.shape)} and mask {tuple(mask_NT.shape)} "
                              f"must have the same [N, T] shape")
    return LOSS_AGGREGATIONS[mode](loss_NT, mask_NT, total_tokens=total_tokens, total_sequences=total_sequences,
                                   length_norm=length_norm)


def kl_penalty_loss(logp_NT: torch.Tensor, ref_NT: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(policy || ref) estimate to add to the loss as `kl_beta * k`; aggregate it like the loss.

    The reference log-probs are constants. Which estimator to differentiate matters (Tang & Munos,
    arXiv 2506.09477): on-policy, the gradient of k2 is the gradient of KL(policy || ref); k3 (used by
    DeepSeekMath's GRPO) gives the gradient of KL(ref || policy); k1's gradient is zero in expectation.
    Off-mask entries must be finite (multiply by the mask, as `aggregate_token_mean` does).
    """
    return get_kl_estimator(estimator)(logp_NT, ref_NT.detach())
