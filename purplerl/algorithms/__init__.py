"""Pure tensor math: advantages, KL estimators, log-prob helpers, policy-gradient losses, Token Noiser, direct
preference losses (DPO, IPO, SimPO, KTO, ORPO).

Every function takes its knobs as arguments; nothing here imports config, engines or the trainer.
"""

from purplerl.algorithms import pairwise  # noqa: F401 -- registers the pairwise losses
from purplerl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGES,
    AdvantageFn,
    TokenAdvantageFn,
    check_rewards_BG,
    compute_advantages,
    dr_grpo_advantages,
    get_advantage_estimator,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    zscore,
)
from purplerl.algorithms.kl import KL_ESTIMATORS, get_kl_estimator, kl_k1, kl_k2, kl_k3, sequence_kl
from purplerl.algorithms.logprobs import entropy_from_logits, masked_mean, masked_sum, selective_log_softmax
from purplerl.algorithms.losses import (
    LOSS_AGGREGATIONS,
    AggregationFn,
    LossFn,
    aggregate_loss,
    aggregate_token_mean,
    importance_sampling_loss,
    kl_penalty_loss,
    ppo_clip_loss,
)
from purplerl.algorithms.noiser import normalize_noise, token_noiser_loss
from purplerl.algorithms.preference import dpo_loss, kto_loss, log1mexp, orpo_loss, sigmoid_loss, simpo_loss
from purplerl.algorithms.registry import LOSS_REGISTRY, CustomLoss, Loss, LossDef, get_loss_def, register_loss

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_ESTIMATORS",
    "AdvantageFn",
    "AggregationFn",
    "KL_ESTIMATORS",
    "LOSS_REGISTRY",
    "CustomLoss",
    "Loss",
    "LossDef",
    "get_loss_def",
    "register_loss",
    "LOSS_AGGREGATIONS",
    "LossFn",
    "TokenAdvantageFn",
    "aggregate_loss",
    "aggregate_token_mean",
    "check_rewards_BG",
    "compute_advantages",
    "dpo_loss",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "get_advantage_estimator",
    "get_kl_estimator",
    "grpo_advantages",
    "importance_sampling_loss",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty_loss",
    "kto_loss",
    "log1mexp",
    "masked_mean",
    "masked_sum",
    "normalize_noise",
    "orpo_loss",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "selective_log_softmax",
    "sequence_kl",
    "sigmoid_loss",
    "simpo_loss",
    "token_noiser_loss",
    "zscore",
]
