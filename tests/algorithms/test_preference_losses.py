"""The direct preference losses (algorithms.preference) by hand, their registered forms, and TRL's implementations.

Two pairs throughout (p = 0, 1), sequence logprobs summed over each answer's loss tokens:
    policy    chosen (-3, -5)      rejected (-4, -4)
    reference chosen (-3.5, -4)    rejected (-3.5, -4.5)
    lengths   chosen (2, 4)        rejected (1, 5)
so the log-ratios are h_c = (0.5, -1), h_r = (-0.5, 0.5), h = h_c - h_r = (1, -1.5), and the length-averaged
logprobs a_c = (-1.5, -1.25), a_r = (-4, -0.8). softplus(-x) = -log sigmoid(x) = log(1 + e^-x).
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from purplerl.algorithms.pairwise import DPOParams, KTOParams, ORPOParams, SimPOParams
from purplerl.algorithms.preference import dpo_loss, kto_loss, log1mexp, orpo_loss, simpo_loss
from purplerl.algorithms.registry import get_loss_def
from purplerl.errors import ExperimentError, UserError
from purplerl.types import TrainBatch

CHOSEN, REJECTED = [-3.0, -5.0], [-4.0, -4.0]
REF_CHOSEN, REF_REJECTED = [-3.5, -4.0], [-3.5, -4.5]
LEN_CHOSEN, LEN_REJECTED = torch.tensor([2.0, 4.0]), torch.tensor([1.0, 5.0])


def _policy() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(CHOSEN, requires_grad=True), torch.tensor(REJECTED, requires_grad=True)


def _dpo(loss_type: str = "sigmoid", label_smoothing: float = 0.0, beta: float = 0.5):
    c, r = _policy()
    loss, metrics = dpo_loss(c, r, torch.tensor(REF_CHOSEN), torch.tensor(REF_REJECTED), beta=beta,
                             loss_type=loss_type, label_smoothing=label_smoothing, chosen_lengths_P=LEN_CHOSEN,
                             rejected_lengths_P=LEN_REJECTED)
    loss.backward()
    return loss, metrics, c.grad, r.grad


def test_dpo_sigmoid_by_hand() -> None:
    # beta 0.5: z = beta h = (0.5, -0.75); loss = mean(softplus(-0.5), softplus(0.75)) = mean(0.474077, 1.136871)
    loss, metrics, gc, gr = _dpo()
    assert loss.item() == pytest.approx(0.805474, abs=1e-6)
    # rewards beta h_c = (0.25, -0.5), beta h_r = (-0.25, 0.25); margins mean(0.5, -0.75) = -0.125 (beta included)
    assert metrics == pytest.approx({"rewards/chosen": -0.125, "rewards/rejected": 0.0, "rewards/margins": -0.125,
                                     "rewards/accuracies": 0.5, "logps/chosen": -4.0, "logps/rejected": -4.0})
    # d/dz softplus(-z) = -sigmoid(-z); times beta / P = 0.25; + for chosen, - for rejected
    expected = -0.25 * torch.sigmoid(-torch.tensor([0.5, -0.75]))
    assert torch.allclose(gc, expected) and torch.allclose(gr, -expected)
    assert bool((gc < 0).all() and (gr > 0).all())  # descent raises the chosen answers and lowers the rejected


def test_rpo_adds_the_chosen_answers_pooled_nll_by_hand() -> None:
    # NLL pooled over the chosen tokens: (3 + 5) / (2 + 4) = 4/3; alpha 0.5: 0.805474 + 0.666667 = 1.472141
    c, r = _policy()
    loss, metrics = dpo_loss(c, r, torch.tensor(REF_CHOSEN), torch.tensor(REF_REJECTED), beta=0.5,
                             chosen_lengths_P=LEN_CHOSEN, rejected_lengths_P=LEN_REJECTED, sft_weight=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(1.472141, abs=1e-6) and metrics["nll_loss"] == pytest.approx(4 / 3)
    # d NLL / d logp_c = -1/6 per chosen answer, times alpha: the pull up is added to DPO's; the rejected is untouched
    dpo_grad = -0.25 * torch.sigmoid(-torch.tensor([0.5, -0.75]))
    assert torch.allclose(c.grad, dpo_grad - 0.5 / 6) and torch.allclose(r.grad, -dpo_grad)
    with pytest.raises(ExperimentError, match="dpo: sft_weight > 0 averages the chosen answers' NLL"):
        dpo_loss(c, r, torch.tensor(REF_CHOSEN), torch.tensor(REF_REJECTED), beta=0.5, sft_weight=0.5)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(UserError, match="dpo sft_weight must be a finite number >= 0"):
            DPOParams(sft_weight=bad)


def test_cdpo_label_smoothing_by_hand() -> None:
    # -(1 - eps) log s(z) - eps log s(-z) = softplus(-z) + eps z: 0.805474 + 0.1 * mean(0.5, -0.75) = 0.792974
    loss, _, gc, gr = _dpo(label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.792974, abs=1e-6)
    # d/dz = -sigmoid(-z) + eps: at z = 0.5, -0.377541 + 0.1; the flipped label's pull caps the push
    expected = 0.25 * (-torch.sigmoid(-torch.tensor([0.5, -0.75])) + 0.1)
    assert torch.allclose(gc, expected) and torch.allclose(gr, -expected)
    # a pair far on the right side is pushed back: the gradient changes sign past z = log((1 - eps) / eps)
    c = torch.tensor([20.0], requires_grad=True)
    dpo_loss(c, torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]), beta=1.0,
             label_smoothing=0.1)[0].backward()
    assert c.grad.item() == pytest.approx(-torch.sigmoid(torch.tensor(-20.0)).item() + 0.1) and c.grad.item() > 0


def test_dpo_hinge_by_hand() -> None:
    # max(0, 1 - z) = (0.5, 1.75): mean 1.125; both pairs inside the margin, so both get -beta / P = -0.25
    loss, metrics, gc, gr = _dpo("hinge")
    assert loss.item() == pytest.approx(1.125)
    assert metrics["rewards/margins"] == pytest.approx(-0.125)
    assert torch.allclose(gc, torch.tensor([-0.25, -0.25])) and torch.allclose(gr, torch.tensor([0.25, 0.25]))
    # beta 2: z = (2, -3); the first pair is past the margin (no gradient), the second still pushed
    loss, _, gc, _ = _dpo("hinge", beta=2.0)
    assert loss.item() == pytest.approx((0.0 + 4.0) / 2)
    assert torch.allclose(gc, torch.tensor([0.0, -1.0]))


def test_ipo_by_hand_uses_length_averaged_log_ratios() -> None:
    # h_avg = h_c / n_c - h_r / n_r = (0.25 + 0.5, -0.25 - 0.1) = (0.75, -0.35); 1 / (2 beta) = 1
    # loss = mean((0.75 - 1)^2, (-0.35 - 1)^2) = mean(0.0625, 1.8225) = 0.9425
    loss, metrics, gc, gr = _dpo("ipo")
    assert loss.item() == pytest.approx(0.9425)
    # d/dlogp_c = (2 / P) (h_avg - 1) / n_c: (-0.25 / 2, -1.35 / 4); d/dlogp_r = -(h_avg - 1) / n_r: (0.25, 0.27)
    assert torch.allclose(gc, torch.tensor([-0.125, -0.3375])) and torch.allclose(gr, torch.tensor([0.25, 0.27]))
    assert metrics["rewards/chosen"] == pytest.approx(-0.125)  # rewards stay beta * the summed log-ratios (TRL)
    # at h_avg = 1 / (2 beta) the loss is 0 and the gradient vanishes: IPO regresses to a target, never past it
    c = torch.tensor([-1.0], requires_grad=True)
    loss, _ = dpo_loss(c, torch.tensor([-2.0]), torch.tensor([-1.0]), torch.tensor([-1.0]), beta=0.5,
                       loss_type="ipo", chosen_lengths_P=torch.tensor([1.0]), rejected_lengths_P=torch.tensor([1.0]))
    loss.backward()
    assert loss.item() == 0.0 and c.grad.item() == 0.0


def test_reference_gets_no_gradient() -> None:
    ref_c = torch.tensor(REF_CHOSEN, requires_grad=True)
    c, r = _policy()
    dpo_loss(c, r, ref_c, torch.tensor(REF_REJECTED), beta=0.5)[0].backward()
    assert ref_c.grad is None


def test_simpo_by_hand() -> None:
    # beta 2, gamma 1: z = beta (a_c - a_r) - gamma = (2 * 2.5 - 1, 2 * -0.45 - 1) = (4, -1.9)
    # loss = mean(softplus(-4), softplus(1.9)) = mean(0.018150, 2.039387) = 1.028768
    c, r = _policy()
    loss, metrics = simpo_loss(c, r, LEN_CHOSEN, LEN_REJECTED, beta=2.0, gamma=1.0)
    assert loss.item() == pytest.approx(1.028768, abs=1e-6)
    # rewards beta a: chosen (-3, -2.5), rejected (-8, -1.6); margins mean(5, -0.9) = 2.05
    assert metrics == pytest.approx({"rewards/chosen": -2.75, "rewards/rejected": -4.8, "rewards/margins": 2.05,
                                     "rewards/accuracies": 0.5, "logps/chosen": -1.375, "logps/rejected": -2.4})
    loss.backward()
    # d/dlogp_c = -(1 / P) sigmoid(-z) beta / n_c; d/dlogp_r = +(1 / P) sigmoid(-z) beta / n_r
    s = torch.sigmoid(-torch.tensor([4.0, -1.9]))
    assert torch.allclose(c.grad, -0.5 * s * 2.0 / LEN_CHOSEN) and torch.allclose(r.grad, 0.5 * s * 2.0 / LEN_REJECTED)
    # gamma shifts the target: gamma 0 on the same pairs is softplus(-5), softplus(0.9)
    loss0, _ = simpo_loss(*_policy(), LEN_CHOSEN, LEN_REJECTED, beta=2.0, gamma=0.0)
    assert loss0.item() == pytest.approx((math.log1p(math.exp(-5.0)) + math.log1p(math.exp(0.9))) / 2, abs=1e-6)


# KTO: four rows, desirable (T, T, F, F): policy (-3, -5, -4, -2), reference (-3.5, -4, -3.5, -2.5), so
# h = (0.5, -1, -0.5, 0.5); two KL rows with policy (-6, -7) and reference (-6.5, -7.1): z0 = mean(0.5, 0.1) = 0.3.
KTO_LOGPS, KTO_REF = [-3.0, -5.0, -4.0, -2.0], torch.tensor([-3.5, -4.0, -3.5, -2.5])
KTO_DESIRABLE = torch.tensor([True, True, False, False])


def test_kto_by_hand() -> None:
    logps = torch.tensor(KTO_LOGPS, requires_grad=True)
    kl_logps = torch.tensor([-6.0, -7.0], requires_grad=True)
    loss, metrics = kto_loss(logps, KTO_REF, KTO_DESIRABLE, kl_logps, torch.tensor([-6.5, -7.1]), beta=0.5,
                             desirable_weight=1.0, undesirable_weight=2.0)
    # desirable 1 - s(beta (h - z0)):  1 - s(0.1) = 0.475021, 1 - s(-0.65) = 0.657010
    # undesirable 2 (1 - s(beta (z0 - h))): 2 (1 - s(0.4)) = 0.802625, 2 (1 - s(-0.1)) = 1.049958
    assert loss.item() == pytest.approx((0.475021 + 0.657010 + 0.802625 + 1.049958) / 4, abs=1e-6)
    # rewards beta h: chosen mean(0.25, -0.5) = -0.125, rejected mean(-0.25, 0.25) = 0
    assert metrics == pytest.approx({"kl": 0.3, "rewards/chosen": -0.125, "rewards/rejected": 0.0,
                                     "rewards/margins": -0.125, "logps/chosen": -4.0, "logps/rejected": -3.0})
    loss.backward()
    # d/dh: desirable -w beta s (1 - s) at x = beta (h - z0); undesirable +w beta s (1 - s) at beta (z0 - h); / N = 4
    x = torch.tensor([0.1, -0.65, 0.4, -0.1])
    w = torch.tensor([-1.0, -1.0, 2.0, 2.0])
    assert torch.allclose(logps.grad, w * 0.5 * torch.sigmoid(x) * (1 - torch.sigmoid(x)) / 4)
    assert kl_logps.grad is None  # z0 is detached: the KL rows only set the reference point


def test_kto_reference_point_is_clamped_at_zero() -> None:
    # KL estimate mean(-0.5, -0.1) = -0.3 < 0: z0 = 0, desirable row 0 is 1 - s(0.25)
    loss, metrics = kto_loss(torch.tensor([-3.0]), torch.tensor([-3.5]), torch.tensor([True]),
                             torch.tensor([-7.0, -7.1]), torch.tensor([-6.5, -7.0]), beta=0.5)
    assert metrics["kl"] == 0.0 and loss.item() == pytest.approx(1 - 1 / (1 + math.exp(-0.25)))
    # one side only: its metrics are the side's, the other's (and the margin) 0
    assert metrics["rewards/chosen"] == pytest.approx(0.25) and metrics["rewards/rejected"] == 0.0
    assert metrics["rewards/margins"] == 0.0


def test_orpo_by_hand() -> None:
    # log odds(a) = a - log(1 - e^a): chosen (-1.247518, -0.912420), rejected (-3.981515, -0.203382)
    # differences (2.733997, -0.709038); log sigmoid of them (-0.062936, -1.109234)
    # NLL pooled over the chosen tokens: -(-3 - 5) / (2 + 4) = 4 / 3; beta 0.1
    c, r = _policy()
    loss, metrics = orpo_loss(c, r, LEN_CHOSEN, LEN_REJECTED, beta=0.1)
    assert loss.item() == pytest.approx(4 / 3 - 0.1 * (-0.062936 - 1.109234) / 2, abs=1e-6)
    assert metrics["nll_loss"] == pytest.approx(4 / 3)
    assert metrics["log_odds_ratio"] == pytest.approx((-0.062936 - 1.109234) / 2, abs=1e-6)
    assert metrics["log_odds_chosen"] == pytest.approx((2.733997 - 0.709038) / 2, abs=1e-6)
    assert metrics["rewards/margins"] == pytest.approx(0.1 * ((-1.5 + 4) + (-1.25 + 0.8)) / 2)
    loss.backward()
    # d log odds / da = 1 / (1 - e^a); d/dlogp_c = -1 / 6 - beta / P * s(-lo) / (1 - e^a_c) / n_c
    lo = torch.tensor([2.733997, -0.709038])
    a_c, a_r = torch.tensor([-1.5, -1.25]), torch.tensor([-4.0, -0.8])
    expected_c = -1 / 6 - 0.05 * torch.sigmoid(-lo) / (1 - torch.exp(a_c)) / LEN_CHOSEN
    expected_r = 0.05 * torch.sigmoid(-lo) / (1 - torch.exp(a_r)) / LEN_REJECTED
    assert torch.allclose(c.grad, expected_c, atol=1e-6) and torch.allclose(r.grad, expected_r, atol=1e-6)


def test_log1mexp_is_stable_at_both_ends() -> None:
    x = torch.tensor([-1e-7, -0.5, -0.7, -30.0], dtype=torch.float64)
    assert torch.allclose(log1mexp(x), torch.log(1 - torch.exp(x)), rtol=1e-6)
    assert math.isfinite(log1mexp(torch.tensor([-1e-7])).item())  # float32: log1p(-exp(x)) would give -inf
    assert log1mexp(torch.tensor([-50.0])).item() == pytest.approx(-math.exp(-50.0), rel=1e-6)


# ----- validation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, -0.1, math.nan, math.inf])
def test_every_loss_refuses_a_bad_beta(beta: float) -> None:
    for params, name in ((DPOParams, "dpo"), (SimPOParams, "simpo"), (KTOParams, "kto"), (ORPOParams, "orpo")):
        with pytest.raises(UserError, match=f"{name} beta must be > 0"):
            params(beta=beta)
    c, r = torch.tensor(CHOSEN), torch.tensor(REJECTED)
    with pytest.raises(UserError, match="dpo beta must be > 0"):
        dpo_loss(c, r, c, r, beta=beta)
    with pytest.raises(UserError, match="simpo beta must be > 0"):
        simpo_loss(c, r, LEN_CHOSEN, LEN_REJECTED, beta=beta, gamma=0.5)
    with pytest.raises(UserError, match="kto beta must be > 0"):
        kto_loss(c, r, torch.tensor([True, False]), c, r, beta=beta)
    with pytest.raises(UserError, match="orpo beta must be > 0"):
        orpo_loss(c, r, LEN_CHOSEN, LEN_REJECTED, beta=beta)


@pytest.mark.parametrize("eps", [-0.1, 0.5, 0.7, math.nan])
def test_label_smoothing_must_lie_in_zero_to_one_half(eps: float) -> None:
    with pytest.raises(UserError, match=r"dpo label_smoothing must be in \[0, 0.5\)"):
        DPOParams(label_smoothing=eps)
    with pytest.raises(UserError, match=r"simpo label_smoothing must be in \[0, 0.5\)"):
        SimPOParams(label_smoothing=eps)
    c, r = torch.tensor(CHOSEN), torch.tensor(REJECTED)
    with pytest.raises(UserError, match=r"dpo label_smoothing must be in \[0, 0.5\)"):
        dpo_loss(c, r, c, r, beta=0.1, label_smoothing=eps)


def test_knob_refusals() -> None:
    with pytest.raises(UserError, match="dpo loss_type must be one of sigmoid, hinge, ipo, got 'robust'"):
        DPOParams(loss_type="robust")
    with pytest.raises(UserError, match="label_smoothing \\(cDPO\\) applies to loss_type 'sigmoid' only"):
        DPOParams(loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(UserError, match="simpo gamma must be >= 0"):
        SimPOParams(gamma=-0.5)
    for name in ("desirable_weight", "undesirable_weight"):
        with pytest.raises(UserError, match=f"kto {name} must be > 0"):
            KTOParams(**{name: 0.0})
    assert (DPOParams(), SimPOParams(), KTOParams(), ORPOParams()) == (
        DPOParams(beta=0.1, loss_type="sigmoid", label_smoothing=0.0), SimPOParams(beta=2.0, gamma=1.0),
        KTOParams(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0), ORPOParams(beta=0.1))


def test_data_refusals() -> None:
    empty = torch.zeros(0)
    with pytest.raises(ExperimentError, match=r"dpo: per-sequence inputs must share one shape \[P >= 1\]"):
        dpo_loss(empty, empty, empty, empty, beta=0.1)
    with pytest.raises(ExperimentError, match="simpo: per-sequence inputs must share one shape"):
        simpo_loss(torch.tensor(CHOSEN), torch.tensor([-1.0]), LEN_CHOSEN, LEN_REJECTED, beta=2.0, gamma=1.0)
    c, r = torch.tensor(CHOSEN), torch.tensor(REJECTED)
    with pytest.raises(ExperimentError, match="dpo: loss_type 'ipo' averages over answer lengths, and none"):
        dpo_loss(c, r, c, r, beta=0.1, loss_type="ipo")
    with pytest.raises(ExperimentError, match="orpo: an answer has no loss token"):
        orpo_loss(c, r, torch.tensor([2.0, 0.0]), LEN_REJECTED, beta=0.1)
    with pytest.raises(ExperimentError, match="orpo: an answer has average logprob >= 0"):
        orpo_loss(torch.tensor([0.0, -1.0]), r, LEN_CHOSEN, LEN_REJECTED, beta=0.1)
    with pytest.raises(ExperimentError, match="kto: per-sequence inputs must share one shape"):
        kto_loss(c, r, torch.tensor([True, False]), empty, empty, beta=0.1)


# ----- registered forms: per-token logprobs and batch inputs -------------------------------------------------

# Four rows, three columns; the last column is off the mask and holds junk that must not count. Row sums over the
# mask: policy (-3, -5, -4, -4), reference (-3.5, -4, -3.5, -4.5), so pairs (0, 2) and (1, 3) are the pairs above.
LOGP_NT = torch.tensor([[-1.0, -2.0, -9.0], [-2.5, -2.5, -9.0], [-1.5, -2.5, -9.0], [-3.0, -1.0, -9.0]])
REF_NT = torch.tensor([[-1.5, -2.0, 5.0], [-2.0, -2.0, 5.0], [-1.0, -2.5, 5.0], [-2.0, -2.5, 5.0]])
MASK_NT = torch.tensor([[1.0, 1.0, 0.0]] * 4)
PAIRS_P2 = torch.tensor([[0, 2], [1, 3]])


def _registered(name: str, params, **inputs: torch.Tensor):
    logp_NT = LOGP_NT.clone().requires_grad_()
    loss, metrics = get_loss_def(name).fn(logp_NT, {"loss_mask_NT": MASK_NT, **inputs}, params)
    loss.backward()
    return loss, metrics, logp_NT.grad


def test_registered_dpo_sums_the_masked_tokens_and_keeps_its_legacy_metrics() -> None:
    loss, metrics, grad = _registered("dpo", DPOParams(beta=0.5), ref_logprobs_NT=REF_NT, pairs_P2=PAIRS_P2)
    assert loss.item() == pytest.approx(0.805474, abs=1e-6)  # the sigmoid case above
    assert metrics["reward_margin"] == metrics["rewards/margins"] == pytest.approx(-0.125)
    assert metrics["pair_accuracy"] == metrics["rewards/accuracies"] == 0.5
    g = -0.25 * torch.sigmoid(-torch.tensor([0.5, -0.75]))  # per token of the row, none off the mask
    assert torch.allclose(grad, torch.stack([g[0], g[1], -g[0], -g[1]])[:, None] * MASK_NT)


def test_registered_losses_refuse_empty_pairs() -> None:
    for name, params in (("dpo", DPOParams()), ("simpo", SimPOParams()), ("orpo", ORPOParams())):
        with pytest.raises(ExperimentError, match=rf"{name}: pairs_P2 must be \[P >= 1, 2\], got \(0, 2\)"):
            _registered(name, params, ref_logprobs_NT=REF_NT, pairs_P2=torch.zeros((0, 2), dtype=torch.long))


def test_registered_kto_reads_its_labels_and_kl_rows() -> None:
    # rows 0, 1 desirable and undesirable; rows 2, 3 KL rows: z0 = max(0, mean(-0.5, 0.5)) = 0
    labels = torch.tensor([1, 0, -1, -1])
    loss, metrics, grad = _registered("kto", KTOParams(beta=0.5), ref_logprobs_NT=REF_NT, kto_labels_N=labels)
    # h = (0.5, -1): desirable 1 - s(0.25), undesirable 1 - s(0.5)
    assert loss.item() == pytest.approx((1 - 1 / (1 + math.exp(-0.25)) + 1 - 1 / (1 + math.exp(-0.5))) / 2)
    assert metrics["kl"] == 0.0
    assert bool((grad[0, :2] < 0).all() and (grad[1, :2] > 0).all()) and bool((grad[2:] == 0).all())
    for bad in (torch.tensor([1, 0, 1, 0]), torch.tensor([-1, -1, -1, -1])):
        with pytest.raises(ExperimentError, match="kto: the batch needs rows labelled 1 or 0 and KL rows"):
            _registered("kto", KTOParams(), ref_logprobs_NT=REF_NT, kto_labels_N=bad)


def test_registered_simpo_and_orpo_average_over_the_loss_tokens() -> None:
    lengths = MASK_NT.sum(-1)
    sums = (LOGP_NT * MASK_NT).sum(-1)
    loss, _, _ = _registered("simpo", SimPOParams(beta=2.0, gamma=1.0), pairs_P2=PAIRS_P2)
    expected, _ = simpo_loss(sums[[0, 1]], sums[[2, 3]], lengths[[0, 1]], lengths[[2, 3]], beta=2.0, gamma=1.0)
    assert loss.item() == pytest.approx(expected.item())
    loss, metrics, grad = _registered("orpo", ORPOParams(beta=0.1), pairs_P2=PAIRS_P2)
    expected, _ = orpo_loss(sums[[0, 1]], sums[[2, 3]], lengths[[0, 1]], lengths[[2, 3]], beta=0.1)
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["nll_loss"] == pytest.approx(8 / 4)  # -(-3 - 5) over the chosen rows' 4 tokens
    assert bool((grad[:2, :2] < 0).all() and (grad[2:, :2] > 0).all()) and bool((grad[:, 2] == 0).all())


def test_train_batch_checks_kto_labels_and_refuses_to_split_them() -> None:
    ids, mask = torch.ones(4, 3, dtype=torch.long), MASK_NT
    batch = TrainBatch(ids, ids, mask, kto_labels_N=torch.tensor([1, 0, -1, -1]))
    assert set(batch.inputs()) == {"loss_mask_NT", "kto_labels_N"}
    with pytest.raises(ValueError, match=r"TrainBatch.kto_labels_N has shape \(3,\), expected \(4,\)"):
        TrainBatch(ids, ids, mask, kto_labels_N=torch.tensor([1, 0, -1]))
    with pytest.raises(ValueError, match="must hold 1 \\(desirable\\), 0 \\(undesirable\\) or -1 \\(KL row\\)"):
        TrainBatch(ids, ids, mask, kto_labels_N=torch.tensor([1, 0, 2, -1]))
    with pytest.raises(ExperimentError, match="cannot be split into rows"):
        batch.select(torch.tensor([0, 1]))


# ----- TRL's implementations on the same tensors ------------------------------------------------------------
# TRL >= 1.0 (the `bench` extra). Its trainers are built with object.__new__ and the attributes the loss reads;
# the model is a stand-in returning the per-token logprobs (DPO, KTO) or logits (CPO, ORPO) of the test.


def _trl():
    trl = pytest.importorskip("trl", minversion="1.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental warns on import
        from trl.experimental.cpo import CPOTrainer
        from trl.experimental.orpo import ORPOTrainer
    return trl, CPOTrainer, ORPOTrainer


class _Model:
    """A stand-in for TRL's model call: `outputs(input_ids)` -> the namespace the trainer reads."""

    training = True

    def __init__(self, outputs):
        self.outputs = outputs

    def __call__(self, *args, **kwargs):
        return self.outputs(kwargs.get("input_ids", args[0] if args else None))


