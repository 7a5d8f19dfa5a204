"""Advantage estimators: rewards of G completions per prompt -> an advantage per completion token.

Two levels, both registries:

- `ADVANTAGES` holds the sequence-level estimators (GRPO, Dr. GRPO, RLOO), each called as
  `fn(rewards_BG, scale_by_std=..., eps=...)` and returning `(advantages_BG, metrics)`: one advantage per
  completion, computed against the other completions of its group.
- `ADVANTAGE_ESTIMATORS` holds every estimator at token level, called through `compute_advantages(name,
  rewards_BG, mask_NT, ...)` and returning `(advantages_NT, metrics)`. A sequence-level estimator puts its
  advantage on every completion token of its row; REINFORCE++ computes per-token returns.
- `CRITIC_ESTIMATORS` holds the estimators that take a critic's values (GAE), which also give the critic's
  returns. `estimate_advantages` calls an estimator of either registry and is what the loop calls.

Rows are group-major: row b*G + g of an [N, T] tensor is completion g of prompt b (N = B*G), and
`mask_NT` marks the completion tokens as targets (see `purplerl.types`). A new estimator is a new
function in a registry, never a branch in the training loop.

Knob errors (unknown name, a knob an estimator does not allow) raise UserError; bad data (empty batch,
non-finite rewards or KL, mismatched shapes, a completion without tokens) raises ExperimentError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from purplerl.algorithms.checks import check_knobs, check_mask, check_rewards_BG, check_token_tensor
from purplerl.algorithms.critic import CriticAdvantageFn, gae_advantages, masked_whiten
from purplerl.algorithms.names import ADVANTAGE_ESTIMATOR_NAMES, CRITIC_ESTIMATOR_NAMES, check_names
from purplerl.errors import ExperimentError, UserError

# Rewards whose max and min differ by less than this count as one value (a zero-variance group).
_EQUAL_TOL = 1e-8

Metrics = dict[str, float]


class AdvantageFn(Protocol):
    def __call__(self, rewards_BG: torch.Tensor, *, scale_by_std: bool = ...,
                 eps: float = ...) -> tuple[torch.Tensor, Metrics]: ...


class TokenAdvantageFn(Protocol):
    def __call__(self, rewards_BG: torch.Tensor, mask_NT: torch.Tensor, *, kl_NT: torch.Tensor | None = ...,
                 kl_beta: float = ..., scale_by_std: bool = ...,
                 eps: float = ...) -> tuple[torch.Tensor, Metrics]: ...


def _zero_variance_B(rewards_BG: torch.Tensor) -> torch.Tensor:
    return (rewards_BG.max(dim=1).values - rewards_BG.min(dim=1).values) < _EQUAL_TOL


def _finish_group(rewards_BG: torch.Tensor, advantages_BG: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Exact zeros for constant groups, plus the metrics every group estimator reports."""
    flat_B = _zero_variance_B(rewards_BG)
    # The float mean of equal values can be off by an ulp; such groups get exact zeros, not noise.
    advantages_BG = torch.where(flat_B[:, None], 0.0, advantages_BG)
    metrics = {
        "frac_zero_variance_groups": float(flat_B.float().mean().item()),
        "adv_abs_mean": float(advantages_BG.abs().mean().item()),
    }
    return advantages_BG, metrics


def grpo_advantages(rewards_BG: torch.Tensor, scale_by_std: bool = False,
                    eps: float = 1e-6) -> tuple[torch.Tensor, Metrics]:
    """GRPO advantages: reward minus its group mean, optionally divided by (group std + eps).

    DeepSeekMath (arXiv 2402.03300) divides by the group std; Dr. GRPO (arXiv 2503.20783) shows that
    the division up-weights near-uniform groups, so it is off by default. The std is the population
    std (unbiased=False): a group of two rewards {0, 1} gets advantages {-1, +1} when scaled.
    A group whose rewards are all equal gets all-zero advantages (it carries no learning signal).

    Metrics: `frac_zero_variance_groups` (share of groups with max - min < 1e-8) and
    `adv_abs_mean` (mean |advantage| over the batch).
    """
    check_rewards_BG(rewards_BG, "grpo_advantages")
    rewards_BG = rewards_BG.detach().float()
    advantages_BG = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    if scale_by_std:
        std_B1 = rewards_BG.std(dim=1, unbiased=False, keepdim=True)
        advantages_BG = advantages_BG / (std_B1 + eps)
    return _finish_group(rewards_BG, advantages_BG)


