"""Turn sampled completions into the right-padded token tensors the engine trains on."""

from __future__ import annotations

import torch

from purplerl.errors import ExperimentError
from purplerl.types import Completion, TrainBatch


def sequence_tensors(completions: list[Completion], pad_id: int) -> dict[str, torch.Tensor]:
    """ids/attention/loss-mask/sampling-logprob tensors [N, T] for prompt+completion sequences."""
    if not completions:
        raise ExperimentError("no completions to build a batch from")
    T = max(len(c.prompt_tokens) + len(c.tokens) for c in completions)
    N = len(completions)
    ids = torch.full((N, T), pad_id, dtype=torch.long)
    attn = torch.zeros((N, T), dtype=torch.long)
    mask = torch.zeros((N, T), dtype=torch.float32)
    old = torch.zeros((N, T), dtype=torch.float32)
    for i, c in enumerate(completions):
        P, C = len(c.prompt_tokens), len(c.tokens)
        if C == 0:
            raise ExperimentError(f"completion {i} has no tokens")
        ids[i, :P + C] = torch.tensor(c.prompt_tokens + c.tokens)
        attn[i, :P + C] = 1
        mask[i, P:P + C] = 1.0  # targets: the completion tokens, including a drawn stop token
        old[i, P:P + C] = c.logprobs_C
    return {"input_ids_NT": ids, "attention_mask_NT": attn, "loss_mask_NT": mask, "sampling_logprobs_NT": old}


def completion_first_keys(completions: list[Completion], prompt_keys: list[list[int]], width: int) -> torch.Tensor:
    """long [N, width]: each token's first key in the rows of `sequence_tensors` (gist prompts, purplerl.data.gist):
    the prompt's own, then its last one for every completion token (the answer reads from the last gist block on);
    padding 0."""
    if len(prompt_keys) != len(completions):
        raise ExperimentError(f"{len(prompt_keys)} first-key lists for {len(completions)} completions")
    first_NT = torch.zeros((len(completions), width), dtype=torch.long)
    for i, (c, keys) in enumerate(zip(completions, prompt_keys, strict=True)):
        if len(keys) != len(c.prompt_tokens):
            raise ExperimentError(f"completion {i}: {len(keys)} first keys for {len(c.prompt_tokens)} prompt tokens")
        first_NT[i, :len(keys) + len(c.tokens)] = torch.tensor([*keys, *[keys[-1]] * len(c.tokens)])
    return first_NT


def build_train_batch(tensors: dict[str, torch.Tensor], advantages_N: torch.Tensor,
                      ref_logprobs_NT: torch.Tensor | None = None) -> TrainBatch:
    """Broadcast one advantage per sequence onto its completion tokens."""
    mask = tensors["loss_mask_NT"]
    if advantages_N.shape != (mask.shape[0],):
        raise ExperimentError(f"advantages have shape {tuple(advantages_N.shape)}, expected ({mask.shape[0]},)")
    return TrainBatch(advantages_NT=advantages_N[:, None].float() * mask, ref_logprobs_NT=ref_logprobs_NT, **tensors)
