"""The optimizer and the step budget of every training recipe, and the policy-gradient loss, advantages and stop
rules of the RL recipes."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from purplerl.algorithms.names import CRITIC_ESTIMATOR_NAMES
from purplerl.config.base import Registry, Section, Spec, read_when

# choices: the algorithm registries' names (which each registry checks it holds), never typed again here
POLICY_LOSS = Registry("purplerl.algorithms.names:POLICY_GRADIENT_LOSS_NAMES", "policy-gradient loss").field()
ADVANTAGE = Registry("purplerl.algorithms.names:ESTIMATOR_NAMES", "advantage estimator").field()
LOSS_AGGREGATION = Registry("purplerl.algorithms.names:LOSS_AGGREGATION_NAMES", "loss aggregation").field()


class OptimizerSpec(Spec):
    """AdamW (Loshchilov & Hutter 2019) over the trained weights' fp32 masters; `adamw_8bit` keeps its two moments
    in 8 bits, blockwise quantized (bitsandbytes; Dettmers et al. 2022), a quarter of their memory."""

    shorthand: ClassVar[str] = "name"

    @field_validator("betas")
    @classmethod
    def _betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"each beta must be in [0, 1), got {list(betas)}")
        return betas

    name: Literal["adamw", "adamw_8bit"] = Field("adamw", description=(
        "'adamw' (fp32 moments) or 'adamw_8bit' (8-bit moments through bitsandbytes, local engine)"))
    betas: tuple[float, float] = Field((0.9, 0.999), description="(beta1, beta2), each in [0, 1)")
    eps: float = Field(1e-8, gt=0.0, description="epsilon")
    weight_decay: float = Field(0.0, ge=0.0, description="decoupled weight decay")


class TrainingConfig(Section):
    """The optimizer and the step budget: shared by every training recipe."""

    steps: int = Field(60, ge=1, description="number of training steps (one optimizer step each)")
    batch_size: int = Field(8, ge=1, description="prompts (RL) or examples (SFT) per step (B)")
    lr: float = Field(1e-4, gt=0.0, lt=1.0, description="AdamW learning rate")
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description=(
        "the optimizer: its name, or its fields (below) set one by one"))
    max_grad_norm: float = Field(1.0, ge=0.0, description="gradient-norm clip (0 disables)")
    seed: int = Field(0, description="seed for data order, sampling and LoRA init")


def _clipped(t: Any) -> bool:
    return t.loss != "importance_sampling"


def _collapse(t: Any) -> bool:
    return t.collapse_stop


def _critic(t: Any) -> bool:
    return t.advantage in CRITIC_ESTIMATOR_NAMES


def _no_critic(t: Any) -> bool:
    return not _critic(t)


def _clip_field(annotation: Any) -> Any:
    return read_when(annotation, _clipped, "training.loss clips the ratio (ppo_clip)")


def _critic_field(annotation: Any) -> Any:
    return read_when(annotation, _critic, "training.advantage takes a critic's values (gae)")


def _collapse_field(annotation: Any) -> Any:
    return read_when(annotation, _collapse, "training.collapse_stop is true")


class RLTrainingConfig(TrainingConfig):
    """An RL recipe's training: the optimizer, the policy-gradient loss, and the stop rules every RL recipe has."""

    loss: POLICY_LOSS = Field("importance_sampling", description="policy-gradient loss")
    clip_low: _clip_field(float) = Field(0.2, ge=0.0, lt=1.0, description="PPO clip epsilon below 1")
    clip_high: _clip_field(float) = Field(0.2, ge=0.0, description="PPO clip epsilon above 1 (> clip_low: clip-higher)")
    advantage: ADVANTAGE = Field("grpo", description="advantage estimator (algorithms.advantages)")
    gamma: _critic_field(float) = Field(1.0, ge=0.0, le=1.0, description=(
        "GAE discount of later tokens' rewards (1: none, TRL's default)"))
    lam: _critic_field(float) = Field(0.95, ge=0.0, le=1.0, description=(
        "GAE lambda (Schulman et al. 2016): 1 is the return minus the critic's value, 0 the one-step TD error; TRL's "
        "default 0.95"))
    loss_agg: LOSS_AGGREGATION = Field("token_mean", description=(
        "how per-token losses become one number (seq_mean_token_sum_norm: Dr. GRPO)"))
    ppo_epochs: int = Field(1, ge=1, le=64, description="passes over each rollout batch")
    mini_batches: int = Field(1, ge=1, description=(
        "optimizer steps per pass (the rollout batch is split into this many)"))
    old_logprobs: Literal["auto", "sampler", "current"] = Field("auto", description=(
        "behaviour logprobs of the importance ratio: 'sampler' (recorded while sampling), 'current' (the policy's own, "
        "detached: ratio 1, exact on-policy), 'auto' (current when each rollout batch gets one update, else sampler)"))
    early_stop_repetition: float | None = Field(0.5, description=(
        "stop when a step's mean repetition ratio (the repetition reward term, logged at any weight) exceeds this "
        "(null: never)"))
    collapse_stop: bool = Field(False, description=(
        "stop the run as failed when its completions collapse (empty, one identical text, or an entropy jump; defend "
        "turns it on)"))
    collapse_empty_frac: _collapse_field(float) = Field(0.25, ge=0.0, le=1.0, description=(
        "collapse: the share of empty completions above which a step has collapsed"))
    collapse_top_share: _collapse_field(float) = Field(0.9, ge=0.0, le=1.0, description=(
        "collapse: the share of a step's completions taken by one identical text above which it has collapsed"))
    collapse_entropy_swing: _collapse_field(float) = Field(2.0, gt=0.0, description=(
        "collapse: the largest change of mean token entropy (nats) from one step to the next"))
