import math

import pytest
import torch

from purplerl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGES,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    grpo_std_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from purplerl.errors import ExperimentError, UserError

INF = float("inf")


def test_rloo_by_hand() -> None:
    # mean of the other three: 1/3, 2/3, 2/3, 1/3 -> 1 - 1/3 = 2/3, 0 - 2/3 = -2/3, ...
    adv_BG, metrics = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.allclose(adv_BG, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    assert metrics["adv_abs_mean"] == pytest.approx(2 / 3)
    # [1, 2, 6]: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    adv_BG, _ = rloo_advantages(torch.tensor([[1.0, 2.0, 6.0]]))
    assert torch.allclose(adv_BG, torch.tensor([[-3.0, -1.5, 4.5]]))


def test_rloo_matches_leave_one_out_definition() -> None:
    rewards_BG = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    adv_BG, _ = rloo_advantages(rewards_BG)
    for b in range(3):
        for g in range(5):
            others = torch.cat([rewards_BG[b, :g], rewards_BG[b, g + 1:]])
            assert adv_BG[b, g].item() == pytest.approx((rewards_BG[b, g] - others.mean()).item(), abs=1e-6)


def test_dr_grpo_by_hand_never_scales() -> None:
    adv_BG, metrics = dr_grpo_advantages(torch.tensor([[1.0, 2.0, 6.0], [4.0, 4.0, 4.0]]))
    assert torch.allclose(adv_BG, torch.tensor([[-2.0, -1.0, 3.0], [0.0, 0.0, 0.0]]))
    assert metrics["frac_zero_variance_groups"] == 0.5
    assert metrics["adv_abs_mean"] == pytest.approx(6 / 6)
    with pytest.raises(UserError, match="dr_grpo: scale_by_std=True is not allowed"):
        dr_grpo_advantages(torch.tensor([[1.0, 0.0]]), scale_by_std=True)
    with pytest.raises(UserError, match="rloo: scale_by_std=True"):
        rloo_advantages(torch.tensor([[1.0, 0.0]]), scale_by_std=True)


def test_constant_groups_are_exact_zeros() -> None:
    for fn in ADVANTAGES.values():
        adv_BG, metrics = fn(torch.full((2, 3), 0.1), scale_by_std=False, eps=1e-6)
        assert torch.equal(adv_BG, torch.zeros(2, 3))
        assert metrics["frac_zero_variance_groups"] == 1.0


def test_grpo_std_is_grpo_divided_by_the_group_std() -> None:
    # {0, 1}: mean 0.5, population std 0.5 -> (-0.5, 0.5) / (0.5 + eps); {1, 1, 4}: mean 2, std sqrt(2)
    adv_BG, _ = grpo_std_advantages(torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 4.0]]), eps=0.0)
    third = 1.0 / 3.0
    std0 = (2 * third ** 2 + (2 * third) ** 2) ** 0.5 / 3 ** 0.5  # population std of {0, 1, 1}
    expected = [[-2 * third / std0, third / std0, third / std0], [-1 / 2 ** 0.5, -1 / 2 ** 0.5, 2 / 2 ** 0.5]]
    torch.testing.assert_close(adv_BG, torch.tensor(expected))
    # the same as grpo with the std division asked for, and scale_by_std=False does not switch it off
    torch.testing.assert_close(grpo_std_advantages(torch.tensor([[0.0, 1.0]]), scale_by_std=False, eps=0.0)[0],
                               torch.tensor([[-1.0, 1.0]]))


def test_registries() -> None:
    assert ADVANTAGES == {"grpo": grpo_advantages, "grpo_std": grpo_std_advantages, "dr_grpo": dr_grpo_advantages,
                          "rloo": rloo_advantages}
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "grpo_std", "dr_grpo", "rloo", "reinforce_pp"}
    assert ADVANTAGE_ESTIMATORS["reinforce_pp"] is reinforce_pp_advantages
    with pytest.raises(UserError, match=r"unknown advantage estimator 'ppo' \(known: dr_grpo, grpo, grpo_std, "
                                        r"reinforce_pp, rloo\)"):
        compute_advantages("ppo", torch.ones(1, 2), torch.ones(2, 3))


# B=1 prompt, G=2 completions; row 0 has three completion tokens, row 1 one (group-major rows).
MASK_NT = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])


