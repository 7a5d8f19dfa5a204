import math

import pytest
import torch

from purplerl.algorithms.noiser import normalize_noise, token_noiser_loss
from purplerl.errors import ExperimentError, UserError

LN2 = math.log(2.0)
# p = [1/2, 1/4, 1/8, 1/8] -> -log p = [1, 2, 3, 3] * ln2; the +3 shift cancels in the softmax.
LOGITS_V = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125])) + 3.0


def hand_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logits_NTV = LOGITS_V.expand(1, 3, 4).clone()
    targets_NT = torch.tensor([[0, 2, 1]])
    mask_NT = torch.tensor([[1.0, 1.0, 0.0]])
    # raw noise; the target entry is zeroed, then each row is normalized:
    #   position 0 (target 0): [0.7, 0.5, 0.25, 0.25] -> [0, 0.5, 0.25, 0.25]
    #   position 1 (target 2): [1, 1, 5, 2]           -> [0.25, 0.25, 0, 0.5]
    noise_NTV = torch.tensor([[[0.7, 0.5, 0.25, 0.25], [1.0, 1.0, 5.0, 2.0], [1.0, 1.0, 1.0, 1.0]]])
    return logits_NTV, targets_NT, mask_NT, noise_NTV


# position 0: nll = ln2; noise ce = 0.5 * 2ln2 + 0.25 * 3ln2 + 0.25 * 3ln2 = 2.5 ln2
# position 1: nll = 3 ln2; noise ce = 0.25 * ln2 + 0.25 * 2ln2 + 0.5 * 3ln2 = 2.25 ln2
# position 2 is off the mask: 0
# "paper" (w = eps = 0.1):       0.9 * ln2 + 0.1 * 2.5 ln2 = 1.15 ln2;     0.9 * 3ln2 + 0.1 * 2.25 ln2 = 2.925 ln2
# "reference" (w = eps^2 = 0.01): 0.9 * ln2 + 0.01 * 2.5 ln2 = 0.925 ln2;  0.9 * 3ln2 + 0.01 * 2.25 ln2 = 2.7225 ln2
HAND_LOSS = {"paper": [1.15 * LN2, 2.925 * LN2, 0.0], "reference": [0.925 * LN2, 2.7225 * LN2, 0.0]}


@pytest.mark.parametrize("noise_weight", ["paper", "reference"])
def test_loss_by_hand(noise_weight: str) -> None:
    logits_NTV, targets_NT, mask_NT, noise_NTV = hand_case()
    loss_NT, metrics = token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.1, generator=None,
                                         noise_NTV=noise_NTV, noise_weight=noise_weight)
    assert torch.allclose(loss_NT, torch.tensor([HAND_LOSS[noise_weight]]), atol=1e-6)
    assert metrics["noiser_nll"] == pytest.approx(2.0 * LN2)  # the parts are reported unweighted
    assert metrics["noiser_noise_ce"] == pytest.approx(2.375 * LN2)
    assert loss_NT.dtype == torch.float32


def test_reference_weight_is_the_default() -> None:
    logits_NTV, targets_NT, mask_NT, noise_NTV = hand_case()
    loss_NT, _ = token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.1, generator=None, noise_NTV=noise_NTV)
    assert torch.allclose(loss_NT, torch.tensor([HAND_LOSS["reference"]]), atol=1e-6)
    with pytest.raises(UserError, match="noise_weight must be one of reference, paper, got 'half'"):
        token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.1, generator=None, noise_NTV=noise_NTV,
                          noise_weight="half")


def test_minimum_puts_the_noise_weight_off_the_target() -> None:
    # One position, V = 3, target 0, noise [0, 0.5, 0.5]: the loss is minimized at p = [1 - eps, w n] / (1 - eps + w).
    # reference, eps = 0.1: p = [0.9, 0.005, 0.005] / 0.91; paper: p = [0.9, 0.05, 0.05] / 1.0.
    for noise_weight, p_target in (("reference", 0.9 / 0.91), ("paper", 0.9)):
        logits = torch.zeros(1, 1, 3, requires_grad=True)
        optimizer = torch.optim.SGD([logits], lr=5.0)
        for _ in range(400):
            optimizer.zero_grad()
            loss_NT, _ = token_noiser_loss(logits, torch.tensor([[0]]), torch.ones(1, 1), epsilon=0.1, generator=None,
                                           noise_NTV=torch.tensor([[[0.0, 1.0, 1.0]]]), noise_weight=noise_weight)
            loss_NT.sum().backward()
            optimizer.step()
        assert float(torch.softmax(logits.detach(), -1)[0, 0, 0]) == pytest.approx(p_target, abs=1e-4)