def _trainer(cls, model, **attrs):
    trainer = object.__new__(cls)
    identity = lambda t: t  # noqa: E731 (one process: gathering is the identity)
    trainer.__dict__.update(accelerator=SimpleNamespace(device=torch.device("cpu"), gather=identity,
                                                        gather_for_metrics=identity),
                            model=model, aux_loss_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
                            _total_train_tokens=0, _tp_size=1, **attrs)
    return trainer


def _fused(per_token_lp):
    """What TRL's fused LM head returns: per-token logprobs of the labels (0 where ignored) and side outputs."""
    zeros = torch.zeros_like(per_token_lp.detach())
    return SimpleNamespace(log_probs=per_token_lp, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


def _random_rows(n: int, t: int, seed: int):
    """Per-token logprobs [n, t - 1] of targets 1..t-1 (0 off the completion), the completion mask [n, t] (prompt
    of 1-2 tokens, completions of different lengths, right padding) and reference logprobs of the same shape."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(n, t)
    for i in range(n):
        start, end = 1 + i % 2, t - (i % 3)
        mask[i, start:end] = 1.0
    lp = -torch.rand(n, t - 1, generator=gen, dtype=torch.float64) * 3 * mask[:, 1:]
    ref = -torch.rand(n, t - 1, generator=gen, dtype=torch.float64) * 3 * mask[:, 1:]
    return lp, mask, ref


def _close(ours: float, theirs: float) -> float:
    assert ours == pytest.approx(theirs, abs=1e-6)
    return abs(ours - theirs)


TRL_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
               "logps/rejected")


@pytest.mark.parametrize(("loss_type", "sft_weight"), [("sigmoid", 0.0), ("hinge", 0.0), ("ipo", 0.0),
                                                       ("sigmoid", 0.7)])
def test_dpo_matches_trl(loss_type: str, sft_weight: float) -> None:
    trl, _, _ = _trl()
    p, t, beta = 3, 7, 0.3
    base, mask, ref = _random_rows(2 * p, t, seed=1)
    base.requires_grad_(True)
    # RPO in TRL: the loss types [form, "sft"] weighted [1, alpha]
    types, weights = ([loss_type, "sft"], [1.0, sft_weight]) if sft_weight else ([loss_type], [1.0])
    trainer = _trainer(trl.DPOTrainer, _Model(lambda _ids: _fused(base)), ld_alpha=None, precompute_ref_logps=True,
                       f_divergence_type="reverse_kl", loss_types=types, loss_weights=weights, beta=beta,
                       label_smoothing=0.0, use_weighting=False)
    ids = torch.ones(2 * p, t, dtype=torch.long)
    ref_sums = ref.sum(-1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": mask.long(),
              "ref_chosen_logps": ref_sums[:p], "ref_rejected_logps": ref_sums[p:]}
    theirs = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    (their_grad,) = torch.autograd.grad(theirs, base)

    pairs = torch.stack([torch.arange(p), torch.arange(p) + p], dim=1)
    ours, metrics = get_loss_def("dpo").fn(F.pad(base, (1, 0)), {"loss_mask_NT": mask.double(), "pairs_P2": pairs,
                                                                 "ref_logprobs_NT": F.pad(ref, (1, 0))},
                                           DPOParams(beta=beta, loss_type=loss_type, sft_weight=sft_weight))
    (our_grad,) = torch.autograd.grad(ours, base)
    _close(ours.item(), theirs.item())
    # TRL sums every position (its model returns 0 off the labels, with no gradient there): compare on the mask
    assert torch.allclose(our_grad, their_grad * mask[:, 1:], atol=1e-6)
    for key in TRL_METRICS:
        _close(metrics[key], trainer._metrics["train"][key][-1])


def test_cdpo_matches_trl_label_smoothed_sigmoid() -> None:
    # TRL >= 1.0's DPOTrainer uses label_smoothing only in its 'robust' and 'exo_pair' losses; the cDPO form lives
    # in CPOTrainer.cpo_loss (loss_type 'sigmoid'), whose logits are chosen minus rejected of what it is given:
    # given the log-ratios, it is DPO's sigmoid loss with label smoothing.
    _, cpo_trainer, _ = _trl()
    gen = torch.Generator().manual_seed(2)
    c, r, ref_c, ref_r = (-torch.rand(5, generator=gen, dtype=torch.float64) * 20 for _ in range(4))
    trainer = _trainer(cpo_trainer, None, alpha=0.0, loss_type="sigmoid", beta=0.2, label_smoothing=0.15)
    losses, _, _ = trainer.cpo_loss(c - ref_c, r - ref_r)
    ours, _ = dpo_loss(c, r, ref_c, ref_r, beta=0.2, label_smoothing=0.15)
    _close(ours.item(), losses.mean().item())


def _logit_rows(p: int, t: int, v: int, seed: int):
    """Chosen then rejected rows: logits [2p, t, v] (with gradient), ids, TRL's labels (-100 on the 1-token prompt
    and the padding) and attention mask."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2 * p, t, v, generator=gen, dtype=torch.float64).requires_grad_(True)
    ids = torch.randint(0, v, (2 * p, t), generator=gen)
    attn = torch.ones(2 * p, t, dtype=torch.long)
    for i in range(2 * p):
        attn[i, t - (i % 3):] = 0
    labels = ids.masked_fill(attn == 0, -100)
    labels[:, 0] = -100
    return logits, ids, labels, attn


