"""The gap between a rollout engine's logprobs and the trainer's, and the truncated importance-sampling (TIS)
weight that corrects the policy gradient for it.

A fast sampler (vLLM) and the trainer (torch) compute the same policy with different kernels, so the tokens are
drawn from pi_rollout while the loss differentiates pi_trainer. Yao et al., "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training" (2025), weight each token's policy-gradient term by

    w_t = min(pi_trainer(y_t) / pi_rollout(y_t), C)

truncated at C to bound the variance (TRL's `vllm_importance_sampling_correction` with `vllm_importance_sampling_cap`,
veRL's `tis_imp_ratio_cap`). The weight is a constant (no gradient flows through it); the PPO ratio then uses
the trainer's own logprobs as the old policy.
"""

from __future__ import annotations

import torch

from purplerl.errors import UserError


def logprob_mismatch(trainer_NT: torch.Tensor, rollout_NT: torch.Tensor, mask_NT: torch.Tensor) -> dict[str, float]:
    """Mean and max |trainer - rollout| logprob over the mask's tokens (0 for an empty mask)."""
    on_NT = mask_NT != 0
    gap_R = (trainer_NT - rollout_NT).abs()[on_NT]
    if gap_R.numel() == 0:
        return {"lp_diff_mean": 0.0, "lp_diff_max": 0.0}
    return {"lp_diff_mean": float(gap_R.mean()), "lp_diff_max": float(gap_R.max())}


def truncated_is_weights(trainer_NT: torch.Tensor, rollout_NT: torch.Tensor, mask_NT: torch.Tensor,
                         cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token min(exp(trainer - rollout), cap) on the mask, 1 off it (constants: no gradient), and metrics:
    the mean weight and the share of tokens the cap truncated, over the mask."""
    if not cap >= 1.0:
        raise UserError(f"the importance-sampling cap must be >= 1 (a cap below 1 down-weights every token), got {cap}")
    on_NT = mask_NT != 0
    log_ratio_NT = torch.where(on_NT, trainer_NT.detach() - rollout_NT.detach(), 0.0)
    ratio_NT = torch.exp(log_ratio_NT)
    weights_NT = torch.clamp(ratio_NT, max=cap)
    count = int(on_NT.sum())
    if count == 0:
        return weights_NT, {"is_weight_mean": 1.0, "is_truncated_frac": 0.0}
    return weights_NT, {"is_weight_mean": float(weights_NT[on_NT].mean()),
                        "is_truncated_frac": float((ratio_NT[on_NT] > cap).float().mean())}
