"""Direct preference losses over per-sequence quantities: DPO (sigmoid, hinge, IPO; cDPO label smoothing), SimPO,
KTO and ORPO.

Every function takes, per answer, the policy's logprob summed over the answer's loss tokens (`*_logps`, with
gradient), where the loss needs them the frozen reference's (`ref_*`, detached here) and the number of loss tokens
(`*_lengths`), and returns (scalar loss, metrics). Pairs come as aligned [P] tensors (chosen p vs rejected p); KTO's
rows are unpaired. Knobs are arguments; a bad knob raises UserError, bad data ExperimentError.

Metrics follow TRL's names and conventions, so runs compare with TRL's logs: `rewards/chosen` and
`rewards/rejected` are the implicit rewards *with* beta (DPO, KTO: beta * (logp - ref); SimPO, ORPO: beta * the
length-averaged logp), `rewards/margins` the mean of chosen minus rejected reward (beta included),
`rewards/accuracies` the share of pairs whose chosen reward is the larger, `logps/*` the mean policy logps the loss
used (summed; length-averaged for SimPO and ORPO).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from purplerl.errors import ExperimentError, UserError

Metrics = dict[str, float]
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo")


# ----- knob and data checks ---------------------------------------------------------------------------------


def check_positive(who: str, name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{who} {name} must be > 0, got {value}")


def check_beta(who: str, beta: float) -> None:
    check_positive(who, "beta", beta)


def check_simpo_gamma(gamma: float) -> None:
    if not (math.isfinite(gamma) and gamma >= 0):
        raise UserError(f"simpo gamma must be >= 0, got {gamma}")


def check_label_smoothing(who: str, label_smoothing: float) -> None:
    """cDPO's flip probability: 0.5 would make chosen and rejected indistinguishable."""
    if not (math.isfinite(label_smoothing) and 0.0 <= label_smoothing < 0.5):
        raise UserError(f"{who} label_smoothing must be in [0, 0.5), got {label_smoothing}")


def check_sft_weight(sft_weight: float) -> None:
    if not sft_weight >= 0.0 or math.isinf(sft_weight):
        raise UserError(f"dpo sft_weight must be a finite number >= 0, got {sft_weight}")


def check_dpo_loss_type(loss_type: str, label_smoothing: float) -> None:
    if loss_type not in DPO_LOSS_TYPES:
        raise UserError(f"dpo loss_type must be one of {', '.join(DPO_LOSS_TYPES)}, got {loss_type!r}")
    check_label_smoothing("dpo", label_smoothing)
    if label_smoothing and loss_type != "sigmoid":
        raise UserError(f"dpo label_smoothing (cDPO) applies to loss_type 'sigmoid' only, got {loss_type!r}")


def _check_aligned(who: str, **tensors: torch.Tensor) -> None:
    """Per-sequence tensors of one shape [P >= 1]."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 1 or first[0] == 0 or any(s != first for s in shapes.values()):
        raise ExperimentError(f"{who}: per-sequence inputs must share one shape [P >= 1], got {shapes}")


def _check_lengths(who: str, *lengths: torch.Tensor) -> None:
    if any(bool((n <= 0).any()) for n in lengths):
        raise ExperimentError(f"{who}: an answer has no loss token, so it has no average logprob")


def _pair_metrics(chosen_rewards_P: torch.Tensor, rejected_rewards_P: torch.Tensor, chosen_logps_P: torch.Tensor,
                  rejected_logps_P: torch.Tensor) -> Metrics:
    c, r = chosen_rewards_P.detach(), rejected_rewards_P.detach()
    return {"rewards/chosen": float(c.mean()), "rewards/rejected": float(r.mean()),
            "rewards/margins": float((c - r).mean()), "rewards/accuracies": float((c > r).float().mean()),
            "logps/chosen": float(chosen_logps_P.detach().mean()),
            "logps/rejected": float(rejected_logps_P.detach().mean())}


# ----- the losses ---------------------------------------------------------------------------------------------


def sigmoid_loss(logits_P: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per pair -(1 - eps) log sigmoid(z) - eps log sigmoid(-z): the Bradley-Terry loss of DPO, and with eps > 0
    conservative DPO (cDPO; Mitchell 2023, "A note on DPO with noisy preferences"), the loss when each label is
    flipped with probability eps."""
    return -(1.0 - label_smoothing) * F.logsigmoid(logits_P) - label_smoothing * F.logsigmoid(-logits_P)


