import math

import pytest
import torch

from purplerl.algorithms.advantages import ADVANTAGES, grpo_advantages, zscore
from purplerl.errors import ExperimentError


def test_grpo_mean_centered_by_hand() -> None:
    rewards_BG = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv_BG, metrics = grpo_advantages(rewards_BG)
    assert torch.equal(adv_BG, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    assert metrics["frac_zero_variance_groups"] == 0.5
    # |adv| is 0.5 on four entries and 0 on four: 2 / 8.
    assert metrics["adv_abs_mean"] == pytest.approx(0.25)


def test_grpo_uneven_group_by_hand() -> None:
    # mean 3 -> [-2, -1, 3]
    adv_BG, metrics = grpo_advantages(torch.tensor([[1.0, 2.0, 6.0]]))
    assert torch.allclose(adv_BG, torch.tensor([[-2.0, -1.0, 3.0]]))
    assert metrics["frac_zero_variance_groups"] == 0.0
    assert metrics["adv_abs_mean"] == pytest.approx(2.0)


def test_grpo_scale_by_population_std() -> None:
    # group [1, 0, 0, 1]: population std 0.5 -> +-1; group [0, 3]: mean 1.5, std 1.5 -> +-1
    adv1, _ = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), scale_by_std=True, eps=0.0)
    assert torch.allclose(adv1, torch.tensor([[1.0, -1.0, -1.0, 1.0]]))
    adv2, _ = grpo_advantages(torch.tensor([[0.0, 3.0]]), scale_by_std=True, eps=0.0)
    assert torch.allclose(adv2, torch.tensor([[-1.0, 1.0]]))
    # default eps: 0.5 / (0.5 + 1e-6)
    adv3, _ = grpo_advantages(torch.tensor([[1.0, 0.0]]), scale_by_std=True)
    assert adv3[0, 0].item() == pytest.approx(0.5 / (0.5 + 1e-6))


def test_constant_group_is_exactly_zero_even_scaled() -> None:
    adv_BG, metrics = grpo_advantages(torch.full((2, 3), 0.1), scale_by_std=True)
    assert torch.equal(adv_BG, torch.zeros(2, 3))
    assert metrics["frac_zero_variance_groups"] == 1.0


@pytest.mark.parametrize(
    ("rewards", "match"),
    [
        (torch.zeros(0, 4), "B=0"),
        (torch.zeros(3, 1), "G=1"),
        (torch.zeros(4), r"shape \[B, G\]"),
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), "group 0, completion 1"),
        (torch.tensor([[1.0, 0.0], [float("inf"), 1.0]]), "non-finite reward inf at group 1"),
    ],
)
def test_grpo_rejects_bad_rewards(rewards: torch.Tensor, match: str) -> None:
    with pytest.raises(ExperimentError, match=match):
        grpo_advantages(rewards)


def test_registry_holds_grpo() -> None:
    assert ADVANTAGES["grpo"] is grpo_advantages


def test_zscore_by_hand() -> None:
    # [0, 4]: mean 2, population std 2 -> [-1, 1]
    assert torch.allclose(zscore(torch.tensor([0.0, 4.0]), eps=0.0), torch.tensor([-1.0, 1.0]))
    # [1, 2, 3]: std sqrt(2/3) -> +-1/sqrt(2/3) = +-1.2247
    out = zscore(torch.tensor([1.0, 2.0, 3.0]), eps=0.0)
    assert torch.allclose(out, torch.tensor([-1.0, 0.0, 1.0]) / math.sqrt(2 / 3))


def test_zscore_constant_and_empty() -> None:
    assert torch.equal(zscore(torch.full((5,), 0.3)), torch.zeros(5))
    assert torch.equal(zscore(torch.tensor([7.0])), torch.zeros(1))
    with pytest.raises(ExperimentError, match="empty"):
        zscore(torch.zeros(0))