def test_temperature_divides_the_logits() -> None:
    logits_NTV, targets_NT, mask_NT, noise_NTV = hand_case()
    loss_NT, _ = token_noiser_loss(2.0 * logits_NTV, targets_NT, mask_NT, epsilon=0.1, generator=None,
                                   noise_NTV=noise_NTV, temperature=2.0, noise_weight="paper")
    assert torch.allclose(loss_NT, torch.tensor([HAND_LOSS["paper"]]), atol=1e-6)


def test_normalize_noise_rows() -> None:
    raw_RV = torch.rand(6, 9, generator=torch.Generator().manual_seed(0))
    targets_R = torch.tensor([0, 8, 3, 3, 5, 1])
    noise_RV = normalize_noise(raw_RV, targets_R)
    assert torch.allclose(noise_RV.sum(dim=1), torch.ones(6))
    assert torch.equal(noise_RV[torch.arange(6), targets_R], torch.zeros(6))
    assert (noise_RV[torch.arange(9)[None, :] != targets_R[:, None]] > 0).all()
    assert torch.allclose(normalize_noise(torch.tensor([[3.0, 1.0, 3.0]]), torch.tensor([1])),
                          torch.tensor([[0.5, 0.0, 0.5]]))
    with pytest.raises(ExperimentError, match="noise row 0 has no positive weight"):
        normalize_noise(torch.tensor([[0.0, 1.0]]), torch.tensor([1]))


def random_case(seed: int = 0, vocab: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits_NTV = 2.0 * torch.randn(3, 4, vocab, generator=gen)
    targets_NT = torch.randint(0, vocab, (3, 4), generator=gen)
    mask_NT = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]]).float()  # 6 masked positions
    return logits_NTV, targets_NT, mask_NT


def test_epsilon_zero_is_plain_nll() -> None:
    logits_NTV, targets_NT, mask_NT = random_case()
    loss_NT, metrics = token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.0,
                                         generator=torch.Generator().manual_seed(1))
    nll_NT = torch.nn.functional.cross_entropy(logits_NTV.transpose(1, 2), targets_NT, reduction="none")
    assert torch.allclose(loss_NT, nll_NT * mask_NT, atol=1e-6)
    assert metrics["noiser_nll"] == pytest.approx(float((nll_NT * mask_NT).sum() / 6), abs=1e-6)


def direct_loss(logits_NTV: torch.Tensor, targets_NT: torch.Tensor, mask_NT: torch.Tensor, raw_NTV: torch.Tensor,
                epsilon: float, weight: float) -> torch.Tensor:
    """The formula on the whole [N, T, V] tensor at once, written independently of the module."""
    logp_NTV = torch.log_softmax(logits_NTV, dim=-1)
    onehot_NTV = torch.nn.functional.one_hot(targets_NT, logits_NTV.shape[-1]).float()
    noise_NTV = raw_NTV * (1 - onehot_NTV)
    noise_NTV = noise_NTV / noise_NTV.sum(dim=-1, keepdim=True)
    nll_NT = -(onehot_NTV * logp_NTV).sum(-1)
    noise_ce_NT = -(noise_NTV * logp_NTV).sum(-1)
    return ((1 - epsilon) * nll_NT + weight * noise_ce_NT) * mask_NT


def test_gradient_matches_direct_implementation() -> None:
    logits_NTV, targets_NT, mask_NT = random_case()
    raw_NTV = torch.rand(logits_NTV.shape, generator=torch.Generator().manual_seed(2))
    weights_NT = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    ours = logits_NTV.clone().requires_grad_()
    loss_NT, _ = token_noiser_loss(ours, targets_NT, mask_NT, epsilon=0.3, generator=None, noise_NTV=raw_NTV,
                                   chunk_rows=4)
    (loss_NT * weights_NT).sum().backward()
    ref = logits_NTV.clone().requires_grad_()
    ref_NT = direct_loss(ref, targets_NT, mask_NT, raw_NTV, epsilon=0.3, weight=0.3 * 0.3)
    (ref_NT * weights_NT).sum().backward()
    assert torch.allclose(loss_NT, ref_NT, atol=1e-5)
    assert torch.allclose(ours.grad, ref.grad, atol=1e-5)
    assert torch.equal(ours.grad[mask_NT == 0], torch.zeros_like(ours.grad[mask_NT == 0]))


