"""Frozen dataclasses shared by every layer.

Shape suffixes: B prompts in a batch, G completions per prompt (group), N = B*G sequences,
T tokens (padded), V vocabulary. Per-token tensors over a sequence are aligned to *targets*: entry t
is about token t given tokens < t, so entry 0 of a sequence is always masked out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch


@dataclass(frozen=True)
class PromptRecord:
    """One prompt as loaded from a data source, before rendering."""

    messages: tuple[dict[str, str], ...]  # chat messages [{role, content}], the last one from the user
    category: str = "unknown"  # harm category when the source has one
    source: str = "unknown"  # data source name (veRL's `data_source`)
    uid: str = ""  # stable id within the source, for joining samples across runs


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn. Logprobs/entropies are of softmax(logits / temperature)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus truncation applied when drawing; logprobs ignore the truncation
    top_k: int = 0  # 0 disables top-k truncation
    seed: int = 0  # sampling is a pure function of (weights, prompts, seed)


@dataclass(frozen=True)
class Completion:
    """One sampled continuation of one prompt."""

    prompt_tokens: tuple[int, ...]  # rendered prompt, length P
    tokens: tuple[int, ...]  # sampled tokens, length C (includes the stop token if one was drawn)
    logprobs_C: torch.Tensor  # float32 [C], log p(token_c | prefix) under the sampling distribution
    entropies_C: torch.Tensor  # float32 [C], entropy of the sampling distribution at each step
    text: str  # decoded completion without special tokens
    finish_reason: Literal["stop", "length"]  # stop token drawn, or max_new_tokens reached


@dataclass(frozen=True)
class Group:
    """The G completions of one prompt, and the prompt they answer."""

    prompt: PromptRecord
    completions: tuple[Completion, ...]  # length G


@dataclass(frozen=True)
class TrainBatch:
    """Token-level training data for `Engine.forward_backward`, right-padded to T."""

    input_ids_NT: torch.Tensor  # long [N, T], prompt + completion tokens, pad after the end
    attention_mask_NT: torch.Tensor  # long [N, T], 1 on real tokens
    loss_mask_NT: torch.Tensor  # float [N, T], 1 on completion tokens (as targets), else 0
    sampling_logprobs_NT: torch.Tensor  # float [N, T], logprobs recorded when sampling, 0 off-mask
    advantages_NT: torch.Tensor  # float [N, T], advantage per target token, 0 off-mask
    ref_logprobs_NT: torch.Tensor | None = None  # float [N, T], frozen-base logprobs (KL in loss)

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids_NT.shape)
        for name in ("attention_mask_NT", "loss_mask_NT", "sampling_logprobs_NT", "advantages_NT"):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"TrainBatch.{name} has shape {tuple(getattr(self, name).shape)}, "
                                 f"expected {shape}")
        if self.ref_logprobs_NT is not None and tuple(self.ref_logprobs_NT.shape) != shape:
            raise ValueError(f"TrainBatch.ref_logprobs_NT has shape {tuple(self.ref_logprobs_NT.shape)}")

    def select(self, rows: torch.Tensor) -> TrainBatch:
        """The batch restricted to the given row indices (a PPO minibatch, or the Token Noiser's rows)."""
        ref = None if self.ref_logprobs_NT is None else self.ref_logprobs_NT[rows]
        return TrainBatch(self.input_ids_NT[rows], self.attention_mask_NT[rows], self.loss_mask_NT[rows],
                          self.sampling_logprobs_NT[rows], self.advantages_NT[rows], ref)

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids_NT.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask_NT.sum().item())


@dataclass(frozen=True)
class LossSpec:
    """Which policy-gradient loss `forward_backward` computes, with its knobs."""

    name: str = "importance_sampling"  # key in algorithms.losses.LOSSES
    clip_low: float = 0.2  # PPO ratio clip below 1 (1 - clip_low)
    clip_high: float = 0.2  # PPO ratio clip above 1 (1 + clip_high); > clip_low is DAPO clip-higher
    temperature: float = 1.0  # logits are divided by this, matching the sampling distribution
    kl_beta: float = 0.0  # weight of a KL(policy || ref) term inside the loss (needs ref_logprobs_NT)
    kl_estimator: str = "k3"  # estimator for the in-loss KL term
    micro_batch_size: int = 64  # max sequences per forward pass; gradients accumulate to the full batch
    micro_batch_tokens: int = 4096  # max padded tokens per forward pass (length-sorted sequences fill it)
    aggregation: str = "token_mean"  # key in algorithms.losses.LOSS_AGGREGATIONS
    length_norm: float | None = None  # constant divisor of seq_mean_token_sum_norm (Dr. GRPO): max_new_tokens
    epsilon: float = 0.1  # Token Noiser: weight of the noise cross-entropy
    noise_seed: int = 0  # Token Noiser: seed of the random noise distributions
    # behaviour-policy logprobs of the ratio: "sampler" (the batch's sampling_logprobs_NT) or "current" (the
    # policy's own, detached: exact when the batch gets one update, whatever numerics the sampler used)
    old_logprobs: str = "sampler"


@dataclass(frozen=True)
class AdamParams:
    """One AdamW step (Tinker's `AdamParams` plus grad clipping)."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0 disables clipping


@dataclass(frozen=True)
class RewardBreakdown:
    """Reward components for N completions; every array has length N."""

    total_N: torch.Tensor  # float [N], the reward the advantages are computed from
    components: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> float [N]


@dataclass(frozen=True)
class StepMetrics:
    """What one RL step reports (one line of metrics.jsonl)."""

    step: int
    values: dict[str, float]  # flat metric name -> value, e.g. "reward/mean", "toxicity/mean"
    seconds: float  # wall time of the step