def grpo_std_advantages(rewards_BG: torch.Tensor, *, scale_by_std: bool = False,
                        eps: float = 1e-6) -> tuple[torch.Tensor, Metrics]:
    """GRPO as DeepSeekMath (arXiv 2402.03300) defines it: reward minus its group mean, divided by (group std +
    eps) (`grpo_advantages` with `scale_by_std`); Dr. GRPO (arXiv 2503.20783) is why plain 'grpo' does not.
    `scale_by_std` is accepted for a uniform call and unused: this estimator always divides."""
    check_rewards_BG(rewards_BG, "grpo_std_advantages")
    return grpo_advantages(rewards_BG, scale_by_std=True, eps=eps)


def _refuse_std(scale_by_std: bool, who: str, why: str) -> None:
    if scale_by_std:
        raise UserError(f"{who}: scale_by_std=True is not allowed: {why}; set it to False, or use 'grpo_std' "
                        f"to divide by the group std")


def dr_grpo_advantages(rewards_BG: torch.Tensor, *, scale_by_std: bool = False,
                       eps: float = 1e-6) -> tuple[torch.Tensor, Metrics]:
    """Dr. GRPO advantages (Liu et al. 2025, arXiv 2503.20783): reward minus its group mean, never scaled.

    Removing the division by the group std is half of Dr. GRPO's fix (the other half is the
    `seq_mean_token_sum_norm` loss aggregation). Asking for the division anyway raises UserError
    rather than silently producing GRPO; `eps` is accepted for a uniform call and unused.
    """
    _refuse_std(scale_by_std, "dr_grpo", "Dr. GRPO is defined by not dividing by the group std")
    check_rewards_BG(rewards_BG, "dr_grpo_advantages")
    rewards_BG = rewards_BG.detach().float()
    return _finish_group(rewards_BG, rewards_BG - rewards_BG.mean(dim=1, keepdim=True))


def rloo_advantages(rewards_BG: torch.Tensor, *, scale_by_std: bool = False,
                    eps: float = 1e-6) -> tuple[torch.Tensor, Metrics]:
    """RLOO advantages (Ahmadian et al. 2024, arXiv 2402.14740): A_i = r_i - mean of the other G-1 rewards.

    The leave-one-out baseline does not depend on r_i, so the estimator stays unbiased; algebraically
    A_i = G/(G-1) * (r_i - group mean). scale_by_std=True raises UserError (RLOO has no std division);
    `eps` is accepted for a uniform call and unused.
    """
    _refuse_std(scale_by_std, "rloo", "RLOO's leave-one-out baseline has no std division")
    check_rewards_BG(rewards_BG, "rloo_advantages")
    rewards_BG = rewards_BG.detach().float()
    group_size = rewards_BG.shape[1]
    centered_BG = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    return _finish_group(rewards_BG, centered_BG * (group_size / (group_size - 1)))


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
    "grpo_std": grpo_std_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}


def _sequence_level(name: str, seq_fn: AdvantageFn) -> TokenAdvantageFn:
    """Token-level form of a sequence-level estimator: its advantage on every completion token of the row."""

    def estimator(rewards_BG: torch.Tensor, mask_NT: torch.Tensor, *, kl_NT: torch.Tensor | None = None,
                  kl_beta: float = 0.0, scale_by_std: bool = False,
                  eps: float = 1e-6) -> tuple[torch.Tensor, Metrics]:
        check_knobs(name, kl_beta, eps)
        # A per-token KL has no place in a group baseline: for these estimators the KL enters the scalar
        # reward before the advantages, or the loss as its own term. Passing it here is a wiring bug.
        if kl_NT is not None and kl_beta > 0:
            raise ExperimentError(f"{name}: a per-token KL (kl_NT with kl_beta={kl_beta}) was passed to a "
                                  f"sequence-level estimator; put the KL in the reward or in the loss")
        advantages_BG, metrics = seq_fn(rewards_BG, scale_by_std=scale_by_std, eps=eps)
        on_NT = check_mask(rewards_BG, mask_NT, name)
        advantages_N1 = advantages_BG.reshape(-1, 1).to(mask_NT.device)
        return torch.where(on_NT, advantages_N1, 0.0), metrics

    estimator.__name__ = estimator.__qualname__ = f"{name}_token_advantages"
    estimator.__doc__ = f"`{seq_fn.__name__}` broadcast onto each row's completion tokens (0 elsewhere)."
    return estimator


def _last_masked_index(on_NT: torch.Tensor) -> torch.Tensor:
    """Column of the last True in each row (every row has one)."""
    num_tok = on_NT.shape[1]
    return (num_tok - 1) - on_NT.flip(dims=[1]).int().argmax(dim=1)


