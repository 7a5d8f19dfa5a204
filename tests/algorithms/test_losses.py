import math

import pytest
import torch

from purplerl.algorithms.critic import ValueLossParams
from purplerl.algorithms.losses import aggregate_token_mean, importance_sampling_loss, kl_penalty_loss, ppo_clip_loss
from purplerl.algorithms.pairwise import BradleyTerryParams, DPOParams, KTOParams, ORPOParams, SimPOParams
from purplerl.algorithms.process_reward import StepBCEParams
from purplerl.algorithms.registry import (
    LOSS_REGISTRY,
    CrossEntropyParams,
    Loss,
    PolicyGradientParams,
    TokenNoiserParams,
    get_loss_def,
)
from purplerl.errors import ExperimentError, UserError

# the pure policy-gradient surrogates, (logp, sampling logp, advantages, mask, clip_low, clip_high) -> loss
SURROGATES = {"importance_sampling": importance_sampling_loss, "ppo_clip": ppo_clip_loss}


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
    # token means only (the engine sums them over micro-batches by token share; it counts the tokens itself)
    assert set(metrics) == {"ratio_mean", "approx_kl_sampling"}


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
    for fn in SURROGATES.values():
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


def test_registry_declares_what_each_loss_consumes_and_reads() -> None:
    declared = {name: (d.consumes, d.inputs, d.params) for name, d in LOSS_REGISTRY.items()}
    pg_inputs = ("sampling_logprobs_NT", "advantages_NT")
    assert declared == {
        "importance_sampling": ("logprobs", pg_inputs, PolicyGradientParams),
        "ppo_clip": ("logprobs", pg_inputs, PolicyGradientParams),
        "cross_entropy": ("logprobs", (), CrossEntropyParams),
        "token_noiser": ("logits", (), TokenNoiserParams),
        "dpo": ("sequences", ("ref_logprobs_NT", "pairs_P2"), DPOParams),
        "simpo": ("sequences", ("pairs_P2",), SimPOParams),
        "kto": ("sequences", ("ref_logprobs_NT", "kto_labels_N"), KTOParams),
        "orpo": ("sequences", ("pairs_P2",), ORPOParams),
        "bradley_terry": ("values", ("pairs_P2",), BradleyTerryParams),
        "step_bce": ("values", ("step_labels_NT",), StepBCEParams),
        "ppo_value": ("values", ("old_values_NT", "returns_NT"), ValueLossParams),
    }
    assert get_loss_def("ppo_clip") is LOSS_REGISTRY["ppo_clip"]
    with pytest.raises(UserError, match="unknown loss 'reinforce_pp'"):
        get_loss_def("reinforce_pp")
    # an in-loss KL term makes a policy-gradient loss read the reference logprobs too
    ppo = get_loss_def("ppo_clip")
    assert ppo.required_inputs(PolicyGradientParams()) == pg_inputs
    assert ppo.required_inputs(PolicyGradientParams(kl_beta=0.1)) == (*pg_inputs, "ref_logprobs_NT")


def test_loss_fills_default_params_and_refuses_foreign_ones() -> None:
    assert Loss("dpo").params == DPOParams(beta=0.1)
    assert Loss("ppo_clip").params == PolicyGradientParams(clip_low=0.2, clip_high=0.2, kl_beta=0.0,
                                                           kl_estimator="k3", old_logprobs="sampler")
    with pytest.raises(UserError, match="loss 'ppo_clip' takes PolicyGradientParams, got DPOParams"):
        Loss("ppo_clip", DPOParams())
    with pytest.raises(UserError, match="unknown loss aggregation 'mean'"):
        Loss("cross_entropy", aggregation="mean")
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(UserError, match="loss temperature must be > 0"):
            Loss("cross_entropy", temperature=bad)
    with pytest.raises(UserError, match="unknown KL estimator 'k4'"):
        PolicyGradientParams(kl_estimator="k4")
    with pytest.raises(UserError, match="old_logprobs must be 'sampler' or 'current'"):
        PolicyGradientParams(old_logprobs="auto")
    for bad_beta in (0.0, -0.1, math.nan):
        with pytest.raises(UserError, match="dpo beta must be > 0"):
            DPOParams(beta=bad_beta)
    for bad_epsilon in (-0.1, 1.5, math.nan):
        with pytest.raises(UserError, match="token_noiser epsilon must be in"):
            TokenNoiserParams(epsilon=bad_epsilon)