def dpo_loss(chosen_logps_P: torch.Tensor, rejected_logps_P: torch.Tensor, ref_chosen_logps_P: torch.Tensor,
             ref_rejected_logps_P: torch.Tensor, *, beta: float, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0, chosen_lengths_P: torch.Tensor | None = None,
             rejected_lengths_P: torch.Tensor | None = None, sft_weight: float = 0.0) -> tuple[torch.Tensor, Metrics]:
    """Mean over pairs of DPO's loss on h = (logp_c - ref_c) - (logp_r - ref_r):
        sigmoid  -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)  (Rafailov et al. 2023, arXiv 2305.18290;
                 eps > 0: cDPO)
        hinge    max(0, 1 - beta h)                          (SLiC, Zhao et al. 2023, arXiv 2305.10425)
        ipo      (h_avg - 1 / (2 beta))^2                    (Azar et al. 2023, arXiv 2310.12036, Eq. 17)
    IPO's h_avg divides each answer's log-ratio by its loss-token count (so the lengths are required): TRL does so
    (DPOTrainer, loss_type "ipo"), stating the IPO authors confirmed it is the form behind their reported results;
    with summed log-ratios the square grows with answer length and beta's scale depends on it. For IPO beta is the
    paper's tau. Rewards in the metrics are beta * the summed log-ratios for every loss type, as TRL logs them.

    sft_weight alpha > 0 adds alpha * NLL of the chosen answers (RPO, Pang et al. 2024, arXiv 2404.19733: the
    preference term alone may lower the chosen answer's likelihood as long as the rejected one falls faster), the
    NLL pooled over every chosen loss token (TRL's loss_type "sft" with loss_weights); metric `nll_loss`."""
    check_beta("dpo", beta)
    check_dpo_loss_type(loss_type, label_smoothing)
    check_sft_weight(sft_weight)
    _check_aligned("dpo", chosen=chosen_logps_P, rejected=rejected_logps_P, ref_chosen=ref_chosen_logps_P,
                   ref_rejected=ref_rejected_logps_P)
    chosen_logratios_P = chosen_logps_P - ref_chosen_logps_P.detach()
    rejected_logratios_P = rejected_logps_P - ref_rejected_logps_P.detach()
    if loss_type == "ipo":
        if chosen_lengths_P is None or rejected_lengths_P is None:
            raise ExperimentError("dpo: loss_type 'ipo' averages over answer lengths, and none were given")
        _check_aligned("dpo", chosen=chosen_logps_P, chosen_lengths=chosen_lengths_P,
                       rejected_lengths=rejected_lengths_P)
        _check_lengths("dpo", chosen_lengths_P, rejected_lengths_P)
        delta_P = chosen_logratios_P / chosen_lengths_P - rejected_logratios_P / rejected_lengths_P
        losses_P = (delta_P - 1.0 / (2.0 * beta)) ** 2
    else:
        logits_P = beta * (chosen_logratios_P - rejected_logratios_P)
        losses_P = sigmoid_loss(logits_P, label_smoothing) if loss_type == "sigmoid" else torch.relu(1.0 - logits_P)
    metrics = _pair_metrics(beta * chosen_logratios_P, beta * rejected_logratios_P, chosen_logps_P, rejected_logps_P)
    if sft_weight == 0.0:
        return losses_P.mean(), metrics
    if chosen_lengths_P is None:
        raise ExperimentError("dpo: sft_weight > 0 averages the chosen answers' NLL over their tokens, and no lengths "
                              "were given")
    _check_aligned("dpo", chosen=chosen_logps_P, chosen_lengths=chosen_lengths_P)
    _check_lengths("dpo", chosen_lengths_P)
    nll = -chosen_logps_P.sum() / chosen_lengths_P.sum()
    metrics["nll_loss"] = float(nll.detach())
    return losses_P.mean() + sft_weight * nll, metrics


def simpo_loss(chosen_logps_P: torch.Tensor, rejected_logps_P: torch.Tensor, chosen_lengths_P: torch.Tensor,
               rejected_lengths_P: torch.Tensor, *, beta: float, gamma: float,
               label_smoothing: float = 0.0) -> tuple[torch.Tensor, Metrics]:
    """SimPO (Meng et al. 2024, arXiv 2405.14734), reference-free: mean over pairs of
        -log sigmoid(beta / |y_w| * log pi(y_w) - beta / |y_l| * log pi(y_l) - gamma),
    the rewards being length-averaged logprobs and gamma the target reward margin; with label_smoothing eps the
    cDPO form of `sigmoid_loss` (as TRL's CPOTrainer, loss_type "simpo", applies it)."""
    check_beta("simpo", beta)
    check_simpo_gamma(gamma)
    check_label_smoothing("simpo", label_smoothing)
    _check_aligned("simpo", chosen=chosen_logps_P, rejected=rejected_logps_P, chosen_lengths=chosen_lengths_P,
                   rejected_lengths=rejected_lengths_P)
    _check_lengths("simpo", chosen_lengths_P, rejected_lengths_P)
    chosen_avg_P, rejected_avg_P = chosen_logps_P / chosen_lengths_P, rejected_logps_P / rejected_lengths_P
    losses_P = sigmoid_loss(beta * (chosen_avg_P - rejected_avg_P) - gamma, label_smoothing)
    return losses_P.mean(), _pair_metrics(beta * chosen_avg_P, beta * rejected_avg_P, chosen_avg_P, rejected_avg_P)


