"""The engine seam: training primitives in the shape of the Tinker API, not a trainer.

`Engine` is the core every engine has: sample, score, train an adapter, switch adapters, save and load. What only
some engines can do is a capability, its own protocol: `ScalarHeads` (adapters with a scalar head: reward models,
critics) and `AdapterMixing` (several adapters acting together, or one of another rank: gradient routing). The
table of which engine has which is `engines.capabilities`; a recipe declares what it needs (`Recipe.needs`) and
the runner refuses a run whose engine lacks it once, in one line, before anything loads. So an engine implements
the capabilities it has and carries no refusal for those it lacks. Per-token tensors are aligned to targets (see
purplerl.types).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from purplerl.algorithms.registry import CustomLoss, Loss
from purplerl.engines.distributed import World
from purplerl.errors import ExperimentError
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch


@dataclass(frozen=True)
class EngineSettings:
    """How an engine executes, not what it computes."""

    micro_batch_size: int = 64  # max sequences per forward/backward pass (gradients accumulate to the full batch)
    micro_batch_tokens: int = 4096  # max padded tokens per pass: length-sorted sequences fill each pass up to this
    merged_sampler: bool = True  # sample from a plain copy of the model with the LoRA update merged in (one more copy)
    cuda_graphs: bool = True  # CUDA: decode over a static KV cache, each token's forward replayed as one CUDA graph
    fused_lora: bool = True  # plain LoRA layers (no dropout) as one accumulating matmul, the scaling folded into B
    packed_decode: bool = True  # CPU bf16: decode over prepacked oneDNN weights where this machine measures it faster
    compiled: bool = False  # torch.compile of the policy's decoder for training and scoring (never for decoding)
    optimizer: str = "adamw"  # the trained weights' optimizer: 'adamw', or 'adamw_8bit' (8-bit moments, bitsandbytes)


def check_prompts(prompt_tokens: list[list[int]], n: int) -> None:
    """What every engine's `sample` refuses: nothing to draw, or an empty prompt."""
    if not prompt_tokens or n < 1:
        raise ExperimentError(f"sample() got {len(prompt_tokens)} prompts x n={n}: nothing to sample")
    if any(len(p) == 0 for p in prompt_tokens):
        raise ExperimentError("sample() got an empty prompt")


def check_batch(batch: TrainBatch, loss: Loss | None = None) -> None:
    """What every engine's `forward_backward` refuses: an input the loss declares but the batch lacks, or a
    batch with no completion token to train on."""
    if loss is not None:
        missing = [name for name in loss.definition.required_inputs(loss.params) if getattr(batch, name) is None]
        if missing:
            raise ExperimentError(f"loss '{loss.name}' needs {missing[0]} in the batch")
    if batch.num_sequences == 0 or batch.num_loss_tokens == 0:
        raise ExperimentError("forward_backward got an empty batch (no completion tokens to train on)")


class Engine(Protocol):
    """The core every engine has (Tinker's training primitives): sample, score, train the active adapter, switch
    adapters, save and load. `tests/engines/test_engine_contract.py` is the behaviour it must show."""

    tokenizer: Any  # a transformers tokenizer: renders prompts, decodes completions

    @property
    def world(self) -> World:
        """The processes this engine spans (engines.distributed): SINGLE for a one-process engine, the group of a
        data-parallel one."""
        ...

    @property
    def sample_metrics(self) -> dict[str, float]:
        """The last `sample` call's report about its sampler (vLLM: `rollout/lp_diff_mean`, the gap between its
        logprobs and the trainer's); empty for an engine with nothing to report."""
        ...

    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """Draw n completions for each prompt; `result[b][g]` answers prompt b."""
        ...

    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, *,
                 reference: bool = False, temperature: float = 1.0,
                 targets_NT: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token logprobs [N, T] under the active adapter, or the frozen base if reference. Only the
        positions where targets_NT is 1 are computed (default: every token after the first); the rest are 0."""
        ...

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        """Compute a registered loss on the batch and accumulate its gradients into the active adapter."""
        ...

    def forward_backward_custom(self, batch: TrainBatch, loss: CustomLoss) -> dict[str, float]:
        """The same for a user-supplied function of the batch's logprobs."""
        ...

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """Apply and clear the active adapter's accumulated gradients."""
        ...

    @property
    def adapters(self) -> list[str]:
        """Names of the adapters on the frozen base ("default" first)."""
        ...

    @property
    def active_adapter(self) -> str:
        """The name of the adapter that samples, scores and trains now."""
        ...

    def create_adapter(self, name: str, init: str | Path | None = None) -> None:
        """Add an adapter: fresh (of the model config's LoRA rank) or loaded from a PEFT dir."""
        ...

    def use_adapter(self, name: str) -> None:
        """Select the adapter that samples, scores and trains."""
        ...

    def save(self, path: Path) -> None:
        """Write every adapter (a standard PEFT dir) + optimizer state into path."""
        ...

    def load(self, path: Path) -> None:
        """Restore what save() wrote."""
        ...

    def close(self) -> None:
        """Release what the engine holds outside this process's memory (vLLM's engine process) now: left to garbage
        collection or the interpreter's exit, vLLM's is killed mid-teardown. Twice is harmless; the engine is not
        used after."""
        ...