def _registered(name: str, logp_NT: torch.Tensor, params, **inputs: torch.Tensor):
    """Call a registered per-token loss the way the engine does: (logprobs, inputs by name, params)."""
    return get_loss_def(name).fn(logp_NT, inputs, params)


def test_registered_policy_gradient_adds_the_kl_term_by_hand() -> None:
    # on-policy (ratio 1), A = 2: IS loss -2; k1 = logp - ref = -1 - (-2) = +1; loss = -2 + 0.5 * 1 = -1.5.
    # Gradient: -r A + beta * dk1/dlogp = -2 + 0.5 = -1.5. Swapping the KL's arguments or its sign gives -2.5.
    logp_NT = torch.tensor([[-1.0, -3.0]], requires_grad=True)
    inputs = {"loss_mask_NT": torch.tensor([[1.0, 0.0]]), "sampling_logprobs_NT": torch.tensor([[-1.0, -3.0]]),
              "advantages_NT": torch.tensor([[2.0, 0.0]]), "ref_logprobs_NT": torch.tensor([[-2.0, -1.0]])}
    loss_NT, metrics = _registered("importance_sampling", logp_NT,
                                   PolicyGradientParams(kl_beta=0.5, kl_estimator="k1"), **inputs)
    assert loss_NT[0, 0].item() == pytest.approx(-1.5)
    loss_NT[:, :1].sum().backward()
    assert logp_NT.grad[0, 0].item() == pytest.approx(-1.5)
    assert metrics["kl_loss"] == pytest.approx(1.0)  # the masked mean: the off-mask k1 of -2 does not count
    # without kl_beta the surrogate alone, and no kl metric
    plain_NT, plain_metrics = _registered("importance_sampling", logp_NT, PolicyGradientParams(), **inputs)
    assert plain_NT[0, 0].item() == pytest.approx(-2.0) and "kl_loss" not in plain_metrics


def test_registered_ppo_clip_passes_its_own_clip_bounds() -> None:
    sampling_NT = torch.full((1, 6), -1.0)
    logp_NT = sampling_NT + torch.log(torch.tensor([RATIOS]))
    inputs = {"loss_mask_NT": MASK_NT, "sampling_logprobs_NT": sampling_NT, "advantages_NT": ADV_NT}
    loss_NT, metrics = _registered("ppo_clip", logp_NT, PolicyGradientParams(clip_low=0.2, clip_high=0.28), **inputs)
    assert torch.allclose(loss_NT, torch.tensor([[-1.28, 1.5, -0.5, 0.8, -2.2, 0.0]]), atol=1e-6)
    assert metrics["clip_frac_high"] == pytest.approx(0.2) and metrics["clip_frac_low"] == pytest.approx(0.2)


def test_current_old_logprobs_ignore_the_sampler_by_hand() -> None:
    # policy p = 0.5, sampler p = 0.25, A = 0.5: against the sampler the ratio is 2 (loss -1, gradient -1);
    # against the policy's own detached logprobs it is 1 (loss -0.5, gradient -r A = -0.5)
    inputs = {"loss_mask_NT": torch.ones(1, 1), "sampling_logprobs_NT": torch.tensor([[math.log(0.25)]]),
              "advantages_NT": torch.tensor([[0.5]])}
    for mode, expected in (("sampler", -1.0), ("current", -0.5)):
        logp_NT = torch.tensor([[math.log(0.5)]], requires_grad=True)
        loss_NT, metrics = _registered("importance_sampling", logp_NT, PolicyGradientParams(old_logprobs=mode),
                                       **inputs)
        loss_NT.sum().backward()
        assert loss_NT.item() == pytest.approx(expected)
        assert logp_NT.grad.item() == pytest.approx(expected)
        assert metrics["ratio_mean"] == pytest.approx(-2 * expected)


def test_cross_entropy_is_the_weighted_nll_by_hand() -> None:
    # weights 0 (the prompt token), 1 and 2: loss per token -logp * w = [0, 2, 1]; gradient -w
    logp_NT = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask_NT = torch.tensor([[0.0, 1.0, 2.0]])
    loss_NT, metrics = _registered("cross_entropy", logp_NT, CrossEntropyParams(), loss_mask_NT=mask_NT)
    assert loss_NT.tolist() == [[0.0, 2.0, 1.0]]
    loss_NT.sum().backward()
    assert logp_NT.grad.tolist() == [[0.0, -1.0, -2.0]]
    assert metrics["nll"] == pytest.approx((2.0 * 1 + 0.5 * 2) / 3)  # the weighted mean of -logp
    # -inf off the mask (a padded position's junk) cannot leak into the loss
    junk_NT, _ = _registered("cross_entropy", torch.tensor([[-math.inf, -2.0]]), CrossEntropyParams(),
                             loss_mask_NT=torch.tensor([[0.0, 1.0]]))
    assert junk_NT.tolist() == [[0.0, 2.0]]


