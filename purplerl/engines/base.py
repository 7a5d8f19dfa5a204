"""The engine seam: training primitives in the shape of the Tinker API, not a trainer.

The RL loop only talks to this protocol, so every recipe runs on every engine. Per-token tensors are
aligned to targets (see purplerl.types).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from purplerl.types import AdamParams, Completion, LossSpec, SamplingParams, TrainBatch


class Engine(Protocol):
    tokenizer: Any  # a transformers tokenizer: renders prompts, decodes completions

    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """Draw n completions for each prompt; result[b][g] answers prompt b."""
        ...

    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, *,
                 reference: bool = False, temperature: float = 1.0, micro_batch_size: int = 64,
                 micro_batch_tokens: int = 4096, targets_NT: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token logprobs [N, T] under the policy, or the frozen base if reference. Only the positions
        where targets_NT is 1 are computed (default: every token after the first); the rest are 0."""
        ...

    def forward_backward(self, batch: TrainBatch, loss: LossSpec) -> dict[str, float]:
        """Compute the loss on the batch and accumulate its gradients."""
        ...

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """Apply and clear the accumulated gradients."""
        ...

    def save(self, path: Path) -> None:
        """Write adapter (a standard PEFT dir) + optimizer state into path."""
        ...

    def load(self, path: Path) -> None:
        """Restore what save() wrote."""
        ...
