"""Frozen dataclasses shared by every layer.

Shape suffixes: B prompts in a batch, G completions per prompt (group), N = B*G sequences,
T tokens (padded), V vocabulary. Per-token tensors over a sequence are aligned to *targets*: entry t
is about token t given tokens < t, so entry 0 of a sequence is always masked out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from purplerl.errors import ExperimentError

if TYPE_CHECKING:  # the tensors come from whoever builds these; the CLI reads this module without loading torch
    import torch


@dataclass(frozen=True)
class PromptRecord:
    """One prompt as loaded from a data source, before rendering."""

    messages: tuple[dict[str, str], ...]  # chat messages [{role, content}], the last one from the user
    category: str = "unknown"  # harm category when the source has one
    source: str = "unknown"  # data source name (veRL's `data_source`)
    uid: str = ""  # stable id within the source, for joining samples across runs
    # the row's reference answer for rule-based rewards (veRL's reward_model.ground_truth, or a plain ground_truth
    # column), e.g. GSM8K's final number; None when the row has none
    ground_truth: str | None = None


def _is_bool(tensor: torch.Tensor) -> bool:
    import torch  # already loaded: a tensor exists

    return tensor.dtype == torch.bool


def _check_prompt(owner: str, prompt: tuple[dict[str, str], ...]) -> None:
    if not prompt or prompt[-1].get("role") != "user":
        raise ValueError(f"{owner}.prompt must be chat messages ending with the user's turn, got {prompt!r:.120}")


@dataclass(frozen=True)
class PreferencePair:
    """Two answers to one prompt, one preferred (DPO, IPO, SimPO and reward-model data; purplerl.data.preference)."""

    prompt: tuple[dict[str, str], ...]  # chat messages [{role, content}], possibly multi-turn, the last the user's
    chosen: str  # the preferred answer: the text of the assistant's final turn
    rejected: str  # the dispreferred answer to the same prompt; never equal to `chosen`
    source_row: str  # where the pair was read: 'FILE:LINE' (JSONL) or 'SOURCE row INDEX' (0-based; parquet, hf:)
    score_chosen: float | None = None  # the source's rating of `chosen` (UltraFeedback's score_chosen), if any
    score_rejected: float | None = None  # the source's rating of `rejected`, if any

    def __post_init__(self) -> None:
        _check_prompt("PreferencePair", self.prompt)
        if self.chosen == self.rejected:
            raise ValueError(f"PreferencePair from {self.source_row}: chosen and rejected are the same answer")


@dataclass(frozen=True)
class LabelledCompletion:
    """One answer to a prompt marked desirable or undesirable, without a partner (KTO's unpaired data)."""

    prompt: tuple[dict[str, str], ...]  # chat messages [{role, content}], possibly multi-turn, the last the user's
    completion: str  # the assistant's answer
    desirable: bool  # True: an answer to learn towards; False: one to learn away from
    source_row: str  # where it was read: 'FILE:LINE' (JSONL) or 'SOURCE row INDEX' (0-based; parquet, hf:)

    def __post_init__(self) -> None:
        _check_prompt("LabelledCompletion", self.prompt)


@dataclass(frozen=True)
class StepLabelledCompletion:
    """One answer to a prompt as its reasoning steps, each labelled correct or not (process supervision, Lightman
    et al. 2023; TRL's stepwise-supervision rows: prompt, completions, labels)."""

    prompt: tuple[dict[str, str], ...]  # chat messages [{role, content}], possibly multi-turn, the last the user's
    steps: tuple[str, ...]  # S >= 1 steps of the answer, in order, each a non-blank text
    labels: tuple[bool, ...]  # S labels, one per step: True where the step is correct
    source_row: str  # where it was read: 'FILE:LINE' (JSONL) or 'SOURCE row INDEX' (0-based; parquet, hf:)

    def __post_init__(self) -> None:
        _check_prompt("StepLabelledCompletion", self.prompt)
        if not self.steps or len(self.steps) != len(self.labels):
            raise ValueError(f"StepLabelledCompletion from {self.source_row}: {len(self.steps)} steps and "
                             f"{len(self.labels)} labels (one label per step, at least one step)")


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
class TrainBatch:
    """Token-level training data for `Engine.forward_backward`, right-padded to T (Tinker's `Datum`s, stacked).

    Which optional inputs must be present depends on the loss (`LossDef.inputs`): policy-gradient losses read
    sampling logprobs and advantages, an in-loss KL the reference logprobs, pairwise losses `pairs_P2` (a reward
    model's margin loss `margins_P` too), KTO `kto_labels_N`, a critic's value loss `old_values_NT` and
    `returns_NT`, a process reward model's step loss `step_labels_NT`. Pairs and KTO labels couple rows (a pair's
    two answers; KTO's reference point from its KL rows), so such a batch is trained whole.

    A packed batch (`position_ids_NT` set: `data.packing`) lays several sequences end to end in a row, each
    attending only to itself (purplerl.algorithms.packing); its sequences are numbered in reading order, and
    `pairs_P2` and the per-sequence tensors ([N] below: [S], one per sequence) index them."""

    input_ids_NT: torch.Tensor  # long [N, T], prompt + completion tokens, pad after the end
    attention_mask_NT: torch.Tensor  # long [N, T], 1 on real tokens
    loss_mask_NT: torch.Tensor  # float [N, T], weight of each target token in the loss (1 on completions), else 0
    sampling_logprobs_NT: torch.Tensor | None = None  # float [N, T], logprobs recorded when sampling, 0 off-mask
    advantages_NT: torch.Tensor | None = None  # float [N, T], advantage per target token, 0 off-mask
    ref_logprobs_NT: torch.Tensor | None = None  # float [N, T], frozen-base logprobs (KL in loss, DPO)
    pairs_P2: torch.Tensor | None = None  # long [P, 2], (chosen row, rejected row) of each preference pair
    # long [N], KTO's label of each row: 1 desirable, 0 undesirable, -1 a KL row (a prompt with another example's
    # completion, as TRL's KTOTrainer builds them: it only estimates the reference point z0, and gets no gradient)
    kto_labels_N: torch.Tensor | None = None
    # float [P], the margin m of each pair in a reward model's -log sigmoid(r_c - r_r - m) (TRL's `margin` column)
    margins_P: torch.Tensor | None = None
    # float [N, T], a critic's value of each target token's state when the rollout was scored, 0 off-mask (PPO's
    # value clipping keeps the critic near them)
    old_values_NT: torch.Tensor | None = None
    returns_NT: torch.Tensor | None = None  # float [N, T], the critic's regression targets (GAE returns), 0 off-mask
    # bool [N], the reward-hacking detector's label of each row (RewardBreakdown.is_rh_N), None without a detector:
    # gradient routing trains the labelled rows into the forget adapter only. No loss reads it.
    is_rh_N: torch.Tensor | None = None
    # float [N, T], a process reward model's label of each step at the step's last token (1.0 correct, 0.0 not; the
    # loss mask is 1 there), 0 elsewhere
    step_labels_NT: torch.Tensor | None = None
    # long [N, T], packed rows only: each token's position inside its own sequence, 0 where one starts (padding too
    # restarts at 0); None: one sequence per row, at positions 0..T-1
    position_ids_NT: torch.Tensor | None = None
    # long [N, T], gist rows only (purplerl.data.gist): the first column of its row each query may attend (earlier
    # turns are read through the gist tokens after them); None: from its row's (or packed sequence's) start
    first_key_NT: torch.Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids_NT.shape)
        for name in ("attention_mask_NT", "loss_mask_NT", "sampling_logprobs_NT", "advantages_NT", "ref_logprobs_NT",
                     "old_values_NT", "returns_NT", "step_labels_NT", "position_ids_NT", "first_key_NT"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"TrainBatch.{name} has shape {tuple(value.shape)}, expected {shape}")
        if self.pairs_P2 is not None and (self.pairs_P2.ndim != 2 or self.pairs_P2.shape[1] != 2):
            raise ValueError(f"TrainBatch.pairs_P2 has shape {tuple(self.pairs_P2.shape)}, expected [P, 2]")
        if self.position_ids_NT is not None:
            self._check_packed()
        first = self.first_key_NT
        if first is not None and bool(((first < 0) | (first > first.new_ones(shape[1]).cumsum(0) - 1)).any()):
            raise ValueError("TrainBatch.first_key_NT must name, for each query, a column from 0 up to its own")
        sequences = (self.num_sequences,)
        labels = self.kto_labels_N
        if labels is not None and tuple(labels.shape) != sequences:
            raise ValueError(f"TrainBatch.kto_labels_N has shape {tuple(labels.shape)}, expected {sequences}")
        if labels is not None and not bool(((labels == -1) | (labels == 0) | (labels == 1)).all()):
            raise ValueError("TrainBatch.kto_labels_N must hold 1 (desirable), 0 (undesirable) or -1 (KL row)")
        rh = self.is_rh_N
        if rh is not None and (not _is_bool(rh) or tuple(rh.shape) != sequences):
            raise ValueError(f"TrainBatch.is_rh_N must be bool {sequences}, got {rh.dtype} {tuple(rh.shape)}")
        pairs = None if self.pairs_P2 is None else tuple(self.pairs_P2.shape[:1])
        if self.margins_P is not None and tuple(self.margins_P.shape) != pairs:
            raise ValueError(f"TrainBatch.margins_P has shape {tuple(self.margins_P.shape)}, expected one per pair "
                             f"of pairs_P2: {pairs}")
        steps = self.step_labels_NT
        if steps is not None and not bool(((steps == 0) | (steps == 1)).all()):
            raise ValueError("TrainBatch.step_labels_NT must hold 1.0 (a correct step) or 0.0")

    def _check_packed(self) -> None:
        """Each row's first token starts a sequence, and inside a sequence each position is one more than the last."""
        positions_NT, real_NT = self.position_ids_NT, self.attention_mask_NT != 0
        if positions_NT.shape[1] and bool((positions_NT[:, 0] != 0).any()):
            raise ValueError("TrainBatch.position_ids_NT must start every row at 0")
        steps_NT = positions_NT[:, 1:] - positions_NT[:, :-1]
        if bool((real_NT[:, 1:] & (positions_NT[:, 1:] != 0) & (steps_NT != 1)).any()):
            raise ValueError("TrainBatch.position_ids_NT must count 0, 1, 2, ... inside each sequence")

    def select(self, rows: torch.Tensor) -> TrainBatch:
        """The batch restricted to the given row indices (a PPO minibatch, or the Token Noiser's rows).
        Pairs and KTO labels couple sequences, so a batch with either is never split; nor is a packed batch, whose
        rows are not its sequences."""
        if self.position_ids_NT is not None:
            raise ExperimentError("a packed batch cannot be split into rows (a row holds several sequences)")
        if self.pairs_P2 is not None or self.kto_labels_N is not None:
            raise ExperimentError("a batch of preference pairs or KTO rows cannot be split into rows (PPO "
                                  "minibatches need per-row losses)")

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows]

        return TrainBatch(self.input_ids_NT[rows], self.attention_mask_NT[rows], self.loss_mask_NT[rows],
                          pick(self.sampling_logprobs_NT), pick(self.advantages_NT), pick(self.ref_logprobs_NT),
                          old_values_NT=pick(self.old_values_NT), returns_NT=pick(self.returns_NT),
                          is_rh_N=pick(self.is_rh_N), step_labels_NT=pick(self.step_labels_NT),
                          first_key_NT=pick(self.first_key_NT))

    def inputs(self) -> dict[str, torch.Tensor]:
        """The loss inputs present, by name (with the loss mask)."""
        names = ("loss_mask_NT", "sampling_logprobs_NT", "advantages_NT", "ref_logprobs_NT", "pairs_P2",
                 "kto_labels_N", "margins_P", "old_values_NT", "returns_NT", "step_labels_NT")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    @property
    def num_sequences(self) -> int:
        """Sequences: the rows, or in a packed batch the sequences its rows hold."""
        if self.position_ids_NT is None:
            return int(self.input_ids_NT.shape[0])
        return int(((self.position_ids_NT == 0) & (self.attention_mask_NT != 0)).sum())

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask_NT.sum().item())


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
    # bool [N], True where a reward-hacking detector labels the completion a hack (purplerl.rewards.named); None when
    # the reward has no detector. The loop logs its rate as rh/rate; gradient routing sends these rows elsewhere.
    is_rh_N: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rh = self.is_rh_N
        if rh is not None and (not _is_bool(rh) or tuple(rh.shape) != tuple(self.total_N.shape)):
            raise ValueError(f"RewardBreakdown.is_rh_N must be bool {tuple(self.total_N.shape)}, got {rh.dtype} "
                             f"{tuple(rh.shape)}")