def test_sequence_level_broadcast_by_hand() -> None:
    rewards_BG = torch.tensor([[1.0, 0.0]])
    adv_NT, metrics = compute_advantages("grpo", rewards_BG, MASK_NT)
    assert torch.equal(adv_NT, torch.tensor([[0.0, 0.5, 0.5, 0.5], [0.0, -0.5, 0.0, 0.0]]))
    assert metrics == {"frac_zero_variance_groups": 0.0, "adv_abs_mean": 0.5}
    # scaled: population std 0.5 -> +-1
    adv_NT, _ = compute_advantages("grpo", rewards_BG, MASK_NT, scale_by_std=True, eps=0.0)
    assert torch.equal(adv_NT, torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, -1.0, 0.0, 0.0]]))
    # RLOO with G=2: 1 - 0 = 1, 0 - 1 = -1
    adv_NT, _ = compute_advantages("rloo", rewards_BG, MASK_NT)
    assert torch.equal(adv_NT, torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, -1.0, 0.0, 0.0]]))
    adv_NT, _ = compute_advantages("dr_grpo", rewards_BG, MASK_NT)
    assert torch.equal(adv_NT, torch.tensor([[0.0, 0.5, 0.5, 0.5], [0.0, -0.5, 0.0, 0.0]]))


def test_group_major_row_order() -> None:
    # B=2, G=2: rows are (b0, g0), (b0, g1), (b1, g0), (b1, g1)
    rewards_BG = torch.tensor([[1.0, 0.0], [0.0, 4.0]])
    adv_NT, _ = compute_advantages("dr_grpo", rewards_BG, torch.ones(4, 2))
    assert torch.equal(adv_NT[:, 0], torch.tensor([0.5, -0.5, -2.0, 2.0]))


def test_sequence_level_refuses_token_kl() -> None:
    kl_NT = torch.full((2, 4), 0.1)
    for name in ("grpo", "dr_grpo", "rloo"):
        with pytest.raises(ExperimentError, match=f"{name}: a per-token KL"):
            compute_advantages(name, torch.tensor([[1.0, 0.0]]), MASK_NT, kl_NT=kl_NT, kl_beta=0.1)
        # a KL weight of 0 means no KL: accepted
        adv_NT, _ = compute_advantages(name, torch.tensor([[1.0, 0.0]]), MASK_NT, kl_NT=kl_NT, kl_beta=0.0)
        assert adv_NT[0, 1] > 0


def test_reinforce_pp_by_hand() -> None:
    rewards_BG = torch.tensor([[1.0, 0.0]])
    # off-mask KL values are junk (inf) and must be ignored
    kl_NT = torch.tensor([[INF, 0.1, 0.2, 0.3], [INF, 0.5, INF, INF]])
    # kl_beta = 0.5 -> token rewards -0.5 * kl, the sequence reward added at the last completion token:
    #   row 0: [., -0.05, -0.10, -0.15 + 1.0 = 0.85]   row 1: [., -0.25 + 0.0, ., .]
    # returns (sum of the rewards from t on):
    #   row 0: [., 0.70, 0.75, 0.85]                   row 1: [., -0.25, ., .]
    returns = [0.70, 0.75, 0.85, -0.25]
    mean = sum(returns) / 4  # 2.05 / 4 = 0.5125
    # whitened as GAE and veRL whiten: the variance with Bessel's correction, 0.786875 / 3, and eps 0 here
    std = math.sqrt(sum((x - mean) ** 2 for x in returns) / 3)
    population_std = math.sqrt(sum((x - mean) ** 2 for x in returns) / 4)  # what the metric reports
    adv_NT, metrics = reinforce_pp_advantages(rewards_BG, MASK_NT, kl_NT=kl_NT, kl_beta=0.5, eps=0.0)
    expected_NT = torch.tensor([[0.0, (0.70 - mean) / std, (0.75 - mean) / std, (0.85 - mean) / std],
                                [0.0, (-0.25 - mean) / std, 0.0, 0.0]])
    assert torch.allclose(adv_NT, expected_NT, atol=1e-6)
    assert metrics["return_mean"] == pytest.approx(0.5125)
    assert metrics["return_std"] == pytest.approx(population_std)
    assert metrics["kl_reward_mean"] == pytest.approx(-(0.05 + 0.10 + 0.15 + 0.25) / 4)
    assert metrics["frac_zero_variance_groups"] == 0.0
    assert metrics["adv_abs_mean"] == pytest.approx(float(expected_NT.abs().sum() / 4), abs=1e-6)
    # the same through the entry point
    adv2_NT, _ = compute_advantages("reinforce_pp", rewards_BG, MASK_NT, kl_NT=kl_NT, kl_beta=0.5, eps=0.0)
    assert torch.equal(adv2_NT, adv_NT)


