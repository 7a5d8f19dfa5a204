"""Useful FLOPs of one GRPO step on a dense decoder, for MFU: pure functions of the model's shape and token counts.

Convention (PaLM, arXiv 2204.02311, appendix B). A forward pass costs, per token,

    2·N + 4·L·A·context

- N: matmul weights one token passes through: every linear layer of every decoder layer (q, k, v, o, gate, up,
  down) plus the lm_head (vocab × hidden). The embedding lookup is free; norms, activations, softmax and the
  sampler are not counted. The lm_head is counted at every position, although only completion positions need
  logits: both systems are measured against the same count, so their MFU stays comparable.
- 4·L·A·context: QKᵀ and attention·V, L layers of width A = heads·head_dim (= hidden for SmolLM2), against
  `context` keys: the whole sequence in a full-sequence pass (not halved for the causal mask), the prompt plus
  the tokens drawn so far in a KV-cache decode step.

Phases, counted over real (non-padding) tokens only, so padding and recomputation are waste, not work:
- sampling: prefill of the prompt (P tokens, context P) + one decode step per completion token (token j of C
  has context P + j).
- reference pass: one forward over prompt + completion (T = P + C tokens, context T).
- training of a LoRA adapter on a frozen base: forward + backward to the inputs ≈ 2 × forward, plus the
  adapter's own matmuls: 2·P_lora per token for its weight gradients and 2·P_lora for its forward
  (4·P_lora·T; the adapter's share of the input gradients is neglected, under 2% at r=16).
- full fine-tuning: forward + backward to the inputs + weight gradients = 3 × forward (the usual 6·N per token).

Decode floor: a batched KV-cache decode step reads every matmul weight once, whatever the batch size, so the
sampling phase cannot beat (decode steps) × (weight bytes) / (memory bandwidth). The cached keys and values each
step reads are counted apart (`kv_cache_bytes`): they grow with batch and context, the weights do not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The shape of a Llama-style decoder (gated MLP, grouped-query attention)."""

    layers: int  # L, decoder layers
    hidden: int  # h, residual width
    intermediate: int  # I, MLP width
    heads: int  # query heads
    kv_heads: int  # key/value heads (GQA)
    head_dim: int  # width of one head
    vocab: int  # V, lm_head rows

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelShape:
        """From a transformers config (or any object with its attribute names)."""
        missing = [name for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                     "vocab_size") if getattr(config, name, None) is None]
        if missing:
            raise ValueError(f"model config has no {', '.join(missing)}: not a dense Llama-style decoder")
        heads = config.num_attention_heads
        return cls(layers=config.num_hidden_layers, hidden=config.hidden_size, intermediate=config.intermediate_size,
                   heads=heads, kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   vocab=config.vocab_size)

    @property
    def attention_width(self) -> int:
        """A = heads · head_dim: the width of the query (and of o_proj's input)."""
        return self.heads * self.head_dim

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer: q, k, v, o, gate, up, down."""
        h, a, kv, i = self.hidden, self.attention_width, self.kv_heads * self.head_dim, self.intermediate
        return [(h, a), (h, kv), (h, kv), (a, h), (h, i), (h, i), (i, h)]


def matmul_params(shape: ModelShape) -> int:
    """N: weights of all decoder linear layers plus the lm_head (vocab × hidden)."""
    per_layer = sum(n_in * n_out for n_in, n_out in shape.linear_shapes())
    return shape.layers * per_layer + shape.vocab * shape.hidden


def lora_params(shape: ModelShape, rank: int) -> int:
    """Parameters of a rank-r LoRA on every decoder linear layer ('all-linear'): r·(in + out) each."""
    return shape.layers * sum(rank * (n_in + n_out) for n_in, n_out in shape.linear_shapes())


def forward_flops(shape: ModelShape, tokens: float, context: float) -> float:
    """tokens · (2·N + 4·L·A·context): a forward over `tokens` tokens whose queries each see `context` keys."""
    return tokens * (2 * matmul_params(shape) + 4 * shape.layers * shape.attention_width * context)


def sampling_flops(shape: ModelShape, sequences: Iterable[tuple[int, int]]) -> float:
    """Prefill plus KV-cache decode of each (prompt tokens P, completion tokens C) sequence."""
    total = 0.0
    for prompt, completion in sequences:
        total += forward_flops(shape, prompt, prompt)
        # decode token j (1..C) sees P + j keys: the sum over j is C·P + C(C+1)/2
        total += forward_flops(shape, completion, 0) + 4 * shape.layers * shape.attention_width * (
            completion * prompt + completion * (completion + 1) / 2)
    return total


def reference_flops(shape: ModelShape, sequences: Iterable[tuple[int, int]]) -> float:
    """One forward over each whole (P, C) sequence: the frozen base's log-probs for the KL term."""
    return sum(forward_flops(shape, p + c, p + c) for p, c in sequences)


def training_flops(shape: ModelShape, sequences: Iterable[tuple[int, int]], rank: int | None) -> float:
    """Forward + backward over each (P, C) sequence: of a rank-r LoRA on a frozen base 2·forward + 4·P_lora·T;
    of every weight (rank None: full fine-tuning) 3·forward."""
    sequences = list(sequences)
    if rank is None:
        return 3 * reference_flops(shape, sequences)
    tokens = sum(p + c for p, c in sequences)
    return 2 * reference_flops(shape, sequences) + 4 * lora_params(shape, rank) * tokens


def decode_weight_bytes(shape: ModelShape, dtype_bytes: int, rank: int | None = None) -> int:
    """Bytes of weights one batched decode step reads: every matmul weight (N) and the rank-r LoRA factors, if
    any, each once per step. Norms and biases are left out (under 0.1%); the embedding lookup reads B rows."""
    return dtype_bytes * (matmul_params(shape) + (lora_params(shape, rank) if rank is not None else 0))


def kv_cache_bytes(shape: ModelShape, sequences: Iterable[tuple[int, int]], dtype_bytes: int) -> float:
    """Bytes of cached keys and values the decode steps read: token j (1..C) of a (P, C) sequence reads P + j
    positions (as in the attention FLOPs), each L·2·kv_heads·head_dim values."""
    per_position = shape.layers * 2 * shape.kv_heads * shape.head_dim * dtype_bytes
    return per_position * sum(c * p + c * (c + 1) / 2 for p, c in sequences)


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilization: useful FLOPs per second as a fraction of the measured peak."""
    return flops / seconds / peak_flops_per_s