def test_chunked_equals_unchunked() -> None:
    logits_NTV, targets_NT, mask_NT = random_case()
    raw_NTV = torch.rand(logits_NTV.shape, generator=torch.Generator().manual_seed(2))
    kw = {"epsilon": 0.1, "generator": None, "noise_NTV": raw_NTV}
    whole_NT, whole_metrics = token_noiser_loss(logits_NTV, targets_NT, mask_NT, chunk_rows=1000, **kw)
    for chunk_rows in (1, 4, 5):  # 6 masked positions: 4 and 5 leave a short last chunk
        chunked_NT, metrics = token_noiser_loss(logits_NTV, targets_NT, mask_NT, chunk_rows=chunk_rows, **kw)
        assert torch.allclose(chunked_NT, whole_NT, atol=1e-6)
        assert metrics == pytest.approx(whole_metrics)


def test_generator_draws_uniform_noise_for_masked_positions_in_order() -> None:
    logits_NTV, targets_NT, mask_NT = random_case()
    loss_NT, _ = token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.5,
                                   generator=torch.Generator().manual_seed(7))
    again_NT, _ = token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.5,
                                    generator=torch.Generator().manual_seed(7))
    assert torch.equal(loss_NT, again_NT)
    # one chunk: the 6 masked positions (row-major) get the rows of one torch.rand(6, V) draw
    raw_RV = torch.rand(6, 7, generator=torch.Generator().manual_seed(7))
    raw_NTV = torch.zeros(3, 4, 7)
    raw_NTV[mask_NT != 0] = raw_RV
    expected_NT = direct_loss(logits_NTV, targets_NT, mask_NT, raw_NTV + (mask_NT == 0)[..., None], epsilon=0.5,
                              weight=0.25)
    assert torch.allclose(loss_NT, expected_NT, atol=1e-5)
    other_NT, _ = token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.5,
                                    generator=torch.Generator().manual_seed(8))
    assert not torch.allclose(other_NT, loss_NT)


def test_off_mask_logits_are_never_read() -> None:
    logits_NTV, targets_NT, mask_NT = random_case()
    logits_NTV[mask_NT == 0] = float("nan")
    targets_NT[mask_NT == 0] = -1
    logits = logits_NTV.requires_grad_()
    loss_NT, metrics = token_noiser_loss(logits, targets_NT, mask_NT, epsilon=0.1,
                                         generator=torch.Generator().manual_seed(0))
    loss_NT.sum().backward()
    assert torch.isfinite(loss_NT).all() and torch.isfinite(logits.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


def test_empty_mask_gives_zero_loss() -> None:
    logits_NTV, targets_NT, _ = random_case()
    logits = logits_NTV.requires_grad_()
    loss_NT, metrics = token_noiser_loss(logits, targets_NT, torch.zeros(3, 4), epsilon=0.1,
                                         generator=torch.Generator())
    assert torch.equal(loss_NT, torch.zeros(3, 4))
    assert metrics == {"noiser_nll": 0.0, "noiser_noise_ce": 0.0}
    loss_NT.sum().backward()  # does not raise


def test_errors() -> None:
    logits_NTV, targets_NT, mask_NT = random_case()
    gen = torch.Generator()
    with pytest.raises(UserError, match="epsilon must be in \\[0, 1\\], got 1.5"):
        token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=1.5, generator=gen)
    with pytest.raises(UserError, match="temperature must be > 0"):
        token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.1, generator=gen, temperature=0.0)
    with pytest.raises(UserError, match="chunk_rows must be >= 1"):
        token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.1, generator=gen, chunk_rows=0)
    with pytest.raises(ExperimentError, match="need a generator"):
        token_noiser_loss(logits_NTV, targets_NT, mask_NT, epsilon=0.1, generator=None)
    with pytest.raises(ExperimentError, match="must be \\[N, T\\]"):
        token_noiser_loss(logits_NTV, targets_NT[:, :2], mask_NT, epsilon=0.1, generator=gen)
    bad_targets = targets_NT.clone()
    bad_targets[0, 1] = 7
    with pytest.raises(ExperimentError, match="masked targets must lie in \\[0, 7\\)"):
        token_noiser_loss(logits_NTV, bad_targets, mask_NT, epsilon=0.1, generator=gen)
    inf_logits = logits_NTV.clone()
    inf_logits[1, 1, (int(targets_NT[1, 1]) + 1) % 7] = -float("inf")  # noise puts weight on a zero-prob token
    with pytest.raises(ExperimentError, match="non-finite loss inf at row 1, token 1"):
        token_noiser_loss(inf_logits, targets_NT, mask_NT, epsilon=0.1, generator=gen)