def test_reinforce_pp_two_sequences_no_kl() -> None:
    # B=2 prompts, G=1 (no group needed). Returns: row 0 -> [2, 2], row 1 -> [0].
    # mean 4/3, variance with Bessel's correction ((2/3)^2 * 2 + (4/3)^2) / 2 = 4/3, std 2/sqrt3
    # -> (2/3) / (2/sqrt3) = 1/sqrt3 twice, (-4/3) / (2/sqrt3) = -2/sqrt3
    mask_NT = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    adv_NT, metrics = compute_advantages("reinforce_pp", torch.tensor([[2.0], [0.0]]), mask_NT, eps=0.0)
    s = 1 / math.sqrt(3)
    assert torch.allclose(adv_NT, torch.tensor([[s, s, 0.0], [0.0, -2 * s, 0.0]]))
    assert metrics["frac_zero_variance_groups"] == 1.0  # G = 1: every group is trivially constant
    # whitening divides by the std already: scale_by_std changes nothing
    adv_scaled_NT, _ = compute_advantages("reinforce_pp", torch.tensor([[2.0], [0.0]]), mask_NT, eps=0.0,
                                          scale_by_std=True)
    assert torch.equal(adv_scaled_NT, adv_NT)


def test_reinforce_pp_constant_returns_whiten_to_zero() -> None:
    adv_NT, _ = compute_advantages("reinforce_pp", torch.tensor([[3.0, 3.0]]), torch.tensor([[1.0], [1.0]]))
    assert torch.equal(adv_NT, torch.zeros(2, 1))


def test_reinforce_pp_kl_errors() -> None:
    rewards_BG = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ExperimentError, match="kl_beta=0.1 but no per-token KL"):
        compute_advantages("reinforce_pp", rewards_BG, MASK_NT, kl_beta=0.1)
    with pytest.raises(ExperimentError, match="non-finite KL nan at row 1, token 1"):
        kl_NT = torch.tensor([[0.0, 0.1, 0.1, 0.1], [0.0, float("nan"), 0.0, 0.0]])
        compute_advantages("reinforce_pp", rewards_BG, MASK_NT, kl_NT=kl_NT, kl_beta=0.1)
    with pytest.raises(ExperimentError, match=r"kl_NT shape \(2, 3\)"):
        compute_advantages("reinforce_pp", rewards_BG, MASK_NT, kl_NT=torch.zeros(2, 3), kl_beta=0.1)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_bad_inputs_name_the_estimator(name: str) -> None:
    with pytest.raises(ExperimentError, match=f"{name}.*empty batch"):
        compute_advantages(name, torch.zeros(0, 2), torch.zeros(0, 3))
    with pytest.raises(ExperimentError, match=f"{name}.*non-finite reward inf at group 0, completion 1"):
        compute_advantages(name, torch.tensor([[0.0, INF]]), MASK_NT)
    with pytest.raises(ExperimentError, match=rf"{name}: mask must have shape \[B\*G=2, T\]"):
        compute_advantages(name, torch.tensor([[1.0, 0.0]]), torch.ones(3, 4))
    with pytest.raises(ExperimentError, match=f"{name}: row 1 \\(group 0, completion 1\\) has no completion"):
        compute_advantages(name, torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(UserError, match=f"{name}: kl_beta must be"):
        compute_advantages(name, torch.tensor([[1.0, 0.0]]), MASK_NT, kl_beta=-0.1)
    with pytest.raises(UserError, match=f"{name}: eps must be"):
        compute_advantages(name, torch.tensor([[1.0, 0.0]]), MASK_NT, eps=float("nan"))


def test_group_estimators_need_two_completions() -> None:
    for name in ("grpo", "dr_grpo", "rloo"):
        with pytest.raises(ExperimentError, match="G=1; this estimator needs G >= 2"):
            compute_advantages(name, torch.ones(2, 1), torch.ones(2, 3))


def test_advantages_carry_no_gradient() -> None:
    rewards_BG = torch.tensor([[1.0, 0.0]], requires_grad=True)
    kl_NT = torch.full((2, 4), 0.1, requires_grad=True)
    for name in ADVANTAGE_ESTIMATORS:
        adv_NT, _ = compute_advantages(name, rewards_BG, MASK_NT, kl_NT=kl_NT if name == "reinforce_pp" else None,
                                       kl_beta=0.1 if name == "reinforce_pp" else 0.0)
        assert not adv_NT.requires_grad
        assert adv_NT.dtype == torch.float32
