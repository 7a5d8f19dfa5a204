import math

import pytest
import torch

from purplerl.errors import ExperimentError
from purplerl.rewards.composite import combine

TOX_N = torch.tensor([0.9, 0.1, 0.5])
REP_N = torch.tensor([0.0, 0.5, 0.25])
KL_N = torch.tensor([0.2, 0.0, 1.0])
# 1.0 * tox - 0.3 * rep - 0.1 * kl:
#   0.9 - 0     - 0.02 =  0.88
#   0.1 - 0.15  - 0    = -0.05
#   0.5 - 0.075 - 0.1  =  0.325
RAW = [0.88, -0.05, 0.325]
# mean 0.385; deviations 0.495, -0.435, -0.06; population std sqrt(0.43785 / 3) = 0.382034
ZSCORED = [0.495 / 0.382034, -0.435 / 0.382034, -0.06 / 0.382034]


def _reward(zscore: bool, toxicity_weight: float = 1.0, repetition_penalty: float = 0.3, kl_beta: float = 0.1,
            kl_N: torch.Tensor | None = KL_N, toxicity_N: torch.Tensor = TOX_N):
    """The red-team reward, toxicity_weight * tox - repetition_penalty * rep - kl_beta * kl, through combine."""
    terms = {"toxicity": (toxicity_weight, toxicity_N), "repetition": (-repetition_penalty, REP_N)}
    if kl_N is not None:
        terms["kl"] = (-kl_beta, kl_N)
    return combine(terms, zscore=zscore)


def test_composite_by_hand() -> None:
    out = _reward(zscore=False)
    assert torch.allclose(out.total_N, torch.tensor(RAW), atol=1e-6)
    assert set(out.components) == {"toxicity", "repetition", "kl", "reward_raw"}
    assert torch.equal(out.components["toxicity"], TOX_N)
    assert torch.equal(out.components["repetition"], REP_N)
    assert torch.equal(out.components["kl"], KL_N)
    assert torch.allclose(out.components["reward_raw"], torch.tensor(RAW), atol=1e-6)
    assert all(v.dtype == torch.float32 and v.shape == (3,) for v in out.components.values())


def test_composite_zscored_by_hand() -> None:
    out = _reward(zscore=True)
    assert torch.allclose(out.total_N, torch.tensor(ZSCORED), atol=1e-4)
    assert torch.allclose(out.components["reward_raw"], torch.tensor(RAW), atol=1e-6)  # before z-score
    assert out.total_N.mean().item() == pytest.approx(0.0, abs=1e-6)


def test_composite_weights() -> None:
    # toxicity weight 2, no penalties: total = 2 * tox
    out = _reward(zscore=False, toxicity_weight=2.0, repetition_penalty=0.0, kl_beta=0.0)
    assert torch.allclose(out.total_N, 2 * TOX_N)


def test_kl_may_be_absent() -> None:
    out = _reward(zscore=False, kl_N=None)
    assert "kl" not in out.components
    assert torch.allclose(out.total_N, torch.tensor([0.9, -0.05, 0.425]), atol=1e-6)


def test_non_finite_component_is_named() -> None:
    with pytest.raises(ExperimentError, match=r"reward term 'kl' is non-finite \(nan\) at completion 1"):
        _reward(zscore=False, kl_N=torch.tensor([0.0, math.nan, 0.0]))
    with pytest.raises(ExperimentError, match="reward term 'toxicity' is non-finite"):
        _reward(zscore=True, toxicity_N=torch.tensor([math.inf, 0.0, 0.0]))


def test_combine_general_terms() -> None:
    # defense-style reward: -1 * entropy + 0.5 * judge
    out = combine({"entropy": (-1.0, torch.tensor([2.0, 1.0])), "judge": (0.5, torch.tensor([1.0, 0.0]))})
    assert torch.allclose(out.total_N, torch.tensor([-1.5, -1.0]))
    assert set(out.components) == {"entropy", "judge", "reward_raw"}
    const = combine({"judge": (1.0, torch.tensor([0.3, 0.3]))}, zscore=True)
    assert torch.equal(const.total_N, torch.zeros(2))  # constant batch z-scores to 0, not NaN


def test_combine_rejects_bad_terms() -> None:
    with pytest.raises(ExperimentError, match="'b' has 3 values, expected 2"):
        combine({"a": (1.0, torch.zeros(2)), "b": (1.0, torch.zeros(3))})
    with pytest.raises(ExperimentError, match=r"'a' must have shape \[N\]"):
        combine({"a": (1.0, torch.zeros(2, 2))})
    with pytest.raises(ExperimentError, match="'a' has a non-finite weight"):
        combine({"a": (math.nan, torch.zeros(2))})
    with pytest.raises(ExperimentError, match="no completions"):
        combine({"a": (1.0, torch.zeros(0))})
    with pytest.raises(ExperimentError, match="no reward terms"):
        combine({})
    with pytest.raises(ExperimentError, match="reserved"):
        combine({"reward_raw": (1.0, torch.zeros(2))})
