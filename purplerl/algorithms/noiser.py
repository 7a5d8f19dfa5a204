"""Token Noiser loss of Token Buncher (Feng et al. 2025, "Token Buncher: Shielding LLMs from Harmful
Reinforcement Learning Fine-Tuning", arXiv 2508.20697).

A supervised loss on target tokens y_t (the defended model's own responses), with p = softmax(logits /
temperature) at each target position and w the weight of the noise term:

    loss_t = (1 - eps) * (-log p(y_t)) + w * sum_{v != y_t} n_{t,v} * (-log p(v))

n_{t,.} is uniform random noise over the NON-target vocabulary entries, normalized to sum to 1
(n_{t,y_t} = 0), drawn afresh at every call. eps = 0 is the plain NLL. It is label smoothing
(Szegedy et al. 2016, arXiv 1512.00567) with a random smoothing distribution per token instead of the
uniform one. Two weights, `noise_weight`:
- "reference" (default): w = eps^2. The paper's released code draws the noise so that it sums to eps and
  then weights the noise term by eps again, so with eps = 0.1 the noise carries 0.01 of the loss.
- "paper": w = eps, the formula as the paper writes it.
Why the difference matters: the loss is minimized at p(y_t) = (1 - eps) / (1 - eps + w) and
p(v) = w n_{t,v} / (1 - eps + w), i.e. a mass of w / (1 - eps + w) spread over the V - 1 other tokens at
random. Its entropy is h(mass) + mass * H(n), with H(n) ~ log(V) - 0.2: on SmolLM2's V = 49152 that is
1.39 nats per token for "paper" (mass 0.1) and 0.18 for "reference" (mass 0.011). Trained towards the
first, a model sampled at temperature 1 draws a random junk token at one position in ten, and the next
noiser step takes those junk tokens as targets: the entropy the RL reward pushes down climbs back up.

Why: the NLL part keeps the target confident; the noise part makes the leftover probability mass
follow random tokens instead of the model's plausible alternatives. An attacker's RL that raises the
entropy of the defended model then spreads mass over those random tokens, so it draws incoherent text
rather than harmful continuations (the overview figure of the paper, panel b).

Memory: positions are processed `chunk_rows` at a time, and only masked positions are touched, so the
fp32 [rows, V] logits and noise of one chunk exist at once (V is 49k for SmolLM2). Under autograd each
chunk's fp32 tensors are kept for backward, as in `purplerl.algorithms.logprobs`.
"""

from __future__ import annotations

import math

import torch

from purplerl.errors import ExperimentError, UserError

DEFAULT_CHUNK_ROWS = 256
NOISE_WEIGHTS = ("reference", "paper")  # see the module docstring


def noise_term_weight(epsilon: float, noise_weight: str) -> float:
    """w of the noise cross-entropy: eps^2 ("reference", the released code) or eps ("paper")."""
    if noise_weight == "reference":
        return epsilon * epsilon
    if noise_weight == "paper":
        return epsilon
    raise UserError(f"token_noiser noise_weight must be one of {', '.join(NOISE_WEIGHTS)}, got {noise_weight!r}")


def normalize_noise(raw_RV: torch.Tensor, targets_R: torch.Tensor) -> torch.Tensor:
    """Non-negative weights [R, V] -> noise distribution: zero at each row's target, each row sums to 1."""
    noise_RV = raw_RV.float().scatter(1, targets_R.long()[:, None], 0.0)
    total_R1 = noise_RV.sum(dim=1, keepdim=True)
    if (total_R1 <= 0).any():
        r = int((total_R1[:, 0] <= 0).nonzero()[0])
        raise ExperimentError(f"token_noiser_loss: noise row {r} has no positive weight off its target")
    return noise_RV / total_R1