def _our_rows(logits: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor):
    """Our per-token logprobs [2p, t] (target-aligned, 0 at position 0) and loss mask from the same logits."""
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    mask = F.pad((labels[:, 1:] != -100).double(), (1, 0))
    return F.pad(lp, (1, 0)) * mask, mask


def _pair_batch(ids, labels, attn, p: int) -> dict[str, torch.Tensor]:
    return {"chosen_input_ids": ids[:p], "chosen_attention_mask": attn[:p], "chosen_labels": labels[:p],
            "rejected_input_ids": ids[p:], "rejected_attention_mask": attn[p:], "rejected_labels": labels[p:]}


def test_simpo_matches_trl_cpo_trainer() -> None:
    _, cpo_trainer, _ = _trl()
    p, beta, gamma, eps = 3, 2.0, 1.2, 0.1
    logits, ids, labels, attn = _logit_rows(p, 6, 11, seed=3)
    trainer = _trainer(cpo_trainer, None, is_encoder_decoder=False, pad_token_id=0, cpo_alpha=0.0, alpha=0.0,
                       loss_type="simpo", beta=beta, simpo_gamma=gamma, label_smoothing=eps)
    theirs, their_metrics = trainer.get_batch_loss_metrics(_Model(lambda _ids: SimpleNamespace(logits=logits)),
                                                           _pair_batch(ids, labels, attn, p))
    (their_grad,) = torch.autograd.grad(theirs, logits)

    lp, mask = _our_rows(logits, ids, labels)
    pairs = torch.stack([torch.arange(p), torch.arange(p) + p], dim=1)
    ours, metrics = get_loss_def("simpo").fn(lp, {"loss_mask_NT": mask, "pairs_P2": pairs},
                                             SimPOParams(beta=beta, gamma=gamma, label_smoothing=eps))
    (our_grad,) = torch.autograd.grad(ours, logits)
    _close(ours.item(), theirs.item())
    assert torch.allclose(our_grad, their_grad, atol=1e-6)
    for key in TRL_METRICS:
        _close(metrics[key], their_metrics[key])


