"""Process reward model math: each aggregation of an answer's steps, the step loss, its gradient and its metrics,
and the outcome accuracy, on hand-worked numbers; the loss as the registry runs it."""

from __future__ import annotations

import math

import pytest
import torch

from purplerl.algorithms.names import STEP_AGGREGATION_NAMES
from purplerl.algorithms.process_reward import (
    STEP_AGGREGATIONS,
    StepBCEParams,
    aggregate_steps,
    outcome_accuracy,
    step_bce_loss,
)
from purplerl.algorithms.registry import Loss
from purplerl.errors import ExperimentError, UserError
from purplerl.types import TrainBatch

# an answer of three steps with P(correct) 0.9, 0.5, 0.8: the head gives their logits
PROBS_S = torch.tensor([0.9, 0.5, 0.8])
LOGITS_S = torch.logit(PROBS_S)


@pytest.mark.parametrize("how, want", [
    ("min", 0.5),  # the weakest step
    ("last", 0.8),  # the last step's
    ("product", 0.9 * 0.5 * 0.8),  # 0.36: every step correct, the steps independent
    ("mean", (0.9 + 0.5 + 0.8) / 3),  # 0.7333...
])
def test_each_aggregation_on_a_hand_worked_answer(how: str, want: float) -> None:
    assert float(aggregate_steps(LOGITS_S, how)) == pytest.approx(want, abs=1e-6)


def test_one_step_is_its_own_reward_under_every_aggregation_and_the_names_are_declared() -> None:
    assert tuple(STEP_AGGREGATIONS) == STEP_AGGREGATION_NAMES
    for how in STEP_AGGREGATION_NAMES:
        assert float(aggregate_steps(torch.logit(torch.tensor([0.3])), how)) == pytest.approx(0.3, abs=1e-6)


def test_an_unknown_aggregation_or_an_answer_without_steps_is_refused() -> None:
    with pytest.raises(UserError, match="unknown step aggregation 'max' \\(known: min, last, product, mean\\)"):
        aggregate_steps(LOGITS_S, "max")
    with pytest.raises(ExperimentError, match=r"must be \[S >= 1\], got \(0,\)"):
        aggregate_steps(torch.zeros(0), "min")


# two answers, right-padded: row 0's steps end at positions 2 and 4, row 1's at 3; values 1, -1 and 3 there
VALUES_NT = torch.tensor([[9.0, 9.0, 1.0, 9.0, -1.0], [9.0, 9.0, 9.0, 3.0, 0.0]])
MASK_NT = torch.tensor([[0.0, 0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0, 0.0]])
LABELS_NT = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])  # steps: correct, wrong, wrong


def test_the_step_loss_is_the_mean_bce_over_the_batchs_steps() -> None:
    """BCE(v, y) = softplus(-v) for y = 1 and softplus(v) for y = 0: (softplus(-1) + softplus(-1) + softplus(3)) / 3 =
    (0.313262 + 0.313262 + 3.048587) / 3 = 1.225037. The positions off the mask (the 9s) are not read."""
    values_NT = VALUES_NT.clone().requires_grad_(True)
    loss, metrics = step_bce_loss(values_NT, LABELS_NT, MASK_NT)
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert float(loss.detach()) == pytest.approx((softplus(-1) + softplus(-1) + softplus(3)) / 3, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(1.225037, abs=1e-6)
    # predicted correct where v > 0: steps 1 (right), 2 (v = -1, wrong step: right), 3 (v = 3, wrong step: wrong)
    assert metrics["step_accuracy"] == pytest.approx(2 / 3)
    assert metrics["label_rate"] == pytest.approx(1 / 3)
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert metrics["step_prob"] == pytest.approx((sigmoid(1) + sigmoid(-1) + sigmoid(3)) / 3, abs=1e-6)
    loss.backward()
    # d loss / d v = (sigmoid(v) - y) / S at each step, 0 elsewhere
    want = torch.zeros_like(VALUES_NT)
    want[0, 2], want[0, 4], want[1, 3] = (sigmoid(1) - 1) / 3, sigmoid(-1) / 3, sigmoid(3) / 3
    torch.testing.assert_close(values_NT.grad, want)


def test_outcome_accuracy_asks_whether_every_step_is_right() -> None:
    """Row 0: predicted all right (1 > 0, 2 > 0), truly all right: a hit. Row 1: predicted all right, one step wrong:
    a miss. Row 2: predicted a wrong step (-1), one step wrong: a hit. 2 of 3."""
    mask_NT = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    values_NT = torch.tensor([[1.0, 2.0], [1.0, 2.0], [-1.0, 2.0]])
    labels_NT = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    assert outcome_accuracy(values_NT, labels_NT, mask_NT) == pytest.approx(2 / 3)
    with pytest.raises(ExperimentError, match="a row marks no step"):
        outcome_accuracy(values_NT, labels_NT, torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))


def test_the_registered_loss_reads_the_step_labels_and_the_batch_checks_them() -> None:
    loss = Loss("step_bce")
    assert loss.params == StepBCEParams() and loss.definition.consumes == "values"
    ids = torch.ones_like(VALUES_NT, dtype=torch.long)
    batch = TrainBatch(ids, ids, MASK_NT, step_labels_NT=LABELS_NT)
    assert set(batch.inputs()) == {"loss_mask_NT", "step_labels_NT"}
    value, _ = loss.definition.fn(VALUES_NT, batch.inputs(), loss.params)
    assert float(value) == pytest.approx(1.225037, abs=1e-6)
    with pytest.raises(ValueError, match=r"TrainBatch.step_labels_NT has shape \(2, 4\), expected \(2, 5\)"):
        TrainBatch(ids, ids, MASK_NT, step_labels_NT=LABELS_NT[:, :4])
    with pytest.raises(ValueError, match="step_labels_NT must hold 1.0 .* or 0.0"):
        TrainBatch(ids, ids, MASK_NT, step_labels_NT=LABELS_NT * 2)
    with pytest.raises(ExperimentError, match="marks no step's last token"):
        step_bce_loss(VALUES_NT, LABELS_NT, torch.zeros_like(MASK_NT))