class ScalarHeads(Engine, Protocol):
    """An engine whose adapters may carry a scalar head Linear(hidden_size, 1) on the final hidden state: a
    reward-model member or a critic (engines.capabilities: scalar_heads)."""

    def create_adapter(self, name: str, init: str | Path | None = None, head: bool = False) -> None:
        """`Engine.create_adapter`; with `head`, a scalar head too (the PEFT dir's, when it saved one)."""
        ...

    def values(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor) -> torch.Tensor:
        """Values [N, T] of the active adapter's scalar head at every position, 0 on padding (a reward model reads
        each sequence's last real token)."""
        ...


class AdapterMixing(Engine, Protocol):
    """An engine whose adapters may act together, or be of another rank than the model config's: gradient
    routing's retain and forget adapters (engines.capabilities: adapter_mixing)."""

    def create_adapter(self, name: str, init: str | Path | None = None, rank: int | None = None) -> None:
        """`Engine.create_adapter`, fresh of rank `rank` (None: the model config's)."""
        ...

    def use_adapters(self, scales: dict[str, float], trained: list[str] | tuple[str, ...] | None = None) -> None:
        """Make several adapters act together on the frozen base: base + sum of scale x LoRA update (scale 0
        leaves an adapter out, exactly as if absent). They sample and score as one model; `forward_backward`
        accumulates gradients into those in `trained` only (default: every acting adapter), and `optim_step`
        steps every acting adapter with one clip of their joint gradient norm (gradient routing's retain +
        forget)."""
        ...

    @property
    def adapter_scales(self) -> dict[str, float]:
        """The acting adapters and their scales ({active_adapter: 1.0} when one adapter acts)."""
        ...


class GistAttention(Engine, Protocol):
    """An engine that scores rows whose queries attend from a first key on: gist rows, where later turns read the
    earlier ones only through the gist tokens after them (purplerl.data.gist; engines.capabilities:
    gist_attention). Its `forward_backward` trains a TrainBatch with first_key_NT under the same mask."""

    def gist_logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, first_key_NT: torch.Tensor,
                      *, reference: bool = False, temperature: float = 1.0,
                      targets_NT: torch.Tensor | None = None) -> torch.Tensor:
        """`Engine.logprobs` of gist rows: query q attends the keys first_key_NT[n, q] .. q of its row."""
        ...


class GistSampling(Engine, Protocol):
    """An engine that samples from gist prompts in this process (engines.capabilities: gist_sampling): the
    adversarial recipe's defender with dialogue.gist_tokens."""

    def gist_sample(self, prompt_tokens: list[list[int]], first_keys: list[list[int]], n: int,
                    sampling: SamplingParams) -> list[list[Completion]]:
        """`Engine.sample` of gist prompts: prompt token q attends the keys first_keys[b][q] .. q, the completion
        those from its prompt's last first key on (the last gist block), so it decodes over K keys of history."""
        ...
