"""The rollout/trainer logprob gap and the truncated importance-sampling weight, on hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from purplerl.algorithms.rollout_correction import logprob_mismatch, truncated_is_weights
from purplerl.errors import UserError


def test_mismatch_is_mean_and_max_gap_over_the_mask() -> None:
    trainer = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -0.5, 9.0, 0.0]])
    rollout = torch.tensor([[0.0, -1.5, -2.0, -2.0], [0.0, -0.25, -9.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])  # the 18-nat gap is off the mask
    metrics = logprob_mismatch(trainer, rollout, mask)
    # gaps on the mask: 0.5, 0, 1, 0.25 -> mean 1.75 / 4, max 1
    assert metrics == pytest.approx({"lp_diff_mean": 0.4375, "lp_diff_max": 1.0})
    assert logprob_mismatch(trainer, rollout, torch.zeros_like(mask)) == {"lp_diff_mean": 0.0, "lp_diff_max": 0.0}


def test_truncated_weights_are_the_capped_probability_ratio() -> None:
    trainer = torch.tensor([[-1.0, -1.0, -1.0, -4.0]], requires_grad=True)
    rollout = torch.tensor([[-1.0, -1.5, -3.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights, metrics = truncated_is_weights(trainer, rollout, mask, cap=2.0)
    # ratios e^0 = 1, e^0.5 = 1.6487, e^2 = 7.389 -> capped at 2; off the mask the weight is 1 (not e^-3)
    expected = torch.tensor([[1.0, math.exp(0.5), 2.0, 1.0]])
    torch.testing.assert_close(weights, expected)
    assert not weights.requires_grad  # a constant: the gradient flows through the loss's own ratio only
    assert metrics["is_weight_mean"] == pytest.approx((1.0 + math.exp(0.5) + 2.0) / 3)
    assert metrics["is_truncated_frac"] == pytest.approx(1 / 3)


def test_weights_scale_the_policy_gradient_per_token() -> None:
    """TIS in the loss: -w * A * logp per token, so d/dlogp = -w * A (w a constant)."""
    logp = torch.tensor([-0.2, -1.0, -2.0], requires_grad=True)
    rollout = torch.tensor([-0.3, -0.4, -2.0])
    advantages = torch.tensor([1.0, -2.0, 0.5])
    weights, _ = truncated_is_weights(logp, rollout, torch.ones(3), cap=1.5)
    (-(weights * advantages * logp).sum()).backward()
    # w = min(e^0.1, 1.5) = 1.10517, min(e^-0.6, 1.5) = 0.54881, e^0 = 1
    torch.testing.assert_close(logp.grad, torch.tensor([-1.10517092, 2 * 0.54881164, -0.5]))


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(UserError, match="cap must be >= 1"):
        truncated_is_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=0.5)
