"""Log-prob and entropy helpers over logits, plus masked reductions.

`selective_log_softmax` and `entropy_from_logits` work on chunks of rows (flattened N*T positions), so
the full fp32 [N, T, V] log-softmax never exists at once: each chunk is upcast to fp32, reduced and dropped.
`selective_log_softmax` has its own backward (`_GatheredLogSoftmax`): it keeps only the logits as given
(bf16 under mixed precision) and the per-row logsumexp, and rebuilds softmax - onehot in one fp32 buffer,
in place, instead of autograd's chain of vocabulary-sized temporaries.

Alignment is the caller's job: to score token t of a sequence, pass the logits at position t-1
(see `purplerl.types`: per-token tensors are aligned to targets).
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_ROWS = 512  # 512 positions x 152k vocab x 4 bytes ~ 0.3 GB per chunk for the largest vocabs


def _check_chunk(chunk_rows: int, temperature: float) -> None:
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


class _GatheredLogSoftmax(torch.autograd.Function):
    """log softmax(x / temperature)[index] for rows x of `logits_CV`, computed at float32 or wider.

    forward: logit[index] / t - logsumexp(x / t). backward: d/dx = g / t · (onehot(index) - softmax(x / t)),
    with the softmax rebuilt from the saved logsumexp."""

    @staticmethod
    def forward(ctx, logits_CV: torch.Tensor, index_C: torch.Tensor, temperature: float) -> torch.Tensor:
        work_CV = logits_CV.to(torch.promote_types(logits_CV.dtype, torch.float32), copy=True)
        if temperature != 1.0:
            work_CV.div_(temperature)
        picked_C = work_CV.gather(-1, index_C[:, None])[:, 0]
        lse_C = torch.logsumexp(work_CV, dim=-1)
        ctx.save_for_backward(logits_CV, index_C, lse_C)
        ctx.temperature = temperature
        return picked_C - lse_C

    @staticmethod
    def backward(ctx, grad_C: torch.Tensor):
        logits_CV, index_C, lse_C = ctx.saved_tensors
        t = ctx.temperature
        grad_CV = logits_CV.to(lse_C.dtype, copy=True)  # becomes -g · softmax, in place
        if t != 1.0:
            grad_CV.div_(t)
        grad_CV.sub_(lse_C[:, None]).exp_().mul_(-grad_C[:, None])
        grad_CV.scatter_add_(-1, index_C[:, None], grad_C[:, None].to(grad_CV.dtype))
        if t != 1.0:
            grad_CV.div_(t)
        return grad_CV.to(logits_CV.dtype), None, None


def selective_log_softmax(logits_NTV: torch.Tensor, index_NT: torch.Tensor, temperature: float = 1.0,
                          chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """log softmax(logits / temperature) gathered at `index`: float32 [N, T].

    Equal to `torch.log_softmax(logits / temperature, -1).gather(-1, index[..., None])[..., 0]`, computed
    as `logit[index] - logsumexp(logits)` on `chunk_rows` positions at a time.
    """
    _check_chunk(chunk_rows, temperature)
    num_seq, num_tok, vocab = logits_NTV.shape
    if tuple(index_NT.shape) != (num_seq, num_tok):
        raise ValueError(f"index shape {tuple(index_NT.shape)} does not match logits {tuple(logits_NTV.shape)}")
    logits_RV = logits_NTV.reshape(-1, vocab)
    index_R = index_NT.reshape(-1).long()
    out_R: list[torch.Tensor] = []
    for start in range(0, logits_RV.shape[0], chunk_rows):
        out_R.append(_GatheredLogSoftmax.apply(logits_RV[start:start + chunk_rows],
                                               index_R[start:start + chunk_rows], temperature).float())
    if not out_R:
        return logits_NTV.new_zeros((num_seq, num_tok), dtype=torch.float32)
    return torch.cat(out_R).reshape(num_seq, num_tok)


def entropy_from_logits(logits_NTV: torch.Tensor, temperature: float = 1.0,
                        chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """Entropy (nats) of softmax(logits / temperature) at each position: float32 [N, T]."""
    _check_chunk(chunk_rows, temperature)
    num_seq, num_tok, vocab = logits_NTV.shape
    logits_RV = logits_NTV.reshape(-1, vocab)
    out_R: list[torch.Tensor] = []
    for start in range(0, logits_RV.shape[0], chunk_rows):
        chunk_CV = logits_RV[start:start + chunk_rows].float() / temperature
        logp_CV = chunk_CV - torch.logsumexp(chunk_CV, dim=-1, keepdim=True)
        # H = -sum p log p. A -inf logit (top-k masking) has p = 0; its log p is replaced by 0 before the
        # product so neither the value nor the gradient becomes 0 * inf = NaN.
        finite_logp_CV = torch.where(torch.isneginf(logp_CV), 0.0, logp_CV)
        out_R.append(-(logp_CV.exp() * finite_logp_CV).sum(dim=-1))
    if not out_R:
        return logits_NTV.new_zeros((num_seq, num_tok), dtype=torch.float32)
    return torch.cat(out_R).reshape(num_seq, num_tok)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x * mask (over `dim`, or everything). Off-mask entries never contribute, even inf/NaN."""
    weighted = torch.where(mask != 0, x * mask, 0.0)
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mask-weighted mean of x (over `dim`, or everything).

    A reduction with no masked entries returns 0 rather than NaN; this helper is for metrics and
    losses. Code that must fail on an empty row (e.g. `sequence_kl`) checks the counts itself.
    """
    total = masked_sum(x, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return total / torch.where(count == 0, torch.ones_like(count), count)
