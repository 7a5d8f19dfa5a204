import math

import pytest
import torch

from purplerl.algorithms.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3, sequence_kl
from purplerl.errors import ExperimentError, UserError

LOG2 = math.log(2.0)


def test_estimators_by_hand() -> None:
    # pair 0: p = 0.5, p_ref = 0.25 -> log r = log(p_ref / p) = -log 2, r = 0.5
    # pair 1: p = 0.25, p_ref = 0.5 -> log r = +log 2, r = 2
    # pair 2: equal -> every estimator is 0
    logp = torch.tensor([math.log(0.5), math.log(0.25), -1.3])
    ref = torch.tensor([math.log(0.25), math.log(0.5), -1.3])
    assert torch.allclose(kl_k1(logp, ref), torch.tensor([LOG2, -LOG2, 0.0]))
    # 0.5 * (log 2)^2 = 0.240227
    assert torch.allclose(kl_k2(logp, ref), torch.tensor([0.240227, 0.240227, 0.0]), atol=1e-6)
    # k3 = r - log r - 1: 0.5 + 0.693147 - 1 = 0.193147 and 2 - 0.693147 - 1 = 0.306853
    assert torch.allclose(kl_k3(logp, ref), torch.tensor([0.193147, 0.306853, 0.0]), atol=1e-6)


def test_registry() -> None:
    assert KL_ESTIMATORS == {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


# Masked tokens: sequence 0 at t=1,2 (logp - ref = +1, -1); sequence 1 at t=1 (logp - ref = +0.5).
# Off-mask entries hold junk (including -inf) that must not leak in.
LOGP_NT = torch.tensor([[9.0, -1.0, -2.0, 7.0], [9.0, -0.5, 0.0, 0.0]])
REF_NT = torch.tensor([[-math.inf, -2.0, -1.0, 0.0], [0.0, -1.0, 0.0, 0.0]])
MASK_NT = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("estimator", "mean", "total"),
    [
        ("k1", [0.0, 0.5], [0.0, 0.5]),  # (+1 - 1) / 2; 0.5
        ("k2", [0.5, 0.125], [1.0, 0.125]),  # (0.5 + 0.5) / 2; 0.5 * 0.25
        # log r = -1: e^-1 = 0.367879; log r = +1: e - 2 = 0.718282; log r = -0.5: e^-0.5 - 0.5 = 0.106531
        ("k3", [(0.367879 + 0.718282) / 2, 0.106531], [0.367879 + 0.718282, 0.106531]),
    ],
)
def test_sequence_kl_by_hand(estimator: str, mean: list[float], total: list[float]) -> None:
    got_mean = sequence_kl(LOGP_NT, REF_NT, MASK_NT, estimator, reduction="mean")
    got_sum = sequence_kl(LOGP_NT, REF_NT, MASK_NT, estimator, reduction="sum")
    assert torch.allclose(got_mean, torch.tensor(mean), atol=1e-5)
    assert torch.allclose(got_sum, torch.tensor(total), atol=1e-5)


def test_sequence_kl_empty_sequence() -> None:
    mask_NT = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    with pytest.raises(ExperimentError, match="sequence 1 has no masked tokens"):
        sequence_kl(torch.zeros(2, 2), torch.zeros(2, 2), mask_NT)


def test_sequence_kl_rejects_bad_inputs() -> None:
    ones = torch.ones(1, 3)
    with pytest.raises(ExperimentError, match="non-finite reference logprobs .* sequence 0, token 2"):
        sequence_kl(torch.zeros(1, 3), torch.tensor([[0.0, 0.0, math.nan]]), ones)
    with pytest.raises(ExperimentError, match="non-finite policy logprobs"):
        sequence_kl(torch.tensor([[0.0, -math.inf, 0.0]]), torch.zeros(1, 3), ones)
    with pytest.raises(ExperimentError, match="shapes must match"):
        sequence_kl(torch.zeros(1, 3), torch.zeros(1, 4), ones)
    # exp(200) overflows float32
    with pytest.raises(ExperimentError, match="'k3' overflowed"):
        sequence_kl(torch.full((1, 3), -200.0), torch.zeros(1, 3), ones, "k3")
    with pytest.raises(UserError, match="unknown KL estimator 'k4'"):
        sequence_kl(torch.zeros(1, 3), torch.zeros(1, 3), ones, "k4")
    with pytest.raises(UserError, match="unknown reduction"):
        sequence_kl(torch.zeros(1, 3), torch.zeros(1, 3), ones, "k1", reduction="max")  # type: ignore[arg-type]
