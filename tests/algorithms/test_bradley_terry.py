"""Reward-model math by hand: the Bradley-Terry loss (with and without margins, with the centering term), the value
at each sequence's last token, the ensemble's mean, std and penalized reward, and the held-out pair metrics.

Two pairs throughout: r_c = (2, 0), r_r = (1, 1), so r_c - r_r = (1, -1); softplus(x) = log(1 + e^x) and
-log sigmoid(x) = softplus(-x)."""

from __future__ import annotations

import math

import pytest
import torch

from purplerl.algorithms.pairwise import BradleyTerryParams
from purplerl.algorithms.registry import get_loss_def
from purplerl.algorithms.reward_model import (
    bradley_terry_loss,
    ensemble_pair_metrics,
    ensemble_reward,
    last_token_values,
)
from purplerl.errors import ExperimentError, UserError
from purplerl.types import TrainBatch


def _pairs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([2.0, 0.0], requires_grad=True), torch.tensor([1.0, 1.0], requires_grad=True)


def test_bradley_terry_loss_by_hand() -> None:
    chosen, rejected = _pairs()
    loss, metrics = bradley_terry_loss(chosen, rejected)
    # (softplus(-1) + softplus(1)) / 2 = (0.3132617 + 1.3132617) / 2
    assert float(loss.detach()) == pytest.approx(0.8132617, abs=1e-6)
    assert metrics == pytest.approx({"accuracy": 0.5, "margin": 0.0, "chosen": 1.0, "rejected": 1.0})
    loss.backward()
    # d/dr_c of -log sigmoid(d) / 2 = -sigmoid(-d) / 2: pair 0 -sigmoid(-1) / 2 = -0.1344707, pair 1 -0.3655293
    assert chosen.grad.tolist() == pytest.approx([-0.1344707, -0.3655293], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx([0.1344707, 0.3655293], abs=1e-6)


def test_bradley_terry_loss_with_margins_by_hand() -> None:
    chosen, rejected = _pairs()
    loss, metrics = bradley_terry_loss(chosen, rejected, torch.tensor([0.5, -2.0]))
    # logits d - m = (0.5, 1): (softplus(-0.5) + softplus(-1)) / 2 = (0.4740770 + 0.3132617) / 2
    assert float(loss.detach()) == pytest.approx(0.3936693, abs=1e-6)
    assert metrics["accuracy"] == 0.5 and metrics["margin"] == 0.0  # of the rewards themselves, margins aside
    a_margin_of_zero, _ = bradley_terry_loss(*_pairs(), torch.zeros(2))
    assert float(a_margin_of_zero.detach()) == pytest.approx(0.8132617, abs=1e-6)


def test_the_centering_term_by_hand() -> None:
    loss, metrics = bradley_terry_loss(*_pairs(), center_coef=0.1)
    # 0.1 * mean((2 + 1)^2, (0 + 1)^2) = 0.1 * 5 = 0.5 (TRL's center_rewards_coefficient term)
    assert float(loss.detach()) == pytest.approx(0.8132617 + 0.5, abs=1e-6)
    assert metrics["center_loss"] == pytest.approx(0.5)
    with pytest.raises(UserError, match="center_coef must be >= 0"):
        bradley_terry_loss(*_pairs(), center_coef=-1.0)


def test_a_tie_is_not_a_correct_preference_and_shapes_are_checked() -> None:
    _, metrics = bradley_terry_loss(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0]))
    assert metrics["accuracy"] == 0.5
    with pytest.raises(ExperimentError, match="must be the same"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ExperimentError, match="margins"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), torch.zeros(3))


def test_the_value_is_read_at_each_rows_last_masked_position() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 1]])  # last real tokens at 2, 0 and 3
    assert last_token_values(values, mask).tolist() == [3.0, 5.0, 12.0]
    with pytest.raises(ExperimentError, match="row 1 has no token"):
        last_token_values(values, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]))


def test_the_registered_loss_scores_each_answer_at_its_last_answer_token() -> None:
    # rows: (chosen 0, rejected 1), (chosen 3, rejected 2); each row's value at its last loss-mask position
    values = torch.tensor([[0.0, 9.0, 2.0], [0.0, 1.0, 9.0], [0.0, 9.0, 1.0], [0.0, 0.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    batch = TrainBatch(torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), mask,
                       pairs_P2=torch.tensor([[0, 1], [3, 2]]), margins_P=torch.tensor([0.5, -2.0]))
    definition = get_loss_def("bradley_terry")
    assert definition.consumes == "values"
    assert definition.required_inputs(BradleyTerryParams(margin=True)) == ("pairs_P2", "margins_P")
    loss, metrics = definition.fn(values, batch.inputs(), BradleyTerryParams(margin=True))
    assert float(loss.detach()) == pytest.approx(0.3936693, abs=1e-6)  # r_c = (2, 0), r_r = (1, 1), m = (0.5, -2)
    loss.backward()
    assert values.grad[:, 0].abs().sum() == 0 and values.grad[0, 1] == 0  # nothing but the last answer tokens


def test_margins_come_one_per_pair() -> None:
    ones = torch.ones(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="margins_P has shape"):
        TrainBatch(ones, ones, ones.float(), pairs_P2=torch.tensor([[0, 1], [3, 2]]), margins_P=torch.zeros(3))
    with pytest.raises(ValueError, match="margins_P has shape"):
        TrainBatch(ones, ones, ones.float(), margins_P=torch.zeros(2))


def test_ensemble_mean_std_and_penalized_reward_by_hand() -> None:
    scores_KN = torch.tensor([[1.0, 4.0], [2.0, 4.0], [3.0, 4.0]])  # three members, two answers
    mean, std, reward = ensemble_reward(scores_KN, penalty=0.5)
    assert mean.tolist() == [2.0, 4.0]
    # population std over the members: sqrt(((1-2)^2 + 0 + (3-2)^2) / 3) = sqrt(2/3); the members agree on answer 2
    assert std.tolist() == pytest.approx([math.sqrt(2 / 3), 0.0])
    assert reward.tolist() == pytest.approx([2.0 - 0.5 * math.sqrt(2 / 3), 4.0])
    one_member = ensemble_reward(scores_KN[:1], penalty=3.0)
    assert one_member[1].tolist() == [0.0, 0.0] and one_member[2].tolist() == [1.0, 4.0]
    with pytest.raises(UserError, match="penalty must be >= 0"):
        ensemble_reward(scores_KN, penalty=-0.1)


def test_held_out_pair_metrics_of_an_ensemble_by_hand() -> None:
    # two members, three pairs; the ensemble means: chosen (1.5, 0, 2), rejected (0.5, 1, 2)
    chosen_KP = torch.tensor([[1.0, -1.0, 2.0], [2.0, 1.0, 2.0]])
    rejected_KP = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 2.0]])
    metrics = ensemble_pair_metrics(chosen_KP, rejected_KP)
    assert metrics["accuracy"] == pytest.approx(1 / 3)  # pair 3 is a tie: not correct
    assert metrics["margin"] == pytest.approx((1.0 - 1.0 + 0.0) / 3)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert metrics["loss"] == pytest.approx((sp(-1.0) + sp(1.0) + sp(0.0)) / 3)
    assert metrics["member_accuracy"] == pytest.approx(2 / 6)  # member 0 wins pair 1, member 1 pair 1 too
    # stds of the six answers' two scores: 0.5, 1, 0, 0.5, 0, 0
    assert metrics["std"] == pytest.approx(2.0 / 6)
