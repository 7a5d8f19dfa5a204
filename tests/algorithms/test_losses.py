import math

import pytest
import torch

from purplerl.algorithms.losses import (
    LOSSES,
    aggregate_token_mean,
    get_loss,
    importance_sampling_loss,
    kl_penalty_loss,
    ppo_clip_loss,
)
from purplerl.errors import ExperimentError, UserError


def test_importance_sampling_on_policy_gradient_is_minus_advantage() -> None:
    logp_NT = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -0.7]], requires_grad=True)
    adv_NT = torch.tensor([[0.5, 0.5, 0.0], [-1.5, -1.5, 2.0]])
    mask_NT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss_NT, metrics = importance_sampling_loss(logp_NT, logp_NT.detach(), adv_NT, mask_NT)
    assert torch.allclose(loss_NT, -adv_NT * mask_NT)
    loss_NT.sum().backward()
    # ratio 1: d(-r A)/dlogp = -r A = -A, exactly REINFORCE
    assert torch.allclose(logp_NT.grad, -adv_NT * mask_NT)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["approx_kl_sampling"] == pytest.approx(0.0)
    assert metrics["num_tokens"] == 5.0


def test_importance_sampling_off_policy_by_hand() -> None:
    # logp - logp_sampling = log 2 -> ratio 2; loss = -2 * 0.5 = -1
    logp_NT = torch.tensor([[math.log(0.5)]])
    loss_NT, metrics = importance_sampling_loss(logp_NT, torch.tensor([[math.log(0.25)]]),
                                                torch.tensor([[0.5]]), torch.ones(1, 1))
    assert loss_NT.item() == pytest.approx(-1.0)
    assert metrics["ratio_mean"] == pytest.approx(2.0)
    # k3(sampling, current): r - log r - 1 with r = 2: 0.306853
    assert metrics["approx_kl_sampling"] == pytest.approx(0.306853, abs=1e-6)


def test_padding_junk_cannot_poison_the_loss() -> None:
    logp_NT = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    sampling_NT = torch.tensor([[-1.0, -math.inf]])  # off-mask -inf would overflow the ratio
    for fn in LOSSES.values():
        loss_NT, metrics = fn(logp_NT, sampling_NT, torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]),
                              clip_low=0.2, clip_high=0.2)
        loss_NT.sum().backward()
        assert torch.isfinite(loss_NT).all() and torch.isfinite(logp_NT.grad).all()
        assert all(math.isfinite(v) for v in metrics.values())
        logp_NT.grad = None


# Ratios and advantages for the PPO cases, clip_low = 0.2, clip_high = 0.28:
#   r=1.5, A=+1: min(1.5, 1.28)   = 1.28  -> loss -1.28, clipped (high), no gradient
#   r=1.5, A=-1: min(-1.5, -1.28) = -1.5  -> loss +1.5,  gradient -r A = +1.5
#   r=0.5, A=+1: min(0.5, 0.8)    = 0.5   -> loss -0.5,  gradient -0.5
#   r=0.5, A=-1: min(-0.5, -0.8)  = -0.8  -> loss +0.8,  clipped (low), no gradient
#   r=1.1, A=+2: inside the clip  = 2.2   -> loss -2.2,  gradient -2.2
#   last token off the mask       -> 0
RATIOS = [1.5, 1.5, 0.5, 0.5, 1.1, 3.0]
ADV_NT = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0, 5.0]])
MASK_NT = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])


def test_ppo_clip_by_hand() -> None:
    sampling_NT = torch.full((1, 6), -1.0)
    logp_NT = (sampling_NT + torch.log(torch.tensor([RATIOS]))).requires_grad_()
    loss_NT, metrics = ppo_clip_loss(logp_NT, sampling_NT, ADV_NT, MASK_NT, clip_low=0.2, clip_high=0.28)
    assert torch.allclose(loss_NT, torch.tensor([[-1.28, 1.5, -0.5, 0.8, -2.2, 0.0]]), atol=1e-6)
    loss_NT.sum().backward()
    assert torch.allclose(logp_NT.grad, torch.tensor([[0.0, 1.5, -0.5, 0.0, -2.2, 0.0]]), atol=1e-6)
    assert metrics["clip_frac"] == pytest.approx(0.4)  # 2 of 5 masked tokens
    assert metrics["clip_frac_high"] == pytest.approx(0.2)
    assert metrics["clip_frac_low"] == pytest.approx(0.2)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 1.5 + 0.5 + 0.5 + 1.1) / 5)
    # k3 = r - log r - 1: 0.094535 (r=1.5), 0.193147 (r=0.5), 0.004690 (r=1.1)
    expected_kl = (2 * 0.094535 + 2 * 0.193147 + 0.004690) / 5
    assert metrics["approx_kl_sampling"] == pytest.approx(expected_kl, abs=1e-5)


