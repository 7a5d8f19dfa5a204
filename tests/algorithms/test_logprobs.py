import math

import pytest
import torch

from purplerl.algorithms.logprobs import entropy_from_logits, masked_mean, masked_sum, selective_log_softmax
from tests.tolerances import reduction_atol, rounding_atol


def _reference_logp(logits_NTV: torch.Tensor, index_NT: torch.Tensor, temperature: float) -> torch.Tensor:
    logp_NTV = torch.log_softmax(logits_NTV.float() / temperature, dim=-1)
    return logp_NTV.gather(-1, index_NT[..., None])[..., 0]


def test_selective_log_softmax_by_hand() -> None:
    # logits [0, log 3] -> probs [1/4, 3/4]
    logits_NTV = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    got = selective_log_softmax(logits_NTV, torch.tensor([[1, 0]]))
    assert torch.allclose(got, torch.tensor([[math.log(0.75), math.log(0.25)]]))
    # temperature 2 halves the logits: [0, log 3 / 2] -> p1 = sqrt 3 / (1 + sqrt 3)
    got_t = selective_log_softmax(logits_NTV, torch.tensor([[1, 0]]), temperature=2.0)
    s3 = math.sqrt(3.0)
    assert torch.allclose(got_t, torch.tensor([[math.log(s3 / (1 + s3)), math.log(1 / (1 + s3))]]))


@pytest.mark.parametrize("chunk_rows", [1, 4, 15, 1000])  # 15 rows: 4 does not divide 3 * 5
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_log_softmax_matches_full(chunk_rows: int, temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    logits_NTV = torch.randn(3, 5, 11, generator=gen) * 3
    index_NT = torch.randint(0, 11, (3, 5), generator=gen)
    got = selective_log_softmax(logits_NTV, index_NT, temperature=temperature, chunk_rows=chunk_rows)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    want = _reference_logp(logits_NTV, index_NT, temperature)
    # two fp32 log-softmax kernels: a logsumexp over the 11 logits, and the few roundings around it, of terms up to
    # |logit| / temperature; a logprob near 0 cancels two such terms (tests/tolerances.py)
    atol = reduction_atol(torch.float32, 11 + 4, float(logits_NTV.abs().max()) / temperature + float(want.abs().max()))
    assert torch.allclose(got, want, rtol=0, atol=atol)


def test_selective_log_softmax_gradient_and_bf16() -> None:
    gen = torch.Generator().manual_seed(1)
    logits_a = torch.randn(2, 3, 7, generator=gen).requires_grad_()
    logits_b = logits_a.detach().clone().requires_grad_()
    index_NT = torch.randint(0, 7, (2, 3), generator=gen)
    selective_log_softmax(logits_a, index_NT, chunk_rows=4).sum().backward()
    _reference_logp(logits_b, index_NT, 1.0).sum().backward()
    assert torch.allclose(logits_a.grad, logits_b.grad, atol=1e-6)
    got = selective_log_softmax(logits_a.detach().bfloat16(), index_NT)
    assert got.dtype == torch.float32


def test_selective_log_softmax_backward_by_hand() -> None:
    # d/dx log softmax(x)[i] = onehot(i) - softmax(x): probs [1/4, 3/4], index 1 -> [-1/4, 1/4];
    # at temperature 2 the same divided by 2, with the softmax of x / 2 (probs [1/(1+s3), s3/(1+s3)])
    logits = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    selective_log_softmax(logits, torch.tensor([[1]])).sum().backward()
    assert torch.allclose(logits.grad, torch.tensor([[[-0.25, 0.25]]]))
    logits.grad = None
    (3.0 * selective_log_softmax(logits, torch.tensor([[0]]), temperature=2.0)).sum().backward()
    s3 = math.sqrt(3.0)
    expected = 3.0 / 2 * torch.tensor([1 - 1 / (1 + s3), -s3 / (1 + s3)])
    assert torch.allclose(logits.grad[0, 0], expected.float(), atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_selective_log_softmax_passes_gradcheck(temperature: float) -> None:
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 3, 9, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    index_NT = torch.randint(0, 9, (2, 3), generator=gen)
    weights = torch.randn(2, 3, generator=gen, dtype=torch.float64)

    def weighted_logp(x: torch.Tensor) -> torch.Tensor:  # float64 in, float32 out: compare in float64
        from purplerl.algorithms.logprobs import _GatheredLogSoftmax

        return _GatheredLogSoftmax.apply(x.reshape(-1, 9), index_NT.reshape(-1), temperature) * weights.reshape(-1)

    assert torch.autograd.gradcheck(weighted_logp, (logits,))


def test_selective_log_softmax_bf16_gradient_stays_bf16_and_near_fp32() -> None:
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(4, 6, 50, generator=gen) * 4
    index_NT = torch.randint(0, 50, (4, 6), generator=gen)
    low = base.bfloat16().requires_grad_()
    selective_log_softmax(low, index_NT, chunk_rows=5).sum().backward()
    full = base.bfloat16().float().requires_grad_()  # the same rounded inputs, reference maths in fp32
    _reference_logp(full, index_NT, 1.0).sum().backward()
    assert low.grad.dtype == torch.bfloat16
    # fp32 maths over the 50-wide rows, then one rounding to bf16 of values in [-1, 1] (tests/tolerances.py)
    atol = rounding_atol(torch.bfloat16, 1, 1.0) + reduction_atol(torch.float32, 50, 1.0)
    assert torch.allclose(low.grad.float(), full.grad, rtol=0, atol=atol)


def test_entropy_uniform_is_log_v() -> None:
    got = entropy_from_logits(torch.zeros(2, 3, 8), chunk_rows=4)
    assert torch.allclose(got, torch.full((2, 3), math.log(8.0)))


def test_entropy_by_hand_with_masked_vocab() -> None:
    # p = [1/4, 3/4, 0]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335; the -inf logit adds nothing
    logits = torch.tensor([[[0.0, math.log(3.0), -math.inf]]], requires_grad=True)
    got = entropy_from_logits(logits)
    assert got.item() == pytest.approx(0.562335, abs=1e-6)
    got.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_matches_full_with_temperature() -> None:
    logits_NTV = torch.randn(2, 5, 9, generator=torch.Generator().manual_seed(2))
    p = torch.softmax(logits_NTV / 1.5, dim=-1)
    ref = -(p * p.log()).sum(-1)
    assert torch.allclose(entropy_from_logits(logits_NTV, temperature=1.5, chunk_rows=3), ref, atol=1e-5)


def test_masked_mean_and_sum_by_hand() -> None:
    x = torch.tensor([[1.0, 2.0, math.inf], [4.0, 5.0, math.nan]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_sum(x, mask).item() == 3.0
    assert masked_mean(x, mask).item() == 1.5
    assert torch.equal(masked_mean(x, mask, dim=1), torch.tensor([1.5, 0.0]))  # empty row -> 0
    assert torch.equal(masked_sum(x, mask, dim=0), torch.tensor([1.0, 2.0, 0.0]))
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0
