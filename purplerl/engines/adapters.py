"""Named LoRA adapters on one frozen PEFT base: each with its own trainable weights, fp32 masters and optimizer.

One base carries the policy, or attacker + defender, or retain + forget adapters; only the active adapter
samples, scores and trains, and `disable_adapter()` gives the base itself (the KL reference) for all of them.
Full-parameter fine-tuning (`FullWeights`) is the same machinery with one adapter, "default", whose weights
are every parameter of the model.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from purplerl.config import ModelConfig
from purplerl.errors import UserError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def lora_config(cfg: ModelConfig):
    from peft import LoraConfig

    targets = "all-linear" if cfg.lora_targets == "all-linear" else \
        [s.strip() for s in cfg.lora_targets.split(",") if s.strip()]
    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM")


def adapter_weights_file(checkpoint: Path, name: str) -> Path:
    """Where PEFT's save_pretrained puts an adapter's weights: `default` at the top, others in a subdir."""
    return Path(checkpoint) / ("" if name == "default" else name) / "adapter_model.safetensors"


@dataclass
class Adapter:
    params: list[torch.nn.Parameter]  # the adapter's weights, in the compute dtype
    master: list[torch.Tensor]  # fp32 copies the optimizer updates (the params themselves when fp32)
    optimizer: torch.optim.Optimizer

    def accumulate_master_grads(self) -> None:
        if self.master is self.params:
            return
        for p, m in zip(self.params, self.master, strict=True):
            if p.grad is not None:
                m.grad = p.grad.float() if m.grad is None else m.grad.add_(p.grad.float())
                p.grad = None


def new_adapter(params: list[torch.nn.Parameter], compute_dtype: torch.dtype) -> Adapter:
    """Trainable weights in the compute dtype, with fp32 masters (the weights themselves in fp32) and AdamW."""
    if compute_dtype == torch.float32:
        master = params
    else:
        master = [p.detach().float().clone() for p in params]
        for p in params:
            p.data = p.data.to(compute_dtype)
    return Adapter(params, master, torch.optim.AdamW(master, lr=1e-4))


class AdapterSet:
    """The adapters of one PEFT model, by name, and which one is active."""

    def __init__(self, model, compute_dtype: torch.dtype) -> None:
        self.model = model
        self.compute_dtype = compute_dtype
        self._adapters: dict[str, Adapter] = {}
        self.active = "default"

    @property
    def names(self) -> list[str]:
        return list(self._adapters)

    @property
    def current(self) -> Adapter:
        return self._adapters[self.active]

    def get(self, name: str) -> Adapter:
        if name not in self._adapters:
            raise UserError(f"no adapter named '{name}' (adapters: {', '.join(self._adapters)})")
        return self._adapters[name]

    def _params_of(self, name: str) -> list[torch.nn.Parameter]:
        marker = f".{name}."
        return [p for n, p in self.model.named_parameters() if "lora_" in n and marker in n]

    def register(self, name: str) -> None:
        """Track the adapter `name` that PEFT already holds: its weights, masters and optimizer."""
        params = self._params_of(name)
        if not params:
            raise UserError(f"the LoRA adapter '{name}' has no trainable parameters")
        self._adapters[name] = new_adapter(params, self.compute_dtype)
        self.activate(self.active if self.active in self._adapters else name)

    def create(self, name: str, cfg: ModelConfig, init: str | Path | None = None) -> None:
        if not _NAME.match(name):
            raise UserError(f"adapter name {name!r} must be a plain identifier (letters, digits, _)")
        if name in self._adapters:
            raise UserError(f"an adapter named '{name}' already exists")
        if init is not None:
            from purplerl.engines.loading import read_adapter_config

            read_adapter_config(init, f"adapter '{name}'")
            self.model.load_adapter(str(init), adapter_name=name, is_trainable=True)
        else:
            self.model.add_adapter(name, lora_config(cfg))
        self.register(name)

    def activate(self, name: str) -> None:
        self.get(name)
        self.model.set_adapter(name)
        self.active = name
        for adapter_name, adapter in self._adapters.items():  # only the active adapter is trained
            for p in adapter.params:
                p.requires_grad_(adapter_name == name)

    @contextlib.contextmanager
    def fp32_weights(self):
        """Point every adapter's weights at its fp32 masters (exact save/load), then back to the compute dtype."""
        mixed = [a for a in self._adapters.values() if a.master is not a.params]
        for adapter in mixed:
            for p, m in zip(adapter.params, adapter.master, strict=True):
                p.data = m.data
        try:
            yield
        finally:
            for adapter in mixed:
                for p in adapter.params:
                    p.data = p.data.to(self.compute_dtype)


FULL_ONLY_DEFAULT = "named adapters need LoRA: with model.finetune 'full' the model's own weights are the one " \
    "policy, 'default'"


class FullWeights(AdapterSet):
    """Full-parameter fine-tuning: one adapter, "default", whose weights are every parameter of the model (a
    tied input embedding and LM head are one parameter, trained once), with fp32 masters and AdamW as above."""

    def __init__(self, model: torch.nn.Module, compute_dtype: torch.dtype) -> None:
        super().__init__(model, compute_dtype)
        params = list(model.parameters())  # deduplicated: tied weights appear once
        for p in params:
            p.requires_grad_(True)
        self._adapters["default"] = new_adapter(params, compute_dtype)

    def get(self, name: str) -> Adapter:
        if name != "default":
            raise UserError(f"no adapter '{name}': {FULL_ONLY_DEFAULT}")
        return super().get(name)

    def register(self, name: str) -> None:
        raise UserError(f"cannot add adapter '{name}': {FULL_ONLY_DEFAULT}")

    def create(self, name: str, cfg: ModelConfig, init: str | Path | None = None) -> None:
        self.register(name)

    def activate(self, name: str) -> None:
        self.get(name)
