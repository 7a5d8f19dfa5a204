"""The local engine: torch + transformers + PEFT in this process, on CPU or CUDA.

It is two parts over one model: a trainer (purplerl.engines.local_training: the PEFT model, its named adapters,
scoring, gradients, optimizer steps, checkpoints) and a sampler (purplerl.engines.local_sampling: the decode loop,
over a merged copy of the model that follows the trainer's active adapter).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from purplerl.algorithms.registry import CustomLoss, Loss
from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.distributed import SINGLE, World
from purplerl.engines.local_sampling import LocalSampler
from purplerl.engines.local_training import LocalTrainer, load_base
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch


class LocalEngine:
    """Tinker-shaped training primitives over a PEFT LoRA model (or, full-parameter, the model itself) held in
    this process: sampling by its sampler, everything else by its trainer."""

    world: World = SINGLE  # one process: data parallel wraps this engine (engines.data_parallel)

    def __init__(self, cfg: ModelConfig, seed: int = 0, settings: EngineSettings | None = None) -> None:
        settings = settings or EngineSettings()
        tokenizer, base = load_base(cfg, settings)
        # the plain copy is taken before PEFT wraps `base` in place; full fine-tuning samples the model itself, and
        # a 4-bit base its PEFT model (merging into 4-bit weights would quantize the update away, and a second
        # copy is the memory QLoRA saves)
        plain = cfg.finetune != "full" and cfg.quantize == "none"
        merged = copy.deepcopy(base) if settings.merged_sampler and plain else None
        self.trainer = LocalTrainer(cfg, tokenizer, base, seed=seed, settings=settings)
        self.sampler = LocalSampler(self.trainer, merged)
        self.tokenizer = tokenizer
        self.sample_metrics: dict[str, float] = {}  # the local sampler has nothing to report

    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        return self.sampler.sample(prompt_tokens, n, sampling)

    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, *,
                 reference: bool = False, temperature: float = 1.0,
                 targets_NT: torch.Tensor | None = None) -> torch.Tensor:
        return self.trainer.logprobs(input_ids_NT, attention_mask_NT, reference=reference, temperature=temperature,
                                     targets_NT=targets_NT)

    def values(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor) -> torch.Tensor:
        return self.trainer.values(input_ids_NT, attention_mask_NT)

    def gist_logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, first_key_NT: torch.Tensor,
                      **kwargs) -> torch.Tensor:
        return self.trainer.logprobs(input_ids_NT, attention_mask_NT, first_key_NT=first_key_NT, **kwargs)

    def gist_sample(self, prompt_tokens: list[list[int]], first_keys: list[list[int]], n: int,
                    sampling: SamplingParams) -> list[list[Completion]]:
        return self.sampler.sample(prompt_tokens, n, sampling, first_keys=first_keys)

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        return self.trainer.forward_backward(batch, loss)

    def forward_backward_custom(self, batch: TrainBatch, loss: CustomLoss) -> dict[str, float]:
        return self.trainer.forward_backward_custom(batch, loss)

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        return self.trainer.optim_step(adam)

    @property
    def adapters(self) -> list[str]:
        return self.trainer.adapters

    @property
    def active_adapter(self) -> str:
        return self.trainer.active_adapter

    @property
    def heads(self) -> list[str]:
        return self.trainer.heads

    def create_adapter(self, name: str, init: str | Path | None = None, head: bool = False,
                       rank: int | None = None) -> None:
        self.trainer.create_adapter(name, init, head=head, rank=rank)

    def use_adapter(self, name: str) -> None:
        self.trainer.use_adapter(name)

    def use_adapters(self, scales: dict[str, float], trained: list[str] | tuple[str, ...] | None = None) -> None:
        self.trainer.use_adapters(scales, trained)

    @property
    def adapter_scales(self) -> dict[str, float]:
        return self.trainer.adapter_scales

    def save(self, path: Path) -> None:
        self.trainer.save(path)

    def load(self, path: Path) -> None:
        self.trainer.load(path)

    def close(self) -> None:
        """Nothing to release: the model, its copy and the optimizer are this process's memory."""

    # ----- the trainer's state, read by tests, benchmarks and the data-parallel wrapper ------------------

    @property
    def cfg(self) -> ModelConfig:
        return self.trainer.cfg

    @property
    def seed(self) -> int:
        return self.trainer.seed

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return self.trainer.trainable

    @property
    def master(self) -> list[torch.Tensor]:
        return self.trainer.master

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.trainer.optimizer

    @property
    def settings(self) -> EngineSettings:
        return self.trainer.settings

    @settings.setter
    def settings(self, settings: EngineSettings) -> None:
        self.trainer.settings = settings

    @property
    def stop_ids(self) -> list[int]:
        return self.trainer.stop_ids

    @stop_ids.setter
    def stop_ids(self, ids: list[int]) -> None:
        self.trainer.stop_ids = ids
