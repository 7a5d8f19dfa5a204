"""Tolerances for tests that compare two computations of the same mathematics, derived from the dtype and the
reduction length (issue 33, "Portable tolerances"). CI's CPUs differ (Intel with AMX, AMD with AVX512-BF16, AMD
with AVX2 only) and torch picks other kernels, blockings and summation orders on each: a tolerance that one CPU's
kernels happen to meet is no bound.

The source of every formula is N. J. Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., SIAM 2002:
u = eps / 2 is the unit roundoff (§2.1); gamma_n = n u / (1 - n u) bounds n successive roundings (Lemma 3.1); a dot
product or matrix product of inner length n errs by at most gamma_n |a|.|b| (§3.1, §3.5), and a sum of n terms in any
order by gamma_{n-1} sum |x_i| (§4.2, eq. (4.4)); a chain of such steps of lengths n_1, n_2, ... errs as one of
length n_1 + n_2 + ... (Lemma 3.3: (1 + theta_j)(1 + theta_k) = 1 + theta_{j+k}).
"""

from __future__ import annotations

import torch


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon: the gap from 1 to the next number (2^-23 for float32, 2^-7 for bfloat16, 2^-52 for
    float64)."""
    return torch.finfo(dtype).eps


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: one rounding to nearest moves a value x by at most u |x| (Higham §2.1)."""
    return eps(dtype) / 2


def gamma(dtype: torch.dtype, n: int) -> float:
    """gamma_n = n u / (1 - n u): the relative error of n roundings in a row (Higham Lemma 3.1); it needs n u < 1
    (float32: n < 1.7e7; bfloat16: n < 256, which is why bf16 kernels accumulate in fp32)."""
    nu = n * unit_roundoff(dtype)
    if not 0 <= nu < 1:
        raise ValueError(f"gamma_{n} is no bound in {dtype}: n u = {nu:.3g} must be in [0, 1)")
    return nu / (1 - nu)


def reduction_atol(dtype: torch.dtype, n_terms: int, magnitude: float) -> float:
    """2 gamma_n magnitude, n = n_terms: the greatest difference between two computations in `dtype` of one reduction
    of n_terms terms that differ only in the order and blocking of its operations. Each lies within gamma_n sum |x_i|
    of the exact value (Higham eq. (3.4), (4.4)), `magnitude` standing for sum |x_i|. For a chain of reductions (a
    gradient through a network) n_terms is the sum of their lengths (Lemma 3.3) and sum |x_i| is the result computed
    on absolute values, which a test may estimate by the result's own scale (its max-abs) when it shows the bound
    holding on two reduction orders itself.

    It is the worst case: rounding errors of either sign grow like sqrt(n) u in practice (Higham §3.6), so measured
    differences sit well inside it, and a bug that changes the mathematics by more than ~n u still fails."""
    return 2 * gamma(dtype, n_terms) * magnitude


def decoder_reductions(config, positions: int) -> int:
    """The summed length of the longest chain of reductions in one forward pass of a Llama-style decoder from its
    embeddings to its logits (the n of a chain, Higham Lemma 3.3): per layer its two RMS norms, the q, o, gate and up
    projections (the hidden width each), the attention scores (a head's width), the softmax and the weighted sum over
    the `positions`, and the down projection (the MLP width); then the final norm and the LM head (the hidden width
    each). A log-softmax adds the vocabulary; a weight's gradient runs the chain forward to the loss and back (twice
    that) and sums over the tokens of the batch."""
    hidden = config.hidden_size
    head = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    per_layer = 5 * hidden + head + 2 * positions + config.intermediate_size
    return config.num_hidden_layers * per_layer + 2 * hidden


def logprob_atol(dtype: torch.dtype, config, positions: int, magnitude: float) -> float:
    """reduction_atol over the chain from the embeddings through the decoder to a log-softmax over the vocabulary,
    for logprobs or entropies of one model computed along two paths (KV-cached decoding and a full forward, merged
    and unmerged adapters, a chunked and a full LM head, eager and fused attention). `magnitude`: the largest |value|
    compared; a log-softmax is the log of a sum of V exponentials, so |log p| (about log V and more) is at least the
    size of the logits of these small random models, whose |terms| each reduction on the chain sums."""
    return reduction_atol(dtype, decoder_reductions(config, positions) + config.vocab_size, magnitude)


def gradient_atol(dtype: torch.dtype, config, positions: int, tokens: int, magnitude: float) -> float:
    """reduction_atol over a weight gradient's chain: forward through the decoder and the log-softmax to the loss,
    back along the same chain, and over the `tokens` the gradient sums; for gradients computed along two paths (split
    and whole batches, linearized and direct backward, fused and plain layers). `magnitude`: the largest element of
    the whole gradient, every weight's: an element's terms are products of one back-propagated signal, and one that
    cancels to far less than them (an attention query's gradient, 1e-4 of the largest) errs in proportion to them."""
    forward = decoder_reductions(config, positions) + config.vocab_size
    return reduction_atol(dtype, 2 * forward + tokens, magnitude)


def rounding_atol(dtype: torch.dtype, roundings: int, magnitude: float) -> float:
    """gamma_k magnitude, k = roundings: the error of an elementwise formula evaluated with k roundings in `dtype`
    (each operation, and each cast into `dtype`, rounds once) on values of size `magnitude`, against the exact value or
    a float64 reference (Higham Lemma 3.1)."""
    return gamma(dtype, roundings) * magnitude