def test_orpo_matches_trl() -> None:
    # the 1-token prompt is never a target, so TRL's NLL (over prompt and answer) counts the same tokens as ours
    _, _, orpo_trainer = _trl()
    p, beta = 3, 0.25
    logits, ids, labels, attn = _logit_rows(p, 6, 11, seed=4)
    trainer = _trainer(orpo_trainer, None, is_encoder_decoder=False, padding_value=0, beta=beta)
    theirs, their_metrics = trainer.get_batch_loss_metrics(_Model(lambda _ids: SimpleNamespace(logits=logits)),
                                                           _pair_batch(ids, labels, attn, p))
    (their_grad,) = torch.autograd.grad(theirs, logits)

    lp, mask = _our_rows(logits, ids, labels)
    pairs = torch.stack([torch.arange(p), torch.arange(p) + p], dim=1)
    ours, metrics = get_loss_def("orpo").fn(lp, {"loss_mask_NT": mask, "pairs_P2": pairs}, ORPOParams(beta=beta))
    (our_grad,) = torch.autograd.grad(ours, logits)
    _close(ours.item(), theirs.item())
    assert torch.allclose(our_grad, their_grad, atol=1e-6)
    for key in (*TRL_METRICS, "nll_loss", "log_odds_ratio", "log_odds_chosen"):
        _close(metrics[key], their_metrics[key])