# Two preference pairs over four rows, two loss tokens each (the last column is off the mask, with junk that
# must not count). Sequence margins (logp - ref summed over the mask): row 0 +1, row 1 -1, row 2 0, row 3 +1.
# Pairs (chosen, rejected) = (0, 1) and (2, 3); with beta 0.5 their logits are 0.5 * (1 - (-1)) = 1 and
# 0.5 * (0 - 1) = -0.5, so the loss is mean(log(1 + e^-1), log(1 + e^0.5)) = mean(0.313262, 0.974077).
DPO_LOGP_NT = torch.tensor([[-1.0, -1.0, -9.0], [-2.0, -1.0, -9.0], [-1.0, -1.0, -9.0], [-0.5, -0.5, -9.0]])
DPO_REF_NT = torch.tensor([[-1.5, -1.5, 0.0], [-1.5, -0.5, 0.0], [-0.5, -1.5, 0.0], [-1.0, -1.0, 0.0]])
DPO_MASK_NT = torch.tensor([[1.0, 1.0, 0.0]] * 4)
DPO_PAIRS_P2 = torch.tensor([[0, 1], [2, 3]])


def test_dpo_loss_and_gradient_by_hand() -> None:
    logp_NT = DPO_LOGP_NT.clone().requires_grad_()
    loss, metrics = _registered("dpo", logp_NT, DPOParams(beta=0.5), loss_mask_NT=DPO_MASK_NT,
                                ref_logprobs_NT=DPO_REF_NT, pairs_P2=DPO_PAIRS_P2)
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.5))) / 2, abs=1e-6)
    # the implicit rewards' margin, beta included (TRL's rewards/margins): mean(0.5 * 2, 0.5 * -1) = 0.25
    assert metrics["reward_margin"] == pytest.approx(0.25)
    assert metrics["pair_accuracy"] == pytest.approx(0.5)
    loss.backward()
    # d/dlogit of -log sigmoid(x) is -sigmoid(-x); times 1/2 (mean over pairs) and beta, + for the chosen row
    # and - for the rejected one, on every masked token; nothing off the mask
    g0, g1 = -0.25 * torch.sigmoid(torch.tensor(-1.0)).item(), -0.25 * torch.sigmoid(torch.tensor(0.5)).item()
    expected = torch.tensor([[g0, g0, 0.0], [-g0, -g0, 0.0], [g1, g1, 0.0], [-g1, -g1, 0.0]])
    assert torch.allclose(logp_NT.grad, expected, atol=1e-7)


@pytest.mark.parametrize(("beta", "margin", "accuracy"), [(0.5, 0.25, 0.5), (1.0, 0.5, 0.5), (2.0, 1.0, 0.5)])
def test_dpo_reward_margin_is_beta_times_the_log_ratio_margin(beta: float, margin: float, accuracy: float) -> None:
    # log-ratio margins of the two pairs: (+1) - (-1) = 2 and 0 - (+1) = -1; implicit rewards r = beta * log-ratio
    _, metrics = _registered("dpo", DPO_LOGP_NT, DPOParams(beta=beta), loss_mask_NT=DPO_MASK_NT,
                             ref_logprobs_NT=DPO_REF_NT, pairs_P2=DPO_PAIRS_P2)
    assert metrics["reward_margin"] == pytest.approx(margin)
    assert metrics["pair_accuracy"] == pytest.approx(accuracy)  # the sign of the margin, whatever beta


def test_dpo_refuses_a_batch_without_pairs() -> None:
    with pytest.raises(ExperimentError, match=r"pairs_P2 must be \[P >= 1, 2\], got \(0, 2\)"):
        _registered("dpo", DPO_LOGP_NT, DPOParams(), loss_mask_NT=DPO_MASK_NT, ref_logprobs_NT=DPO_REF_NT,
                    pairs_P2=torch.zeros((0, 2), dtype=torch.long))


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
    fn, total_tokens = SURROGATES[loss_name], float(mask_NT.sum())

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
