"""Per-token estimators of KL(policy || ref) from the log-probs of tokens sampled from the policy.

Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html). With
log r = logp_ref - logp for a token x drawn from the policy:
    k1 = -log r                  unbiased, high variance, can be negative per token
    k2 = (log r)^2 / 2           biased, low variance, always >= 0
    k3 = (r - 1) - log r         unbiased, low variance, always >= 0
All three take and return tensors of the same shape; nothing is reduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from purplerl.algorithms.names import KL_ESTIMATOR_NAMES, check_names
from purplerl.errors import ExperimentError, UserError

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def kl_k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k1 = logp - logp_ref."""
    return logp - logp_ref


def kl_k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k2 = (logp - logp_ref)^2 / 2."""
    return 0.5 * (logp - logp_ref) ** 2


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1."""
    log_ratio = logp_ref - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
check_names("KL estimators", KL_ESTIMATORS, KL_ESTIMATOR_NAMES)


def get_kl_estimator(name: str) -> KLEstimator:
    """Look up an estimator by name, raising UserError that lists the known names."""
    if name not in KL_ESTIMATORS:
        raise UserError(f"unknown KL estimator '{name}' (known: {', '.join(sorted(KL_ESTIMATORS))})")
    return KL_ESTIMATORS[name]


def sequence_kl(logp_NT: torch.Tensor, ref_NT: torch.Tensor, mask_NT: torch.Tensor, estimator: str = "k1",
                reduction: Literal["mean", "sum"] = "mean") -> torch.Tensor:
    """KL(policy || ref) per sequence: the estimator's per-token values reduced over masked tokens.

    `reduction="mean"` averages over each sequence's masked tokens (the red-team trainer's KL
    reward term); `"sum"` adds them (the sequence-level KL). Off-mask entries are ignored even when
    they are not finite. Raises ExperimentError when shapes differ, a sequence has no masked token,
    or a masked log-prob (or the resulting KL) is not finite.
    """
    fn = get_kl_estimator(estimator)
    if logp_NT.shape != ref_NT.shape or logp_NT.shape != mask_NT.shape or logp_NT.ndim != 2:
        raise ExperimentError(f"sequence_kl: shapes must match as [N, T], got logp {tuple(logp_NT.shape)}, "
                              f"ref {tuple(ref_NT.shape)}, mask {tuple(mask_NT.shape)}")
    on_NT = mask_NT != 0
    count_N = on_NT.sum(dim=1)
    if (count_N == 0).any():
        n = int((count_N == 0).nonzero()[0])
        raise ExperimentError(f"sequence_kl: sequence {n} has no masked tokens to average the KL over")
    for name, x_NT in (("policy logprobs", logp_NT), ("reference logprobs", ref_NT)):
        bad_NT = on_NT & ~torch.isfinite(x_NT)
        if bad_NT.any():
            n, t = (int(i) for i in bad_NT.nonzero()[0])
            raise ExperimentError(f"sequence_kl: non-finite {name} ({x_NT[n, t].item()}) at sequence {n}, token {t}")
    # Zero the off-mask entries before the estimator so an inf there cannot turn into NaN.
    kl_NT = fn(torch.where(on_NT, logp_NT, 0.0), torch.where(on_NT, ref_NT, 0.0))
    kl_N = (kl_NT * mask_NT).sum(dim=1)
    if reduction == "mean":
        kl_N = kl_N / mask_NT.sum(dim=1)
    elif reduction != "sum":
        raise UserError(f"sequence_kl: unknown reduction '{reduction}' (known: mean, sum)")
    bad_N = ~torch.isfinite(kl_N)
    if bad_N.any():
        n = int(bad_N.nonzero()[0])
        raise ExperimentError(f"sequence_kl: KL estimator '{estimator}' overflowed to {kl_N[n].item()} "
                              f"at sequence {n}")
    return kl_N
