"""Scoring a causal LM held in this process: per-token logprobs of chosen positions, micro-batch by micro-batch.

The decoder runs once per micro-batch; the LM head and its log-softmax run only at the positions that are scored
(completion tokens), in row chunks: prompt and padding positions never pay for the vocabulary projection, and the
full [N, T, V] logits never exist. The local engine's trainer scores and trains through these functions.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from purplerl.algorithms.logprobs import selective_log_softmax
from purplerl.algorithms.packing import additive_mask, first_key_mask, first_keys
from purplerl.errors import ExperimentError

# Bytes of one fp32 LM-head chunk [rows, V]. Under glibc malloc's 32 MiB mmap ceiling, the chunk buffers are
# reused from the heap; larger ones are mapped fresh and page-faulted on every call, which made the head's
# forward + backward 1.6x slower at 1024 rows than at 128 (SmolLM2, 1536 rows, bench/NOTES.md).
HEAD_CHUNK_BYTES = 24 * 2**20
# Above this many scored positions per pass, LM-head chunks are recomputed in backward instead of kept.
HEAD_CHECKPOINT_ROWS = 2048
# Up to this sequence width, scoring and training run attention as plain matmuls ("eager"): on CPU, the fused
# SDPA kernel's backward takes ~50 ms per layer in bf16 at 32 x 90 tokens, and the [N, heads, T, T] scores it
# avoids are small. Decoding keeps SDPA: eager attention would copy the grouped KV cache at every token.
# On CUDA, SDPA's fused kernels win at every width, so this is a CPU-only switch.
EAGER_ATTENTION_MAX_WIDTH = 128


def autocast(device: torch.device, bf16: bool):
    """bf16 matmuls over fp32 master weights (`model.dtype autocast_bf16`): several times faster on CPUs with AMX /
    AVX512-BF16; a no-op when off."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)


@contextlib.contextmanager
def attention_for(config, width: int, device: torch.device):
    """Run a CPU forward with eager attention when the sequences are short (see EAGER_ATTENTION_MAX_WIDTH)."""
    chosen = getattr(config, "_attn_implementation", None)
    if device.type != "cpu" or chosen != "sdpa" or width > EAGER_ATTENTION_MAX_WIDTH:
        yield
        return
    config._attn_implementation = "eager"
    try:
        yield
    finally:
        config._attn_implementation = chosen


def model_inputs(config, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor,
                 position_ids_NT: torch.Tensor | None, first_key_NT: torch.Tensor | None = None
                 ) -> dict[str, torch.Tensor]:
    """The keyword arguments of a forward pass. Packed rows (`position_ids_NT`, purplerl.algorithms.packing) and
    gist rows (`first_key_NT`: each query's first key, purplerl.data.gist) get a 4D mask, causal from each query's
    first key, in the form the attention in use reads: additive for eager attention (it adds the mask to its
    scores), boolean for SDPA. Packed rows alone under an implementation with variable-length kernels (flash
    attention) get the position ids alone, from which transformers finds the sequences; a gist mask it cannot read
    is refused."""
    if position_ids_NT is None and first_key_NT is None:
        return {"input_ids": input_ids_NT, "attention_mask": attention_mask_NT}
    positions = {} if position_ids_NT is None else {"position_ids": position_ids_NT}
    implementation = getattr(config, "_attn_implementation", None)
    if implementation in ("eager", "sdpa"):
        allowed = first_key_mask(first_keys(position_ids_NT, first_key_NT))
        mask = additive_mask(allowed, torch.float32) if implementation == "eager" else allowed
        return {"input_ids": input_ids_NT, "attention_mask": mask, **positions}
    if first_key_NT is not None:
        raise ExperimentError(f"gist rows need eager or sdpa attention, which reads a 4D mask; the model runs "
                              f"{implementation}")
    return {"input_ids": input_ids_NT, "attention_mask": None, **positions}


def micro_batches(attention_mask_NT: torch.Tensor, max_sequences: int, max_tokens: int) -> list[torch.Tensor]:
    """Row indices of each micro-batch: sequences sorted by length (so a micro-batch trims to little padding), as
    many per micro-batch as fit in max_tokens padded tokens, at most max_sequences, at least 1."""
    lengths = attention_mask_NT.sum(-1)
    order = torch.argsort(lengths, stable=True)
    batches, current = [], []
    for i in order.tolist():
        width = int(lengths[i])  # ascending: the newest sequence is the longest
        if current and (len(current) >= max_sequences or (len(current) + 1) * width > max_tokens):
            batches.append(torch.tensor(current))
            current = []
        current.append(i)
    if current:
        batches.append(torch.tensor(current))
    return batches


