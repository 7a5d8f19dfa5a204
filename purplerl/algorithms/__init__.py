"""Pure tensor math: advantages, KL estimators, log-prob helpers, policy-gradient losses.

Every function takes its knobs as arguments; nothing here imports config, engines or the trainer.
"""

from purplerl.algorithms.advantages import ADVANTAGES, AdvantageFn, check_rewards_BG, grpo_advantages, zscore
from purplerl.algorithms.kl import KL_ESTIMATORS, get_kl_estimator, kl_k1, kl_k2, kl_k3, sequence_kl
from purplerl.algorithms.logprobs import entropy_from_logits, masked_mean, masked_sum, selective_log_softmax
from purplerl.algorithms.losses import (
    LOSSES,
    LossFn,
    aggregate_token_mean,
    get_loss,
    importance_sampling_loss,
    kl_penalty_loss,
    ppo_clip_loss,
)

__all__ = [
    "ADVANTAGES",
    "AdvantageFn",
    "KL_ESTIMATORS",
    "LOSSES",
    "LossFn",
    "aggregate_token_mean",
    "check_rewards_BG",
    "entropy_from_logits",
    "get_kl_estimator",
    "get_loss",
    "grpo_advantages",
    "importance_sampling_loss",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty_loss",
    "masked_mean",
    "masked_sum",
    "ppo_clip_loss",
    "selective_log_softmax",
    "sequence_kl",
    "zscore",
]
