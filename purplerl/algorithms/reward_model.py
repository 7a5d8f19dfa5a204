"""Reward-model math: a sequence's score from per-token values, the Bradley-Terry loss, and an ensemble's reward.

A scalar head gives a value at every position (values_NT, the engine's `values`); a reward model reads it at each
sequence's last real token, which has seen the whole prompt and answer (as an HF sequence classifier scores its
last non-pad token). The Bradley-Terry model (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1) takes
P(chosen > rejected) = sigmoid(r_c - r_r), so the loss is its negative log-likelihood.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from purplerl.errors import ExperimentError, UserError

Metrics = dict[str, float]


def last_token_values(values_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """values_N: each row's value at its last position where mask_NT is nonzero (the attention mask's last real
    token, or the loss mask's last answer token: the same one when the answer ends the sequence)."""
    if values_NT.shape != mask_NT.shape:
        raise ExperimentError(f"values {tuple(values_NT.shape)} and mask {tuple(mask_NT.shape)} differ in shape")
    present_NT = mask_NT != 0
    if not bool(present_NT.any(-1).all()):
        row = int((~present_NT.any(-1)).nonzero()[0])
        raise ExperimentError(f"row {row} has no token to read a value at (its mask is all 0)")
    positions_T = torch.arange(mask_NT.shape[1], device=mask_NT.device)
    last_N = (present_NT * positions_T).argmax(-1)
    return values_NT.gather(1, last_N[:, None])[:, 0]


def check_center_coef(value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise UserError(f"bradley_terry center_coef must be >= 0, got {value}")


def bradley_terry_loss(chosen_P: torch.Tensor, rejected_P: torch.Tensor, margins_P: torch.Tensor | None = None,
                       center_coef: float = 0.0) -> tuple[torch.Tensor, Metrics]:
    """mean over pairs of -log sigmoid(r_c - r_r - m), plus center_coef * mean((r_c + r_r)^2).

    m is the pair's margin (Llama 2, Touvron et al. 2023 sec. 3.2.2: a larger margin for a clearer preference;
    TRL's RewardTrainer takes it from a `margin` column), 0 without margins. The second term (Eisenstein et al.
    2023, arXiv 2312.09244; TRL's `center_rewards_coefficient`) pulls the rewards towards mean zero, which the
    loss alone leaves free (it sees only differences), so rewards of separately trained models are comparable.

    Metrics: `accuracy`, the share of pairs with r_c > r_r (a tie is not a correct preference); `margin`, the
    mean of r_c - r_r; `chosen` and `rejected`, the mean rewards; `center_loss` when center_coef > 0."""
    if chosen_P.shape != rejected_P.shape or chosen_P.ndim != 1 or chosen_P.numel() == 0:
        raise ExperimentError(f"bradley_terry: chosen {tuple(chosen_P.shape)} and rejected "
                              f"{tuple(rejected_P.shape)} must be the same [P >= 1]")
    if margins_P is not None and margins_P.shape != chosen_P.shape:
        raise ExperimentError(f"bradley_terry: margins {tuple(margins_P.shape)} do not match the "
                              f"{chosen_P.shape[0]} pairs")
    check_center_coef(center_coef)
    diff_P = chosen_P - rejected_P
    logits_P = diff_P if margins_P is None else diff_P - margins_P.to(diff_P.dtype)
    loss = -F.logsigmoid(logits_P).mean()
    detached = diff_P.detach()
    metrics = {"accuracy": float((detached > 0).float().mean()), "margin": float(detached.mean()),
               "chosen": float(chosen_P.detach().mean()), "rejected": float(rejected_P.detach().mean())}
    if center_coef > 0:
        center = center_coef * ((chosen_P + rejected_P) ** 2).mean()
        loss = loss + center
        metrics["center_loss"] = float(center.detach())
    return loss, metrics


def ensemble_reward(scores_KN: torch.Tensor, penalty: float = 0.0) -> tuple[torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]:
    """(mean_N, std_N, reward_N) of K members' scores of N answers: the members' mean, their standard deviation
    (over the K members, population form: the ensemble is the whole population), and mean - penalty * std.

    The penalty is the uncertainty-weighted reward of Coste et al. 2023 (arXiv 2310.02743), which lowers the
    reward where the members disagree, the answers the policy could exploit; their UWO subtracts the variance,
    the standard deviation here keeps the penalty in the reward's own units. K = 1 gives std 0."""
    if scores_KN.ndim != 2 or scores_KN.shape[0] == 0:
        raise ExperimentError(f"ensemble scores must be [K >= 1, N], got {tuple(scores_KN.shape)}")
    if not (math.isfinite(penalty) and penalty >= 0):
        raise UserError(f"the ensemble's uncertainty penalty must be >= 0, got {penalty}")
    mean_N = scores_KN.mean(0)
    std_N = scores_KN.std(0, unbiased=False)
    return mean_N, std_N, mean_N - penalty * std_N


def ensemble_pair_metrics(chosen_KP: torch.Tensor, rejected_KP: torch.Tensor) -> Metrics:
    """Held-out metrics of K members' scores of P pairs: the ensemble (the members' mean) decides each pair.

    `accuracy`: the share of pairs whose chosen answer the ensemble scores higher (a tie is wrong); `margin`: the
    mean of its r_c - r_r; `loss`: its Bradley-Terry loss (no margin); `member_accuracy`: the members' own
    accuracies, averaged; `std`: the members' standard deviation over the K scores of an answer, averaged over
    every answer (0 for one member)."""
    if chosen_KP.shape != rejected_KP.shape or chosen_KP.ndim != 2 or chosen_KP.numel() == 0:
        raise ExperimentError(f"ensemble pair scores must be two equal [K, P >= 1], got {tuple(chosen_KP.shape)} "
                              f"and {tuple(rejected_KP.shape)}")
    diff_P = chosen_KP.mean(0) - rejected_KP.mean(0)
    both_KN = torch.cat([chosen_KP, rejected_KP], dim=1)
    return {"accuracy": float((diff_P > 0).float().mean()), "margin": float(diff_P.mean()),
            "loss": float(-F.logsigmoid(diff_P).mean()),
            "member_accuracy": float((chosen_KP > rejected_KP).float().mean()),
            "std": float(both_KN.std(0, unbiased=False).mean())}