def test_ppo_equals_importance_sampling_inside_clip() -> None:
    logp_NT = torch.tensor([[-1.0, -2.0]])
    sampling_NT = torch.tensor([[-1.05, -1.9]])  # ratios e^0.05 and e^-0.1, both inside [0.8, 1.2]
    adv_NT, mask_NT = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    ppo_NT, _ = ppo_clip_loss(logp_NT, sampling_NT, adv_NT, mask_NT, clip_low=0.2, clip_high=0.2)
    is_NT, _ = importance_sampling_loss(logp_NT, sampling_NT, adv_NT, mask_NT)
    assert torch.allclose(ppo_NT, is_NT)


def test_registry_and_lookup() -> None:
    assert LOSSES == {"importance_sampling": importance_sampling_loss, "ppo_clip": ppo_clip_loss}
    assert get_loss("ppo_clip") is ppo_clip_loss
    with pytest.raises(UserError, match="unknown loss 'dpo'"):
        get_loss("dpo")


def test_aggregate_by_hand() -> None:
    loss_NT = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask_NT = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert aggregate_token_mean(loss_NT, mask_NT, normalizer=4.0).item() == pytest.approx((1 + 3 + 4) / 4)
    with pytest.raises(ExperimentError, match="normalizer must be > 0"):
        aggregate_token_mean(loss_NT, mask_NT, normalizer=0.0)


@pytest.mark.parametrize("loss_name", ["importance_sampling", "ppo_clip"])
def test_micro_batches_sum_to_full_batch_gradient(loss_name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    theta_NT = torch.randn(4, 5, generator=gen)
    sampling_NT = -torch.nn.functional.softplus(theta_NT + 0.3 * torch.randn(4, 5, generator=gen))
    adv_NT = torch.randn(4, 5, generator=gen)
    mask_NT = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 1, 1, 1, 0]]).float()
    fn, total_tokens = LOSSES[loss_name], float(mask_NT.sum())

    def grad_of(rows_list: list[slice], per_micro_count: bool = False) -> torch.Tensor:
        theta = theta_NT.clone().requires_grad_()
        for rows in rows_list:
            logp = -torch.nn.functional.softplus(theta[rows])
            loss_NT, _ = fn(logp, sampling_NT[rows], adv_NT[rows], mask_NT[rows], clip_low=0.2, clip_high=0.28)
            norm = float(mask_NT[rows].sum()) if per_micro_count else total_tokens
            aggregate_token_mean(loss_NT, mask_NT[rows], norm).backward()
        return theta.grad

    full = grad_of([slice(0, 4)])
    assert torch.allclose(grad_of([slice(0, 2), slice(2, 4)]), full, atol=1e-6)
    assert torch.allclose(grad_of([slice(0, 1), slice(1, 3), slice(3, 4)]), full, atol=1e-6)
    # Dividing each micro-batch by its own token count (4 and 6 here) over-weights the smaller one.
    assert not torch.allclose(grad_of([slice(0, 1), slice(1, 4)], per_micro_count=True), full, atol=1e-4)


def test_kl_penalty_loss_values_and_gradient() -> None:
    # logp - ref = +1: k1 = 1, k2 = 0.5, k3 = e^-1 + 1 - 1 = 0.367879
    logp_NT = torch.tensor([[-1.0]], requires_grad=True)
    ref_NT = torch.tensor([[-2.0]], requires_grad=True)
    assert kl_penalty_loss(logp_NT, ref_NT, "k1").item() == pytest.approx(1.0)
    assert kl_penalty_loss(logp_NT, ref_NT, "k3").item() == pytest.approx(0.367879, abs=1e-6)
    k2 = kl_penalty_loss(logp_NT, ref_NT, "k2")
    assert k2.item() == pytest.approx(0.5)
    k2.sum().backward()
    assert logp_NT.grad.item() == pytest.approx(1.0)  # d/dlogp 0.5 (logp - ref)^2 = logp - ref
    assert ref_NT.grad is None  # the reference is a constant