def _check_args(logits_NTV: torch.Tensor, targets_NT: torch.Tensor, mask_NT: torch.Tensor, epsilon: float,
                temperature: float, chunk_rows: int, noise_NTV: torch.Tensor | None) -> None:
    if not (math.isfinite(epsilon) and 0.0 <= epsilon <= 1.0):
        raise UserError(f"token_noiser_loss: epsilon must be in [0, 1], got {epsilon}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise UserError(f"token_noiser_loss: temperature must be > 0, got {temperature}")
    if chunk_rows < 1:
        raise UserError(f"token_noiser_loss: chunk_rows must be >= 1, got {chunk_rows}")
    if logits_NTV.ndim != 3 or logits_NTV.shape[-1] < 2:
        raise ExperimentError(f"token_noiser_loss: logits must be [N, T, V] with V >= 2, got {tuple(logits_NTV.shape)}")
    if targets_NT.shape != logits_NTV.shape[:2] or mask_NT.shape != logits_NTV.shape[:2]:
        raise ExperimentError(f"token_noiser_loss: targets {tuple(targets_NT.shape)} and mask {tuple(mask_NT.shape)} "
                              f"must be [N, T] = {tuple(logits_NTV.shape[:2])}")
    if noise_NTV is not None and noise_NTV.shape != logits_NTV.shape:
        raise ExperimentError(f"token_noiser_loss: noise {tuple(noise_NTV.shape)} != logits {tuple(logits_NTV.shape)}")


def _chunk_losses(logits_CV: torch.Tensor, targets_C: torch.Tensor, raw_CV: torch.Tensor, epsilon: float,
                  weight: float, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, nll, noise cross-entropy) for C positions, via -log p(v) = logsumexp(z) - z_v."""
    z_CV = logits_CV.float() / temperature
    lse_C = torch.logsumexp(z_CV, dim=-1)
    nll_C = lse_C - z_CV.gather(1, targets_C[:, None])[:, 0]
    # sum_v n_v = 1, so sum_v n_v * (lse - z_v) = lse - sum_v n_v z_v.
    noise_ce_C = lse_C - (normalize_noise(raw_CV, targets_C) * z_CV).sum(dim=-1)
    return (1.0 - epsilon) * nll_C + weight * noise_ce_C, nll_C, noise_ce_C


def token_noiser_loss(logits_NTV: torch.Tensor, targets_NT: torch.Tensor, mask_NT: torch.Tensor, *,
                      epsilon: float, generator: torch.Generator | None, temperature: float = 1.0,
                      noise_weight: str = "reference", chunk_rows: int = DEFAULT_CHUNK_ROWS,
                      noise_NTV: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token Noiser loss per token: float32 [N, T], 0 off the mask, differentiable w.r.t. the logits.

    `logits_NTV` are aligned to `targets_NT` (the logits at position t predict target t). The noise of
    each masked position is `torch.rand(V)` from `generator` (on the logits' device), drawn chunk by chunk
    in row-major order of the masked positions, so the loss is a deterministic function of the generator
    state, the inputs and `chunk_rows`. `noise_NTV`, when given, replaces those draws (non-negative raw
    weights, normalized the same way) and `generator` may be None; it is meant for tests.
    `noise_weight` picks w = eps^2 ("reference") or eps ("paper"), see the module docstring.
    Metrics: `noiser_nll` and `noiser_noise_ce`, the means of the two parts over masked positions
    (0 when nothing is masked), unweighted. Non-finite loss or an out-of-vocabulary target raises ExperimentError.
    """
    _check_args(logits_NTV, targets_NT, mask_NT, epsilon, temperature, chunk_rows, noise_NTV)
    weight = noise_term_weight(epsilon, noise_weight)
    num_seq, num_tok, vocab = logits_NTV.shape
    device = logits_NTV.device
    if noise_NTV is None and (generator is None or generator.device.type != device.type):
        raise ExperimentError(f"token_noiser_loss: need a generator on the logits' device ({device.type}), "
                              f"got {None if generator is None else generator.device}")
    pos_R = (mask_NT != 0).reshape(-1).nonzero()[:, 0].to(device)
    if pos_R.numel() == 0:
        zeros_NT = torch.zeros((num_seq, num_tok), device=device).requires_grad_(logits_NTV.requires_grad)
        return zeros_NT, {"noiser_nll": 0.0, "noiser_noise_ce": 0.0}
    targets_R = targets_NT.reshape(-1).to(device)[pos_R].long()
    if int(targets_R.min()) < 0 or int(targets_R.max()) >= vocab:
        raise ExperimentError(f"token_noiser_loss: masked targets must lie in [0, {vocab}), got "
                              f"[{int(targets_R.min())}, {int(targets_R.max())}]")
    logits_RV = logits_NTV.reshape(-1, vocab)  # a view: rows are gathered one chunk at a time below
    noise_RV = None if noise_NTV is None else noise_NTV.reshape(-1, vocab)
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for start in range(0, pos_R.numel(), chunk_rows):
        rows_C = pos_R[start:start + chunk_rows]
        if noise_RV is None:
            raw_CV = torch.rand((rows_C.numel(), vocab), generator=generator, device=device)
        else:
            raw_CV = noise_RV.index_select(0, rows_C.to(noise_RV.device)).to(device)
        parts.append(_chunk_losses(logits_RV.index_select(0, rows_C), targets_R[start:start + chunk_rows], raw_CV,
                                   epsilon, weight, temperature))
    loss_R, nll_R, noise_ce_R = (torch.cat(column) for column in zip(*parts, strict=True))
    bad_R = ~torch.isfinite(loss_R)
    if bad_R.any():
        n, t = divmod(int(pos_R[bad_R.nonzero()[0]]), num_tok)
        raise ExperimentError(f"token_noiser_loss: non-finite loss {loss_R[bad_R][0].item()} at row {n}, token {t} "
                              f"(infinite logits where the noise or target puts weight?)")
    loss_NT = torch.zeros(num_seq * num_tok, device=device).scatter(0, pos_R, loss_R).reshape(num_seq, num_tok)
    metrics = {"noiser_nll": float(nll_R.detach().mean().item()),
               "noiser_noise_ce": float(noise_ce_R.detach().mean().item())}
    return loss_NT, metrics