def head_chunk_rows(vocab: int) -> int:
    """Rows of one LM-head chunk: HEAD_CHUNK_BYTES of fp32 logits (128 rows at a 49k vocabulary)."""
    return max(16, HEAD_CHUNK_BYTES // (4 * vocab))


def full_logits(causal_lm, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, bf16: bool,
                position_ids_NT: torch.Tensor | None = None, first_key_NT: torch.Tensor | None = None
                ) -> torch.Tensor:
    """fp32 logits [N, T-1, V] of `causal_lm`: position t predicts token t+1."""
    with autocast(input_ids_NT.device, bf16):
        inputs = model_inputs(causal_lm.config, input_ids_NT, attention_mask_NT, position_ids_NT, first_key_NT)
        logits_NTV = causal_lm(**inputs).logits
    return logits_NTV[:, :-1].float()


def final_hidden(causal_lm, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, bf16: bool,
                 decoder=None, position_ids_NT: torch.Tensor | None = None,
                 first_key_NT: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's final hidden states [N, T, H] (after its last norm: what the LM head and a scalar head read).
    `decoder`: the decoder of `causal_lm` to call instead (its compiled form: engine.fast_paths compiled); packed
    rows with their `position_ids_NT`, gist rows with their `first_key_NT`."""
    device = input_ids_NT.device
    decoder = causal_lm.get_decoder() if decoder is None else decoder
    with autocast(device, bf16), attention_for(causal_lm.config, input_ids_NT.shape[1], device):
        inputs = model_inputs(causal_lm.config, input_ids_NT, attention_mask_NT, position_ids_NT, first_key_NT)
        return decoder(**inputs).last_hidden_state


def target_logprobs(causal_lm, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor,
                    targets_NT: torch.Tensor, temperature: float, *, head_only: bool, bf16: bool,
                    decoder=None, position_ids_NT: torch.Tensor | None = None,
                    first_key_NT: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logprobs [N, T] under `causal_lm` of the tokens where targets_NT is 1 (aligned to targets), 0 elsewhere;
    packed rows with their `position_ids_NT` (purplerl.algorithms.packing), gist rows with their `first_key_NT`.

    head_only: the decoder runs once and the LM head and log-softmax only on the scored positions, in chunks (a
    model whose forward transforms its final logits, softcapping or scaling, must be scored through it instead)."""
    device = input_ids_NT.device
    picked_NT = targets_NT[:, 1:].bool()  # the logits at position t-1 score token t
    if not head_only:
        logits_NTV = full_logits(causal_lm, input_ids_NT, attention_mask_NT, bf16, position_ids_NT, first_key_NT)
        logp_NT = selective_log_softmax(logits_NTV, input_ids_NT[:, 1:], temperature=temperature)
        return F.pad(logp_NT * picked_NT, (1, 0))
    hidden_NTH = final_hidden(causal_lm, input_ids_NT, attention_mask_NT, bf16, decoder, position_ids_NT,
                              first_key_NT)
    rows_RH, tokens_R = hidden_NTH[:, :-1][picked_NT], input_ids_NT[:, 1:][picked_NT]
    head = causal_lm.get_output_embeddings()
    chunk_rows = head_chunk_rows(head.weight.shape[0])

    def chunk_logprobs(rows_CH: torch.Tensor, tokens_C: torch.Tensor) -> torch.Tensor:
        with autocast(device, bf16):
            logits_CV = head(rows_CH)
        return selective_log_softmax(logits_CV[None], tokens_C[None], temperature=temperature,
                                     chunk_rows=chunk_rows)[0]

    out_R = []
    for start in range(0, rows_RH.shape[0], chunk_rows):
        chunk = (rows_RH[start:start + chunk_rows], tokens_R[start:start + chunk_rows])
        if torch.is_grad_enabled() and rows_RH.shape[0] > HEAD_CHECKPOINT_ROWS:
            # keep only the hidden rows for backward and recompute the chunk's [C, V] logits there: the saved
            # logits would otherwise be the largest activation of a small-model batch
            out_R.append(torch.utils.checkpoint.checkpoint(chunk_logprobs, *chunk, use_reentrant=False))
        else:
            out_R.append(chunk_logprobs(*chunk))
    logp_R = torch.cat(out_R) if out_R else hidden_NTH.new_zeros(0, dtype=torch.float32)
    logp_NT = torch.zeros(picked_NT.shape, dtype=torch.float32, device=device)
    logp_NT = logp_NT.masked_scatter(picked_NT, logp_R)
    return F.pad(logp_NT, (1, 0))