def _whitened_returns(x_NT: torch.Tensor, on_NT: torch.Tensor, eps: float) -> torch.Tensor:
    """`masked_whiten` over the masked entries of the whole batch, 0 off-mask; a batch whose masked values are all
    equal whitens to exact zeros, as `zscore` does (the float mean of equal values can be off by an ulp, which
    rsqrt(0 + eps) would magnify)."""
    values = x_NT[on_NT]
    if float((values.max() - values.min()).item()) < _EQUAL_TOL:
        return torch.zeros_like(x_NT, dtype=torch.float32)
    return masked_whiten(x_NT, on_NT, eps=eps)


def reinforce_pp_advantages(rewards_BG: torch.Tensor, mask_NT: torch.Tensor, *, kl_NT: torch.Tensor | None = None,
                            kl_beta: float = 0.0, scale_by_std: bool = False,
                            eps: float = 1e-8) -> tuple[torch.Tensor, Metrics]:
    """REINFORCE++ advantages (Hu 2025, arXiv 2501.03262): whitened per-token returns, no group baseline.

    Each completion token t gets the reward r_t = -kl_beta * kl_t, and the row's sequence reward is added
    at its last completion token. The return is G_t = sum_{s >= t} r_s over completion tokens (gamma = 1),
    and the advantages are the returns whitened over ALL completion tokens of the batch by `masked_whiten`
    (G - mean) * rsqrt(var + eps), the variance with Bessel's correction, 0 off-mask: the whitening of GAE, and
    the one veRL's `compute_reinforce_plus_plus_outcome_advantage` applies (verl.trainer.ppo.core_algos), so a
    run exported to veRL whitens alike. The KL therefore shapes every token's return, which is why it enters here
    and not the scalar reward.

    `kl_NT` ([N, T], finite on the mask; off-mask entries are ignored) is required when kl_beta > 0 and
    ignored when kl_beta = 0. Whitening already divides by the batch std, so `scale_by_std` does not
    apply and is ignored. G = 1 is allowed (no group is needed).
    Metrics: `frac_zero_variance_groups` (share of prompts whose rewards are all equal; 1.0 when G = 1),
    `adv_abs_mean` (mean |advantage| over completion tokens), `return_mean` and `return_std` (before
    whitening) and `kl_reward_mean` (mean of -kl_beta * kl over completion tokens).
    """
    who = "reinforce_pp"
    check_knobs(who, kl_beta, eps)
    check_rewards_BG(rewards_BG, who, min_group_size=1)
    on_NT = check_mask(rewards_BG, mask_NT, who)
    token_rewards_NT = torch.zeros(mask_NT.shape, dtype=torch.float32, device=mask_NT.device)
    if kl_beta > 0:
        if kl_NT is None:
            raise ExperimentError(f"{who}: kl_beta={kl_beta} but no per-token KL (kl_NT) was given")
        check_token_tensor(who, "KL", "kl_NT", kl_NT, mask_NT, on_NT)
        token_rewards_NT = torch.where(on_NT, -kl_beta * kl_NT.detach().float(), 0.0)
    kl_reward_mean = float(token_rewards_NT[on_NT].mean().item())
    rows_N = torch.arange(mask_NT.shape[0], device=mask_NT.device)
    rewards_N = rewards_BG.detach().float().reshape(-1).to(mask_NT.device)
    token_rewards_NT[rows_N, _last_masked_index(on_NT)] += rewards_N
    # Reverse cumulative sum along T: off-mask rewards are 0, so it sums the completion tokens s >= t.
    returns_NT = token_rewards_NT.flip(dims=[1]).cumsum(dim=1).flip(dims=[1])
    returns_NT = torch.where(on_NT, returns_NT, 0.0)
    advantages_NT = _whitened_returns(returns_NT, on_NT, eps)
    on_returns = returns_NT[on_NT]
    metrics = {
        "frac_zero_variance_groups": float(_zero_variance_B(rewards_BG.detach().float()).float().mean().item()),
        "adv_abs_mean": float(advantages_NT[on_NT].abs().mean().item()),
        "return_mean": float(on_returns.mean().item()),
        "return_std": float(on_returns.std(unbiased=False).item()),
        "kl_reward_mean": kl_reward_mean,
    }
    return advantages_NT, metrics


ADVANTAGE_ESTIMATORS: dict[str, TokenAdvantageFn] = {
    **{name: _sequence_level(name, fn) for name, fn in ADVANTAGES.items()},
    "reinforce_pp": reinforce_pp_advantages,
}
CRITIC_ESTIMATORS: dict[str, CriticAdvantageFn] = {"gae": gae_advantages}
check_names("advantage estimators", ADVANTAGE_ESTIMATORS, ADVANTAGE_ESTIMATOR_NAMES)
check_names("critic estimators", CRITIC_ESTIMATORS, CRITIC_ESTIMATOR_NAMES)
# training.advantage's choices: the estimators without a critic, then those that take its values
ESTIMATOR_NAMES = (*ADVANTAGE_ESTIMATORS, *CRITIC_ESTIMATORS)

