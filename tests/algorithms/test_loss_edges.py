"""What the policy-gradient losses promise beyond their values: the sampling logprobs are constants (no
gradient reaches them), and PPO's clip fractions count the side of the clip that actually removes a gradient."""

from __future__ import annotations

import pytest
import torch

from purplerl.algorithms.losses import importance_sampling_loss, ppo_clip_loss

SURROGATES = {"importance_sampling": importance_sampling_loss, "ppo_clip": ppo_clip_loss}


@pytest.mark.parametrize("name", sorted(SURROGATES))
def test_sampling_logprobs_get_no_gradient(name: str) -> None:
    # a caller may hand over sampling logprobs that still carry a graph (e.g. a policy's own logprobs)
    logp_NT = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    sampling_NT = torch.tensor([[-1.2, -0.5, -1.0]], requires_grad=True)
    advantages_NT = torch.tensor([[1.0, -2.0, 0.5]])
    loss_NT, _ = SURROGATES[name](logp_NT, sampling_NT, advantages_NT, torch.ones(1, 3), clip_low=0.2, clip_high=0.2)
    loss_NT.sum().backward()
    assert sampling_NT.grad is None or torch.equal(sampling_NT.grad, torch.zeros(1, 3))
    assert logp_NT.grad is not None and logp_NT.grad.abs().sum() > 0


def test_ppo_clip_fractions_count_the_clipped_side_only() -> None:
    # ratio 1.5 > 1 + 0.2: clipped (no gradient) when A > 0, unclipped when A < 0 (min takes r * A there);
    # ratio 0.5 < 1 - 0.2: clipped when A < 0, unclipped when A > 0. Rows chosen so no count is symmetric.
    ratios = torch.tensor([[1.5, 1.5, 1.5, 0.5, 0.5, 1.0]])
    advantages_NT = torch.tensor([[1.0, 2.0, -1.0, -1.0, 1.0, 1.0]])
    sampling_NT = torch.full((1, 6), -1.0)
    logp_NT = (sampling_NT + ratios.log()).requires_grad_()
    loss_NT, metrics = ppo_clip_loss(logp_NT, sampling_NT, advantages_NT, torch.ones(1, 6), clip_low=0.2,
                                     clip_high=0.2)
    loss_NT.sum().backward()
    clipped = logp_NT.grad[0] == 0
    assert clipped.tolist() == [True, True, False, True, False, False]
    assert metrics["clip_frac_high"] == pytest.approx(2 / 6)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["clip_frac"] == pytest.approx(3 / 6)
