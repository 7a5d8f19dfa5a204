"""The registered pairwise losses: the direct preference losses (DPO with its sigmoid/cDPO, hinge and IPO forms,
SimPO, KTO, ORPO) on a batch's sequences, and the reward model's Bradley-Terry loss on its scalar head's values.
The math is in algorithms.preference and algorithms.reward_model; this module reads the batch inputs and
registers each loss (purplerl.algorithms imports it, so every loss is registered once the package is)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from purplerl.algorithms.preference import (
    check_beta,
    check_dpo_loss_type,
    check_label_smoothing,
    check_positive,
    check_sft_weight,
    check_simpo_gamma,
    dpo_loss,
    kto_loss,
    orpo_loss,
    simpo_loss,
)
from purplerl.algorithms.registry import LossDef, Metrics, register_loss
from purplerl.algorithms.reward_model import bradley_terry_loss, check_center_coef, last_token_values
from purplerl.errors import ExperimentError

# ----- preference losses (the math: algorithms.preference) -------------------------------------------------
# Under the data-parallel engine a "sequences" loss is each rank's shard's, weighted by the rank's share of the
# sequences: exact for pair losses when every row is in a pair on its own rank. KTO's reference point z0 is then
# the shard's estimate (TRL averages it over processes) and ORPO's NLL the shard's token mean.


@dataclass(frozen=True)
class DPOParams:
    beta: float = 0.1  # inverse temperature of the implicit reward (Rafailov et al. 2023, arXiv 2305.18290)
    # sigmoid (DPO), hinge (SLiC, arXiv 2305.10425) or ipo (arXiv 2310.12036, length-averaged; beta is its tau)
    loss_type: Literal["sigmoid", "hinge", "ipo"] = "sigmoid"
    label_smoothing: float = 0.0  # cDPO's probability that a pair's label is flipped, in [0, 0.5); sigmoid only
    sft_weight: float = 0.0  # RPO's alpha (arXiv 2404.19733): weight of the chosen answers' NLL added to the loss

    def __post_init__(self) -> None:
        check_beta("dpo", self.beta)
        check_dpo_loss_type(self.loss_type, self.label_smoothing)
        check_sft_weight(self.sft_weight)


@dataclass(frozen=True)
class SimPOParams:
    beta: float = 2.0  # scale of the length-averaged logprob reward (Meng et al. 2024, arXiv 2405.14734)
    gamma: float = 1.0  # target reward margin; gamma = 0.5 * beta as in the SimPO authors' Mistral-7B-base recipe
    label_smoothing: float = 0.0  # cDPO-style label flip probability in [0, 0.5) (TRL's CPOTrainer)

    def __post_init__(self) -> None:
        check_beta("simpo", self.beta)
        check_simpo_gamma(self.gamma)
        check_label_smoothing("simpo", self.label_smoothing)


@dataclass(frozen=True)
class KTOParams:
    beta: float = 0.1  # inverse temperature of the implicit reward (Ethayarajh et al. 2024, arXiv 2402.01306)
    desirable_weight: float = 1.0  # lambda_D; the paper keeps lambda_D n_D / (lambda_U n_U) in [1, 4/3]
    undesirable_weight: float = 1.0  # lambda_U

    def __post_init__(self) -> None:
        check_beta("kto", self.beta)
        check_positive("kto", "desirable_weight", self.desirable_weight)
        check_positive("kto", "undesirable_weight", self.undesirable_weight)


@dataclass(frozen=True)
class ORPOParams:
    beta: float = 0.1  # the paper's lambda, weight of the odds-ratio term (Hong et al. 2024, arXiv 2403.07691)

    def __post_init__(self) -> None:
        check_beta("orpo", self.beta)


def _sequences(logprobs_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor], reference: bool):
    """Per row: the policy logprob summed over the loss tokens (weighted by the loss mask), the reference's (None
    unless asked), and the loss-token count (the mask's sum)."""
    mask_NT = inputs["loss_mask_NT"]
    logps_N = (logprobs_NT * mask_NT).sum(-1)
    ref_N = (inputs["ref_logprobs_NT"].detach() * mask_NT).sum(-1) if reference else None
    return logps_N, ref_N, mask_NT.sum(-1)


def _pair_rows(inputs: Mapping[str, torch.Tensor], who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (chosen rows, rejected rows) of `pairs_P2`."""
    pairs_P2 = inputs["pairs_P2"].long()
    if pairs_P2.ndim != 2 or pairs_P2.shape[1] != 2 or pairs_P2.shape[0] == 0:
        raise ExperimentError(f"{who}: pairs_P2 must be [P >= 1, 2], got {tuple(pairs_P2.shape)}")
    return pairs_P2[:, 0], pairs_P2[:, 1]


def dpo_sequence_loss(logprobs_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                      params: DPOParams) -> tuple[torch.Tensor, Metrics]:
    """`preference.dpo_loss` on the batch's pairs, sequence logprobs summed over each answer's loss tokens;
    `pairs_P2` holds the (chosen row, rejected row) of each pair.

    Metrics: TRL's (see algorithms.preference), and `reward_margin`, the mean over pairs of the implicit-reward
    margin r_c - r_r with DPO's implicit reward r = beta * (logp - ref) (Rafailov et al. 2023), beta included, equal
    to `rewards/margins`; `pair_accuracy`, the share of pairs whose margin is positive (`rewards/accuracies`)."""
    c, r = _pair_rows(inputs, "dpo")
    logps_N, ref_N, lengths_N = _sequences(logprobs_NT, inputs, reference=True)
    loss, metrics = dpo_loss(logps_N[c], logps_N[r], ref_N[c], ref_N[r], beta=params.beta,
                             loss_type=params.loss_type, label_smoothing=params.label_smoothing,
                             chosen_lengths_P=lengths_N[c], rejected_lengths_P=lengths_N[r],
                             sft_weight=params.sft_weight)
    return loss, {**metrics, "reward_margin": metrics["rewards/margins"],
                  "pair_accuracy": metrics["rewards/accuracies"]}


def simpo_sequence_loss(logprobs_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                        params: SimPOParams) -> tuple[torch.Tensor, Metrics]:
    """`preference.simpo_loss` on the batch's pairs (no reference)."""
    c, r = _pair_rows(inputs, "simpo")
    logps_N, _, lengths_N = _sequences(logprobs_NT, inputs, reference=False)
    return simpo_loss(logps_N[c], logps_N[r], lengths_N[c], lengths_N[r], beta=params.beta, gamma=params.gamma,
                      label_smoothing=params.label_smoothing)


def kto_sequence_loss(logprobs_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                      params: KTOParams) -> tuple[torch.Tensor, Metrics]:
    """`preference.kto_loss` on the rows `kto_labels_N` marks 1 (desirable) or 0 (undesirable), its reference point
    from the rows marked -1 (TrainBatch.kto_labels_N)."""
    labels_N = inputs["kto_labels_N"]
    train_N, kl_N = labels_N >= 0, labels_N == -1
    if not bool(train_N.any()) or not bool(kl_N.any()):
        raise ExperimentError(f"kto: the batch needs rows labelled 1 or 0 and KL rows labelled -1, got "
                              f"{int(train_N.sum())} and {int(kl_N.sum())}")
    logps_N, ref_N, _ = _sequences(logprobs_NT, inputs, reference=True)
    return kto_loss(logps_N[train_N], ref_N[train_N], labels_N[train_N] == 1, logps_N[kl_N], ref_N[kl_N],
                    beta=params.beta, desirable_weight=params.desirable_weight,
                    undesirable_weight=params.undesirable_weight)


def orpo_sequence_loss(logprobs_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                       params: ORPOParams) -> tuple[torch.Tensor, Metrics]:
    """`preference.orpo_loss` on the batch's pairs (no reference; the NLL term trains the chosen rows)."""
    c, r = _pair_rows(inputs, "orpo")
    logps_N, _, lengths_N = _sequences(logprobs_NT, inputs, reference=False)
    return orpo_loss(logps_N[c], logps_N[r], lengths_N[c], lengths_N[r], beta=params.beta)


PAIRS = ("pairs_P2",)
register_loss(LossDef("dpo", dpo_sequence_loss, "sequences", DPOParams, inputs=("ref_logprobs_NT", *PAIRS),
                      doc="DPO on (chosen, rejected) pairs against the frozen reference: sigmoid (cDPO), hinge, ipo"))
register_loss(LossDef("simpo", simpo_sequence_loss, "sequences", SimPOParams, inputs=PAIRS,
                      doc="SimPO: length-averaged logprob rewards with a target margin, no reference"))
register_loss(LossDef("kto", kto_sequence_loss, "sequences", KTOParams, inputs=("ref_logprobs_NT", "kto_labels_N"),
                      doc="KTO on unpaired desirable/undesirable rows, reference point from the KL rows"))
register_loss(LossDef("orpo", orpo_sequence_loss, "sequences", ORPOParams, inputs=PAIRS,
                      doc="ORPO: NLL of the chosen answers plus the log odds ratio term, no reference"))


# ----- reward models (the math: algorithms.reward_model) -----------------------------------------------------


@dataclass(frozen=True)
class BradleyTerryParams:
    margin: bool = False  # subtract each pair's margin (TrainBatch.margins_P) inside the sigmoid, as TRL's `margin`
    center_coef: float = 0.0  # weight of mean((r_c + r_r)^2), TRL's center_rewards_coefficient (arXiv 2312.09244)

    def __post_init__(self) -> None:
        check_center_coef(self.center_coef)

    def extra_inputs(self) -> tuple[str, ...]:
        return ("margins_P",) if self.margin else ()


def bradley_terry_values_loss(values_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                              params: BradleyTerryParams) -> tuple[torch.Tensor, Metrics]:
    """`reward_model.bradley_terry_loss` on the batch's pairs, each answer scored by the head's value at its last
    answer token (the loss mask's last token: the sequence's last real token, the answer ending it)."""
    c, r = _pair_rows(inputs, "bradley_terry")
    scores_N = last_token_values(values_NT, inputs["loss_mask_NT"])
    return bradley_terry_loss(scores_N[c], scores_N[r], inputs["margins_P"] if params.margin else None,
                              center_coef=params.center_coef)


register_loss(LossDef("bradley_terry", bradley_terry_values_loss, "values", BradleyTerryParams, inputs=PAIRS,
                      doc="a reward model's Bradley-Terry loss on (chosen, rejected) pairs, optional margin"))