def test_kto_matches_trl() -> None:
    trl, _, _ = _trl()
    b, t, beta = 5, 6, 0.4
    base, mask, ref = _random_rows(b, t, seed=5)
    kl_lp, kl_mask, kl_ref = _random_rows(b, t + 1, seed=6)  # one column wider: the stand-in tells them apart
    kl_lp = kl_lp + 0.8 * kl_mask[:, 1:]  # a positive KL estimate, so z0 is not clamped to 0
    base.requires_grad_(True)
    labels = torch.tensor([True, False, True, True, False])
    trainer = _trainer(trl.KTOTrainer, _Model(lambda ids: _fused(kl_lp if ids.shape[1] == t + 1 else base)),
                       calculate_KL=True, precompute_ref_logps=True, loss_type="kto", beta=beta,
                       desirable_weight=1.3, undesirable_weight=0.7)
    ids, kl_ids = torch.ones(b, t, dtype=torch.long), torch.ones(b, t + 1, dtype=torch.long)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": mask.long(),
              "label": labels, "ref_logps": ref.sum(-1), "ref_KL_logps": kl_ref.sum(-1), "KL_input_ids": kl_ids,
              "KL_attention_mask": torch.ones_like(kl_ids), "KL_completion_mask": kl_mask.long()}
    theirs = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    (their_grad,) = torch.autograd.grad(theirs, base)

    # our batch: the b rows, then the b KL rows (labelled -1), right-padded to t + 1 columns
    lp_NT = torch.cat([F.pad(base, (1, 1)), F.pad(kl_lp, (1, 0))])
    ref_NT = torch.cat([F.pad(ref, (1, 1)), F.pad(kl_ref, (1, 0))])
    mask_NT = torch.cat([F.pad(mask, (0, 1)), kl_mask]).double()
    kto_labels = torch.cat([labels.long(), torch.full((b,), -1)])
    ours, metrics = get_loss_def("kto").fn(lp_NT, {"loss_mask_NT": mask_NT, "ref_logprobs_NT": ref_NT,
                                                   "kto_labels_N": kto_labels},
                                           KTOParams(beta=beta, desirable_weight=1.3, undesirable_weight=0.7))
    (our_grad,) = torch.autograd.grad(ours, base)
    _close(ours.item(), theirs.item())
    assert torch.allclose(our_grad, their_grad * mask[:, 1:], atol=1e-6)
    assert metrics["kl"] > 0
    for key in ("kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        _close(metrics[key], trainer._metrics["train"][key][-1])