# Estimators that take the per-token KL into their token rewards (so the KL must not also enter the scalar reward)
TOKEN_KL_ESTIMATORS = frozenset({"reinforce_pp", "gae"})


def _known(name: str) -> None:
    if name not in ESTIMATOR_NAMES:
        raise UserError(f"unknown advantage estimator '{name}' (known: {', '.join(sorted(ESTIMATOR_NAMES))})")


def takes_token_kl(name: str) -> bool:
    _known(name)
    return name in TOKEN_KL_ESTIMATORS


def takes_values(name: str) -> bool:
    """Whether estimator `name` needs a critic's values (and gives the critic's returns)."""
    _known(name)
    return name in CRITIC_ESTIMATORS


def get_advantage_estimator(name: str) -> TokenAdvantageFn:
    """Look up a token-level estimator by name, raising UserError that lists the known names."""
    if name in CRITIC_ESTIMATORS:
        raise UserError(f"advantage estimator '{name}' takes a critic's values: call estimate_advantages with them")
    if name not in ADVANTAGE_ESTIMATORS:
        raise UserError(f"unknown advantage estimator '{name}' (known: {', '.join(sorted(ADVANTAGE_ESTIMATORS))})")
    return ADVANTAGE_ESTIMATORS[name]


def compute_advantages(name: str, rewards_BG: torch.Tensor, mask_NT: torch.Tensor, *,
                       kl_NT: torch.Tensor | None = None, kl_beta: float = 0.0, scale_by_std: bool = False,
                       eps: float = 1e-6) -> tuple[torch.Tensor, Metrics]:
    """Per-token advantages [N, T] (float32, 0 off the mask) from rewards [B, G] with estimator `name`.

    Rows are group-major (row b*G + g); `mask_NT` marks completion tokens. `kl_NT` / `kl_beta` are the
    per-token KL and its weight in the token rewards, used only by `reinforce_pp`; a sequence-level
    estimator raises ExperimentError if given both (its KL belongs in the reward or the loss).
    `scale_by_std` divides GRPO advantages by the group std; dr_grpo and rloo refuse it (UserError),
    reinforce_pp always whitens and ignores it.
    """
    return get_advantage_estimator(name)(rewards_BG, mask_NT, kl_NT=kl_NT, kl_beta=kl_beta,
                                         scale_by_std=scale_by_std, eps=eps)



@dataclass(frozen=True)
class Estimate:
    """What an advantage estimator gives the loop."""

    advantages_NT: torch.Tensor  # float32 [N, T], 0 off the mask
    metrics: Metrics
    returns_NT: torch.Tensor | None = None  # float32 [N, T], the critic's targets (CRITIC_ESTIMATORS), else None


def estimate_advantages(name: str, rewards_BG: torch.Tensor, mask_NT: torch.Tensor, *,
                        kl_NT: torch.Tensor | None = None, kl_beta: float = 0.0,
                        values_NT: torch.Tensor | None = None, gamma: float = 1.0, lam: float = 1.0,
                        scale_by_std: bool = False, eps: float | None = None) -> Estimate:
    """Estimator `name` of either registry: `compute_advantages` for those without a critic, the critic's
    estimator (GAE) with the critic's values `values_NT` ([N, T], aligned to targets), `gamma` and `lam` for the
    others. `eps`: None keeps the estimator's own. GAE always whitens and ignores `scale_by_std`, as reinforce_pp.
    Values given to an estimator without a critic, or missing for one with, raise ExperimentError (a wiring bug)."""
    tolerance = {} if eps is None else {"eps": eps}
    if takes_values(name):
        if values_NT is None:
            raise ExperimentError(f"{name}: needs a critic's values of the completion tokens (values_NT)")
        advantages_NT, returns_NT, metrics = CRITIC_ESTIMATORS[name](
            rewards_BG, mask_NT, values_NT, kl_NT=kl_NT, kl_beta=kl_beta, gamma=gamma, lam=lam, **tolerance)
        return Estimate(advantages_NT, metrics, returns_NT)
    if values_NT is not None:
        raise ExperimentError(f"{name}: a critic's values were passed to an estimator without a critic")
    advantages_NT, metrics = compute_advantages(name, rewards_BG, mask_NT, kl_NT=kl_NT, kl_beta=kl_beta,
                                                scale_by_std=scale_by_std, **tolerance)
    return Estimate(advantages_NT, metrics)