def kto_loss(logps_N: torch.Tensor, ref_logps_N: torch.Tensor, desirable_N: torch.Tensor, kl_logps_K: torch.Tensor,
             ref_kl_logps_K: torch.Tensor, *, beta: float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> tuple[torch.Tensor, Metrics]:
    """KTO (Ethayarajh et al. 2024, arXiv 2402.01306, Eq. 7) on unpaired answers, mean over the N rows of
        desirable    lambda_D * (1 - sigmoid(beta * (h - z0)))
        undesirable  lambda_U * (1 - sigmoid(beta * (z0 - h)))
    with h = logp - ref per answer and the reference point z0 = max(0, mean over K mismatched (prompt, completion)
    rows of logp - ref), detached: the paper's batch estimate of KL(policy || reference), computed as TRL's
    KTOTrainer does (its rows pair each prompt with another example's completion). `desirable_N` is bool [N].
    Metrics add `kl` (z0); a side with no row in the batch reports 0 for its rewards and logps, and
    `rewards/margins` (mean chosen minus mean rejected reward, as TRL) is 0 unless both sides are present."""
    check_beta("kto", beta)
    check_positive("kto", "desirable_weight", desirable_weight)
    check_positive("kto", "undesirable_weight", undesirable_weight)
    _check_aligned("kto", logps=logps_N, ref_logps=ref_logps_N, desirable=desirable_N)
    _check_aligned("kto", kl_logps=kl_logps_K, ref_kl_logps=ref_kl_logps_K)
    desirable_N = desirable_N.bool()
    z0 = (kl_logps_K.detach() - ref_kl_logps_K.detach()).mean().clamp(min=0.0)
    logratios_N = logps_N - ref_logps_N.detach()
    losses_N = torch.where(desirable_N, desirable_weight * (1.0 - torch.sigmoid(beta * (logratios_N - z0))),
                           undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - logratios_N))))
    rewards_N, logps = beta * logratios_N.detach(), logps_N.detach()
    metrics: Metrics = {"kl": float(z0)}
    for side, rows in (("chosen", desirable_N), ("rejected", ~desirable_N)):
        metrics[f"rewards/{side}"] = float(rewards_N[rows].mean()) if bool(rows.any()) else 0.0
        metrics[f"logps/{side}"] = float(logps[rows].mean()) if bool(rows.any()) else 0.0
    both = bool(desirable_N.any()) and not bool(desirable_N.all())
    metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"] if both else 0.0
    return losses_N.mean(), metrics


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0 without cancellation: log1p(-exp(x)) below -log 2, log(-expm1(x)) above (Maechler
    2012, "Accurately computing log(1 - exp(-|a|))")."""
    return torch.where(x < -math.log(2.0), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(chosen_logps_P: torch.Tensor, rejected_logps_P: torch.Tensor, chosen_lengths_P: torch.Tensor,
              rejected_lengths_P: torch.Tensor, *, beta: float) -> tuple[torch.Tensor, Metrics]:
    """ORPO (Hong et al. 2024, arXiv 2403.07691), reference-free:
        NLL(chosen) - beta * mean over pairs of log sigmoid(log odds(y_w) - log odds(y_l)),
    log odds(y) = log(p / (1 - p)) = a - log(1 - exp(a)) with a the answer's length-averaged logprob, and beta the
    paper's lambda (TRL's name). The NLL is the mean over every chosen loss token of the batch (pooled, as TRL's
    cross-entropy averages); it counts the answer's loss tokens only, where TRL's ORPOTrainer also counts the
    prompt's. Metrics add `nll_loss`, `log_odds_ratio` (mean log sigmoid term), `log_odds_chosen` (mean log odds
    difference)."""
    check_beta("orpo", beta)
    _check_aligned("orpo", chosen=chosen_logps_P, rejected=rejected_logps_P, chosen_lengths=chosen_lengths_P,
                   rejected_lengths=rejected_lengths_P)
    _check_lengths("orpo", chosen_lengths_P, rejected_lengths_P)
    chosen_avg_P, rejected_avg_P = chosen_logps_P / chosen_lengths_P, rejected_logps_P / rejected_lengths_P
    if bool((chosen_avg_P.detach() >= 0).any() or (rejected_avg_P.detach() >= 0).any()):
        raise ExperimentError("orpo: an answer has average logprob >= 0 (probability 1), so its odds are infinite")
    log_odds_P = (chosen_avg_P - rejected_avg_P) - (log1mexp(chosen_avg_P) - log1mexp(rejected_avg_P))
    ratio_P = F.logsigmoid(log_odds_P)
    nll = -chosen_logps_P.sum() / chosen_lengths_P.sum()
    metrics = _pair_metrics(beta * chosen_avg_P, beta * rejected_avg_P, chosen_avg_P, rejected_avg_P)
    metrics.update({"nll_loss": float(nll.detach()), "log_odds_ratio": float(ratio_P.detach().mean()),
                    "log_odds_chosen": float(log_odds_P.detach().mean())})
    return nll - beta * ratio_P.mean(), metrics
