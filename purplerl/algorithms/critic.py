"""The critic's math of PPO with a value function, the classic RLHF loop (Ziegler et al. 2019, arXiv 1909.08593;
InstructGPT, Ouyang et al. 2022): per-token rewards, GAE advantages and returns (Schulman et al. 2016, arXiv
1506.02438), masked whitening, explained variance, and the clipped value loss, which is registered here as
`ppo_value` (a "values" loss; purplerl.algorithms.advantages imports this module, so the loss is registered once
the package is); the estimator `gae_advantages` is registered in algorithms.advantages (CRITIC_ESTIMATORS).

Per-token tensors are aligned to targets (purplerl.types): column t of a row is token t. The value V_t of a
completion token is the critic's estimate of the return from the state before the token, so the head is read at
position t - 1 (`state_values`), as veRL reads its critic's values (the model output shifted left by one token for
log-probs and values: `no_padding_2_padding` in verl.workers.utils.padding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from purplerl.algorithms.checks import check_knobs, check_mask, check_rewards_BG, check_token_tensor
from purplerl.algorithms.logprobs import masked_mean
from purplerl.algorithms.registry import LossDef, Metrics, register_loss
from purplerl.errors import ExperimentError, UserError


def state_values(values_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """The head's values at every position [N, T] -> each target token's state value [N, T]: the value at position
    t - 1 under token t, 0 off the mask. Keeps the gradient."""
    shifted_NT = F.pad(values_NT[:, :-1], (1, 0))
    return torch.where(mask_NT != 0, shifted_NT, 0.0)


def token_rewards(rewards_N: torch.Tensor, mask_NT: torch.Tensor, kl_NT: torch.Tensor | None = None,
                  kl_beta: float = 0.0) -> torch.Tensor:
    """r_t = -kl_beta * kl_t on each completion token, plus the sequence reward R at the row's last completion
    token (Ziegler et al. 2019; veRL's `apply_kl_penalty` in verl.trainer.ppo.ray_trainer), 0 off the mask: float32
    [N, T]."""
    on_NT = mask_NT != 0
    r_NT = torch.zeros(mask_NT.shape, dtype=torch.float32, device=mask_NT.device)
    if kl_NT is not None and kl_beta > 0:
        r_NT = torch.where(on_NT, -kl_beta * kl_NT.detach().float(), 0.0)
    positions_T = torch.arange(mask_NT.shape[1], device=mask_NT.device)
    last_N = (on_NT * positions_T).argmax(-1)
    rows_N = torch.arange(mask_NT.shape[0], device=mask_NT.device)
    r_NT[rows_N, last_N] += rewards_N.detach().float().to(mask_NT.device)
    return r_NT


@torch.no_grad()
def gae(rewards_NT: torch.Tensor, values_NT: torch.Tensor, mask_NT: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over each row's completion tokens: (advantages_NT, returns_NT), 0 off it.

        delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lam * A_next,   returns_t = A_t + V_t

    where `next` is the row's next completion token (off-mask positions are skipped, as veRL's
    `compute_gae_advantage_return` skips them) and V, A are 0 after the last one: the episode ends with the
    completion. lam = 1 gives the Monte-Carlo return minus V, lam = 0 the one-step TD error."""
    on_NT = mask_NT != 0
    rewards_NT, values_NT = rewards_NT.float(), values_NT.detach().float()
    advantages_NT = torch.zeros_like(rewards_NT)
    next_value_N = torch.zeros(rewards_NT.shape[0], device=rewards_NT.device)
    next_advantage_N = torch.zeros_like(next_value_N)
    start = int(on_NT.any(0).int().argmax()) if bool(on_NT.any()) else rewards_NT.shape[1]  # prompts come first
    for t in reversed(range(start, rewards_NT.shape[1])):
        delta_N = rewards_NT[:, t] + gamma * next_value_N - values_NT[:, t]
        advantage_N = delta_N + gamma * lam * next_advantage_N
        on_N = on_NT[:, t]
        advantages_NT[:, t] = torch.where(on_N, advantage_N, 0.0)
        next_value_N = torch.where(on_N, values_NT[:, t], next_value_N)
        next_advantage_N = torch.where(on_N, advantage_N, next_advantage_N)
    returns_NT = torch.where(on_NT, advantages_NT + values_NT, 0.0)
    return advantages_NT, returns_NT


def masked_whiten(x_NT: torch.Tensor, mask_NT: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) * rsqrt(var + eps) over the masked entries of the whole batch, 0 off the mask, the variance with
    Bessel's correction: veRL's `masked_whiten` and `masked_var` (verl.utils.torch_functional, eps 1e-8 there);
    shift_mean=False adds the mean back. Needs two masked entries (one has no variance).

    The package's one whitening of per-token advantages: GAE (`gae_advantages`) and REINFORCE++
    (algorithms.advantages) both whiten with it, as veRL's `compute_gae_advantage_return` and
    `compute_reinforce_plus_plus_outcome_advantage` both call its `masked_whiten`. The group estimators' std
    scaling and the reward z-score are another operation, on one value per completion: population std + eps
    (`grpo_advantages`, `zscore`)."""
    on_NT = mask_NT != 0
    count = int(on_NT.sum())
    if count < 2:
        raise ExperimentError(f"masked_whiten: {count} masked value(s); whitening needs at least 2")
    values = x_NT[on_NT].float()
    mean = values.mean()
    var = ((values - mean) ** 2).sum() / (count - 1)
    whitened_NT = (x_NT.float() - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened_NT = whitened_NT + mean
    return torch.where(on_NT, whitened_NT, 0.0)


def explained_variance(values_NT: torch.Tensor, returns_NT: torch.Tensor, mask_NT: torch.Tensor) -> float:
    """1 - Var[R - V] / Var[R] over the masked tokens: 1 when the critic predicts every return, 0 when it does no
    better than their mean, negative when worse; 0 when the returns do not vary (nothing to explain)."""
    on_NT = mask_NT != 0
    returns, values = returns_NT[on_NT].float(), values_NT[on_NT].float()
    var_returns = float(returns.var(unbiased=False))
    if var_returns < 1e-12:
        return 0.0
    return 1.0 - float((returns - values).var(unbiased=False)) / var_returns


def clipped_value_loss(values_NT: torch.Tensor, old_values_NT: torch.Tensor, returns_NT: torch.Tensor,
                       mask_NT: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, Metrics]:
    """0.5 * masked mean of max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2): PPO's clipped value loss in the
    form of veRL's `compute_value_loss` (verl.trainer.ppo.core_algos; token mean over the batch). The clip keeps the
    critic near the values the advantages were computed with, as the ratio clip keeps the policy near its own.

    Metrics: `value_loss` (this loss), `value_clip_frac` (share of tokens where the clipped term is the larger:
    its gradient is cut), `value_mean` (mean predicted value)."""
    if not (math.isfinite(clip_range) and clip_range > 0):
        raise UserError(f"the value loss's clip range must be > 0, got {clip_range}")
    old_NT, returns_NT = old_values_NT.detach(), returns_NT.detach()
    clipped_NT = old_NT + (values_NT - old_NT).clamp(-clip_range, clip_range)
    unclipped_loss_NT = (values_NT - returns_NT) ** 2
    clipped_loss_NT = (clipped_NT - returns_NT) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_loss_NT, clipped_loss_NT), mask_NT)
    with torch.no_grad():
        metrics = {"value_loss": float(loss.detach()),
                   "value_clip_frac": float(masked_mean((clipped_loss_NT > unclipped_loss_NT).float(), mask_NT)),
                   "value_mean": float(masked_mean(values_NT.detach(), mask_NT))}
    return loss, metrics


# ----- the estimator (registered in algorithms.advantages: CRITIC_ESTIMATORS) ------------------------------------


class CriticAdvantageFn(Protocol):
    def __call__(self, rewards_BG: torch.Tensor, mask_NT: torch.Tensor, values_NT: torch.Tensor, *,
                 kl_NT: torch.Tensor | None = ..., kl_beta: float = ..., gamma: float = ..., lam: float = ...,
                 eps: float = ...) -> tuple[torch.Tensor, torch.Tensor, Metrics]: ...


def gae_advantages(rewards_BG: torch.Tensor, mask_NT: torch.Tensor, values_NT: torch.Tensor, *,
                   kl_NT: torch.Tensor | None = None, kl_beta: float = 0.0, gamma: float = 1.0, lam: float = 1.0,
                   eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor, Metrics]:
    """GAE advantages and returns from a critic's values (Schulman et al. 2016, arXiv 1506.02438), as PPO's RLHF
    loop computes them (Ziegler et al. 2019; veRL's `compute_gae_advantage_return`, verl.trainer.ppo.core_algos).

    Each completion token gets the reward r_t = -kl_beta * kl_t and the row's sequence reward is added at its last
    completion token (`token_rewards`); `values_NT` are the critic's values of the completion tokens'
    states (aligned to targets, `state_values`). `gae` gives the advantages A and the returns
    A + V (the critic's targets); the advantages are then whitened over ALL completion tokens of the batch
    (`masked_whiten`, veRL's form: unbiased variance, rsqrt(var + eps)). Returns (advantages_NT,
    returns_NT, metrics), both float32 and 0 off the mask. G = 1 is allowed (no group is needed).

    Metrics, over the completion tokens: `adv_mean` and `adv_std` (before whitening), `adv_abs_mean` (after),
    `return_mean`, `return_std`, `value_mean`, `explained_variance` (of the returns by the values) and
    `kl_reward_mean` (mean of -kl_beta * kl)."""
    who = "gae"
    check_knobs(who, kl_beta, eps)
    for knob, value in (("gamma", gamma), ("lam", lam)):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise UserError(f"{who}: {knob} must be in [0, 1], got {value}")
    check_rewards_BG(rewards_BG, who, min_group_size=1)
    on_NT = check_mask(rewards_BG, mask_NT, who)
    check_token_tensor(who, "value", "values_NT", values_NT, mask_NT, on_NT)
    if kl_beta > 0:
        if kl_NT is None:
            raise ExperimentError(f"{who}: kl_beta={kl_beta} but no per-token KL (kl_NT) was given")
        check_token_tensor(who, "KL", "kl_NT", kl_NT, mask_NT, on_NT)
    values_NT = torch.where(on_NT, values_NT.detach().float(), 0.0)
    rewards_NT = token_rewards(rewards_BG.reshape(-1), mask_NT, kl_NT, kl_beta)
    raw_NT, returns_NT = gae(rewards_NT, values_NT, mask_NT, gamma, lam)
    advantages_NT = masked_whiten(raw_NT, mask_NT, eps=eps)
    metrics = {
        "adv_mean": float(raw_NT[on_NT].mean()), "adv_std": float(raw_NT[on_NT].std(unbiased=False)),
        "adv_abs_mean": float(advantages_NT[on_NT].abs().mean()),
        "return_mean": float(returns_NT[on_NT].mean()), "return_std": float(returns_NT[on_NT].std(unbiased=False)),
        "value_mean": float(values_NT[on_NT].mean()),
        "explained_variance": explained_variance(values_NT, returns_NT, mask_NT),
        "kl_reward_mean": -kl_beta * float(kl_NT[on_NT].float().mean()) if kl_beta > 0 else 0.0,
    }
    return advantages_NT, returns_NT, metrics


# ----- the registered value loss --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueLossParams:
    clip_range: float = 0.2  # c of clip(V, V_old - c, V_old + c): veRL's cliprange_value (0.2: TRL's old default)
    coef: float = 0.1  # the loss's weight, TRL's old vf_coef (the critic has its own optimizer: it scales its gradient)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_range) and self.clip_range > 0):
            raise UserError(f"ppo_value clip_range must be > 0, got {self.clip_range}")
        if not (math.isfinite(self.coef) and self.coef > 0):
            raise UserError(f"ppo_value coef must be > 0, got {self.coef}")


def ppo_value_loss(values_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                   params: ValueLossParams) -> tuple[torch.Tensor, Metrics]:
    """coef x `clipped_value_loss` of the active head's state values against the batch's returns, clipped around
    the values it had when the rollout was scored (TrainBatch.old_values_NT, returns_NT), on the loss mask."""
    mask_NT = inputs["loss_mask_NT"]
    loss, metrics = clipped_value_loss(state_values(values_NT, mask_NT), inputs["old_values_NT"],
                                       inputs["returns_NT"], mask_NT, params.clip_range)
    return params.coef * loss, metrics


register_loss(LossDef("ppo_value", ppo_value_loss, "values", ValueLossParams, inputs=("old_values_NT", "returns_NT"),
                      doc="PPO's clipped value loss of a critic's head against GAE returns (veRL's form)"))
