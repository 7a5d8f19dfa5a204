"""Process reward model math: a score per reasoning step, its loss, and the aggregation of an answer's steps.

Process supervision (Lightman et al. 2023, "Let's Verify Step by Step", arXiv 2305.20050) labels each step of an
answer correct or not, where an outcome reward model sees one label per answer. A process reward model (PRM) reads
its scalar head at each step's last token: the last token of the separator that ends the step, which has seen the
prompt and every step up to and including this one. That value is the logit of the probability that the step is
correct, and it trains with binary cross-entropy on the step's label. TRL's PRMTrainer labels the same token (each
step tokenized with its separator appended, the label on the last of those tokens, every other token ignored).

An answer's outcome reward aggregates its steps' probabilities p_1..p_S (`STEP_AGGREGATIONS`, by name):
- `min`: min_s p_s, the weakest step (Math-Shepherd's solution score, Wang et al. 2023, arXiv 2312.08935);
- `last`: p_S, the last step's, whose token has seen the whole answer;
- `product`: prod_s p_s, the probability that every step is correct when the steps' errors are independent
  (Lightman et al. 2023's solution score), computed as exp(sum_s log sigmoid(v_s));
- `mean`: the average step.
`product` falls with the number of steps and `min` cannot rise with it, so, as an RL reward, both pay for fewer
steps; `last` and `mean` do not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from purplerl.algorithms.names import STEP_AGGREGATION_NAMES, check_names
from purplerl.algorithms.registry import LossDef, Metrics, register_loss
from purplerl.errors import ExperimentError, UserError

# an answer's step logits [S >= 1] -> its reward, a probability in [0, 1] (0-dim tensor)
STEP_AGGREGATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "min": lambda logits_S: torch.sigmoid(logits_S).min(),
    "last": lambda logits_S: torch.sigmoid(logits_S[-1]),
    "product": lambda logits_S: F.logsigmoid(logits_S).sum().exp(),
    "mean": lambda logits_S: torch.sigmoid(logits_S).mean(),
}
check_names("step aggregations", STEP_AGGREGATIONS, STEP_AGGREGATION_NAMES)


def aggregate_steps(logits_S: torch.Tensor, how: str) -> torch.Tensor:
    """One answer's reward from its steps' logits (the head's values at their last tokens), aggregated `how` (a
    name of STEP_AGGREGATIONS, the module docstring)."""
    if how not in STEP_AGGREGATIONS:
        raise UserError(f"unknown step aggregation '{how}' (known: {', '.join(STEP_AGGREGATIONS)})")
    if logits_S.ndim != 1 or logits_S.numel() == 0:
        raise ExperimentError(f"an answer's step logits must be [S >= 1], got {tuple(logits_S.shape)}")
    return STEP_AGGREGATIONS[how](logits_S.float())


def _steps(values_NT: torch.Tensor, labels_NT: torch.Tensor, mask_NT: torch.Tensor,
           who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of every step in the batch: the positions where mask_NT is nonzero."""
    if not values_NT.shape == labels_NT.shape == mask_NT.shape:
        raise ExperimentError(f"{who}: values {tuple(values_NT.shape)}, step labels {tuple(labels_NT.shape)} and mask "
                              f"{tuple(mask_NT.shape)} differ in shape")
    at_NT = mask_NT != 0
    if not bool(at_NT.any()):
        raise ExperimentError(f"{who}: the batch marks no step's last token")
    return values_NT[at_NT], labels_NT[at_NT].to(values_NT.dtype)


def step_bce_loss(values_NT: torch.Tensor, labels_NT: torch.Tensor,
                  mask_NT: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """The mean over the batch's steps of BCE(sigmoid(v), y) = -y log sigmoid(v) - (1 - y) log sigmoid(-v), where v is
    the head's value at a step's last token (mask_NT nonzero there) and y its label (labels_NT: 1.0 or 0.0).

    Metrics: `step_accuracy`, the share of steps whose prediction (v > 0: correct) matches the label; `label_rate`,
    the share of steps labelled correct (the accuracy of always saying so); `step_prob`, the mean sigmoid(v)."""
    logits_S, labels_S = _steps(values_NT, labels_NT, mask_NT, "step_bce")
    loss = F.binary_cross_entropy_with_logits(logits_S, labels_S)
    detached = logits_S.detach()
    return loss, {"step_accuracy": float(((detached > 0).float() == labels_S).float().mean()),
                  "label_rate": float(labels_S.mean()), "step_prob": float(torch.sigmoid(detached).mean())}


def outcome_accuracy(values_NT: torch.Tensor, labels_NT: torch.Tensor, mask_NT: torch.Tensor) -> float:
    """The share of rows (answers) where "every step is correct" is predicted right: predicted when each step's
    v > 0 (equivalently min_s p_s > 1/2), true when each label is 1. Every row must mark at least one step."""
    at_NT = mask_NT != 0
    if not bool(at_NT.any(-1).all()):
        raise ExperimentError("outcome accuracy: a row marks no step")
    predicted_N = ((values_NT > 0) | ~at_NT).all(-1)
    true_N = ((labels_NT == 1) | ~at_NT).all(-1)
    return float((predicted_N == true_N).float().mean())


@dataclass(frozen=True)
class StepBCEParams:
    pass


def step_bce_values_loss(values_NT: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                         params: StepBCEParams) -> tuple[torch.Tensor, Metrics]:
    """`step_bce_loss` on the batch: the loss mask marks each step's last token, `step_labels_NT` holds its label.
    Under the data-parallel engine each rank's mean is weighted by its share of the sequences (as KTO's), exact when
    every rank's rows hold as many steps."""
    return step_bce_loss(values_NT, inputs["step_labels_NT"], inputs["loss_mask_NT"])


register_loss(LossDef("step_bce", step_bce_values_loss, "values", StepBCEParams, inputs=("step_labels_NT",),
                      doc="a process reward model's binary cross-entropy on each step's label at its last token"))
