"""The names each registry of this package holds, without its functions: the settings check a value and list the
choices (--help) by these, without loading torch. Each registry checks when it is imported that it holds exactly
these names, so a new entry is named here too."""

from __future__ import annotations

from collections.abc import Iterable

KL_ESTIMATOR_NAMES = ("k1", "k2", "k3")  # algorithms.kl.KL_ESTIMATORS
LOSS_AGGREGATION_NAMES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")  # losses.LOSS_AGGREGATIONS
# the registered losses that train on advantages (PolicyGradientParams): training.loss's choices
POLICY_GRADIENT_LOSS_NAMES = ("importance_sampling", "ppo_clip")
# training.advantage's choices: the estimators without a critic, then those that take its values (advantages.py)
ADVANTAGE_ESTIMATOR_NAMES = ("grpo", "grpo_std", "dr_grpo", "rloo", "reinforce_pp")
CRITIC_ESTIMATOR_NAMES = ("gae",)
ESTIMATOR_NAMES = (*ADVANTAGE_ESTIMATOR_NAMES, *CRITIC_ESTIMATOR_NAMES)
# how a process reward model's step probabilities become one answer's reward (process_reward.STEP_AGGREGATIONS)
STEP_AGGREGATION_NAMES = ("min", "last", "product", "mean")


def check_names(what: str, registered: Iterable[str], names: tuple[str, ...]) -> None:
    """Raise when a registry holds other names than those declared for it here."""
    if tuple(registered) != names:
        raise ValueError(f"the {what} registered are {tuple(registered)}, but purplerl.algorithms.names declares "
                         f"{names}: declare each one there")
