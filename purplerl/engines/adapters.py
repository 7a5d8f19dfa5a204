"""Named LoRA adapters on one frozen PEFT base: each with its own trainable weights, fp32 masters and optimizer.

One base carries the policy, or attacker + defender, or retain + forget adapters; the active adapter samples,
scores and trains, and `disable_adapter()` gives the base itself (the KL reference) for all of them. Several
adapters may act together (`use`, gradient routing's retain + forget): the model then computes
base(x) + sum over them of scale x LoRA update, each scale set through PEFT's per-layer `scaling` (alpha / r x
scale), and only the adapters named as trained take gradients.
Full-parameter fine-tuning (`FullWeights`) is the same machinery with one adapter, "default", whose weights
are every parameter of the model.

An adapter may carry a scalar head, Linear(hidden_size, 1) on the final hidden state at every position: the
reward model's score, or a critic's value (each member of a reward-model ensemble, or the critic, is its own
adapter with its own head over the one base). The head is one more part of the adapter's weights: trained by its
optimizer, saved beside its LoRA weights (HEAD_FILE in the adapter's dir) and loaded with them.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from purplerl.config import ModelConfig
from purplerl.errors import UserError, first_line

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
HEAD_FILE = "scalar_head.safetensors"  # an adapter's scalar head, in its dir: {"weight": [1, H], "bias": [1]}, fp32


def lora_config(cfg: ModelConfig, rank: int | None = None):
    """The PEFT LoraConfig of `cfg` (its rank, or `rank`)."""
    from peft import LoraConfig

    targets = "all-linear" if cfg.lora_targets == "all-linear" else \
        [s.strip() for s in cfg.lora_targets.split(",") if s.strip()]
    return LoraConfig(r=cfg.lora_rank if rank is None else rank, lora_alpha=cfg.lora_alpha,
                      lora_dropout=cfg.lora_dropout, target_modules=targets, task_type="CAUSAL_LM")


def adapter_dir(checkpoint: Path, name: str) -> Path:
    """Where PEFT's save_pretrained puts an adapter: `default` at the top, others in a subdir."""
    return Path(checkpoint) / ("" if name == "default" else name)


def adapter_weights_file(checkpoint: Path, name: str) -> Path:
    return adapter_dir(checkpoint, name) / "adapter_model.safetensors"


@dataclass
class Adapter:
    params: list[torch.nn.Parameter]  # the adapter's weights, in the compute dtype
    master: list[torch.Tensor]  # fp32 copies the optimizer updates (the params themselves when fp32)
    optimizer: torch.optim.Optimizer
    head: torch.nn.Linear | None = None  # its scalar head; its weight and bias are the last two of `params`

    def accumulate_master_grads(self) -> None:
        if self.master is self.params:
            return
        for p, m in zip(self.params, self.master, strict=True):
            if p.grad is not None:
                m.grad = p.grad.float() if m.grad is None else m.grad.add_(p.grad.float())
                p.grad = None


def make_optimizer(name: str, master: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer of one adapter's fp32 masters (its hyperparameters are set at every step: optim_step).
    'adamw_8bit': bitsandbytes' AdamW with 8-bit blockwise-quantized moments (Dettmers et al. 2022, "8-bit
    Optimizers via Block-wise Quantization"); it keeps tensors under 4096 elements (biases, a scalar head) in 32
    bits."""
    if name == "adamw":
        return torch.optim.AdamW(master, lr=1e-4)
    if name == "adamw_8bit":
        from purplerl.engines.loading import import_bitsandbytes

        try:
            bitsandbytes = import_bitsandbytes()
        except ImportError as err:
            raise UserError(f"training.optimizer adamw_8bit needs bitsandbytes ({err})") from None
        return bitsandbytes.optim.AdamW8bit(master, lr=1e-4)
    raise UserError(f"unknown optimizer '{name}' (known: adamw, adamw_8bit)")


def new_adapter(params: list[torch.nn.Parameter], compute_dtype: torch.dtype,
                head: torch.nn.Linear | None = None, optimizer: str = "adamw") -> Adapter:
    """Trainable weights in the compute dtype, with fp32 masters (the weights themselves in fp32) and their
    optimizer (`make_optimizer`)."""
    params = params + ([] if head is None else [head.weight, head.bias])
    if compute_dtype == torch.float32:
        master = params
    else:
        master = [p.detach().float().clone() for p in params]
        for p in params:
            p.data = p.data.to(compute_dtype)
    return Adapter(params, master, make_optimizer(optimizer, master), head)


def new_head(model: torch.nn.Module) -> torch.nn.Linear:
    """A fresh fp32 scalar head on the model's device, drawn from the global RNG: weight ~ N(0, initializer_range)
    as Hugging Face initializes a sequence classifier's score layer (0.02 when the config has none), bias 0."""
    config = model.config
    head = torch.nn.Linear(config.hidden_size, 1, device=next(model.parameters()).device, dtype=torch.float32)
    with torch.no_grad():
        head.weight.normal_(0.0, getattr(config, "initializer_range", 0.02))
        head.bias.zero_()
    return head


def head_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of the scalar head saved at `path`, read from its header (no weights loaded)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118 -- no __iter__
    except (SafetensorError, OSError) as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None


def read_head(head: torch.nn.Linear, path: Path) -> None:
    """Copy the head saved at `path` into `head` (its fp32 weights); UserError for a missing, unreadable or
    misshapen file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise UserError(f"{path.parent} holds no scalar head ({HEAD_FILE})")
    try:
        state = load_file(str(path), device=str(head.weight.device))
    except (SafetensorError, OSError) as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    if shapes != {"weight": tuple(head.weight.shape), "bias": tuple(head.bias.shape)}:
        raise UserError(f"the scalar head in {path} does not match the model: tensors {shapes}, expected weight "
                        f"{tuple(head.weight.shape)} and bias {tuple(head.bias.shape)}")
    with torch.no_grad():
        head.weight.copy_(state["weight"])
        head.bias.copy_(state["bias"])


def write_head(head: torch.nn.Linear, path: Path) -> None:
    """Save the head's weights as fp32 safetensors, written by Python (a full disk raises OSError)."""
    from safetensors.torch import save

    data = save({"weight": head.weight.detach().float().contiguous().cpu(),
                 "bias": head.bias.detach().float().contiguous().cpu()})
    with open(path, "wb") as f:
        f.write(data)


class AdapterSet:
    """The adapters of one PEFT model, by name, and which one is active."""

    def __init__(self, model, compute_dtype: torch.dtype, optimizer: str = "adamw") -> None:
        self.model = model
        self.compute_dtype = compute_dtype
        self.optimizer = optimizer  # each adapter's optimizer (make_optimizer)
        self._adapters: dict[str, Adapter] = {}
        self.active = "default"  # the first adapter of the mix: the one a single-adapter caller sees
        self.mix: dict[str, float] = {"default": 1.0}  # the adapters acting now, each with its scale
        self.trained: tuple[str, ...] = ("default",)  # those of the mix that take gradients

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

    @property
    def heads(self) -> list[str]:
        return [name for name, adapter in self._adapters.items() if adapter.head is not None]

    def register(self, name: str, head: torch.nn.Linear | None = None) -> None:
        """Track the adapter `name` that PEFT already holds: its weights (and head), masters and optimizer."""
        params = self._params_of(name)
        if not params:
            raise UserError(f"the LoRA adapter '{name}' has no trainable parameters")
        self._adapters[name] = new_adapter(params, self.compute_dtype, head, self.optimizer)
        if all(n in self._adapters for n in self.mix):  # the mix acting stays (the new adapter at rest)
            self.use(self.mix, self.trained)
        else:
            self.activate(name)

    def create(self, name: str, cfg: ModelConfig, init: str | Path | None = None, head: bool = False,
               rank: int | None = None) -> None:
        """Add the adapter `name`: fresh (of `cfg`'s rank, or `rank`), or loaded from the PEFT dir `init`; with
        `head`, a scalar head too (the one saved in `init` when it holds one, else a fresh one)."""
        if not _NAME.match(name):
            raise UserError(f"adapter name {name!r} must be a plain identifier (letters, digits, _)")
        if name in self._adapters:
            raise UserError(f"an adapter named '{name}' already exists")
        if init is not None and rank is not None:
            raise UserError(f"adapter '{name}' is loaded from {init}, which fixes its rank: give no rank")
        if rank is not None and not 1 <= rank <= 1024:
            raise UserError(f"adapter '{name}': LoRA rank {rank} is outside 1..1024")
        if init is not None:
            from purplerl.engines.loading import read_adapter_config

            read_adapter_config(init, f"adapter '{name}'")
            self.model.load_adapter(str(init), adapter_name=name, is_trainable=True)
        else:
            self.model.add_adapter(name, lora_config(cfg, rank))
        scalar = new_head(self.model) if head else None  # drawn after the LoRA weights: they match a headless one's
        if scalar is not None and init is not None and (Path(init) / HEAD_FILE).is_file():
            try:
                read_head(scalar, Path(init) / HEAD_FILE)
            except UserError:
                self.model.delete_adapter(name)
                raise
        self.register(name, scalar)

    def activate(self, name: str) -> None:
        self.use({name: 1.0})

    def use(self, scales: Mapping[str, float], trained: Collection[str] | None = None) -> None:
        """Make the adapters of `scales` with a nonzero scale act together, each LoRA update times its scale (an
        adapter at 0 is left out: exactly as if it were absent); `trained` (default: every acting adapter) take
        gradients, the others none."""
        for name in scales:
            self.get(name)
        mix = {name: float(scale) for name, scale in scales.items() if scale != 0}
        if not mix or not all(math.isfinite(v) for v in mix.values()):
            raise UserError(f"adapter scales {dict(scales)}: give at least one adapter a finite nonzero scale "
                            "(the base alone is the reference, not a policy)")
        trained = tuple(mix) if trained is None else tuple(trained)
        idle = [name for name in trained if name not in mix]
        if idle:
            raise UserError(f"adapter '{idle[0]}' is trained but does not act (adapters acting: {', '.join(mix)})")
        self.model.set_adapter(next(iter(mix)))
        if len(mix) > 1:  # PeftModel takes one name; its LoRA model takes several
            self.model.base_model.set_adapter(list(mix))
        self._set_scales(mix)
        self.active, self.mix, self.trained = next(iter(mix)), mix, trained
        for adapter_name, adapter in self._adapters.items():
            for p in adapter.params:
                p.requires_grad_(adapter_name in trained)

    def _set_scales(self, mix: Mapping[str, float]) -> None:
        """Every LoRA layer's scaling of each adapter: alpha / r x its scale in `mix` (1 outside it)."""
        from peft.tuners.lora import LoraLayer

        for module in self.model.modules():
            if isinstance(module, LoraLayer):
                for name in self._adapters:
                    module.set_scale(name, mix.get(name, 1.0))

    @property
    def acting(self) -> list[Adapter]:
        """The adapters of the mix."""
        return [self._adapters[name] for name in self.mix]

    def accumulate_master_grads(self) -> None:
        """Move the trained adapters' compute-dtype gradients into their fp32 masters."""
        for name in self.trained:
            self._adapters[name].accumulate_master_grads()

    def load_weights(self, name: str, weights: Path) -> None:
        """Load an adapter's LoRA weights (a PEFT adapter_model.safetensors) and, when it has a head, the head saved
        beside them, into its fp32 masters (the compute-dtype copies follow)."""
        from peft import set_peft_model_state_dict
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if not weights.is_file():
            raise UserError(f"{weights.parent} holds no adapter_model.safetensors")
        try:
            state = load_file(str(weights), device=str(next(self.model.parameters()).device))
        except (SafetensorError, OSError) as err:
            raise UserError(f"cannot read {weights}: {first_line(err)}") from None
        with self.fp32_weights():  # loads in place into the masters; the bf16 copies follow on exit
            try:
                result = set_peft_model_state_dict(self.model, state, adapter_name=name)
            except RuntimeError as err:  # a tensor of another shape: another LoRA rank or model
                raise UserError(f"adapter in {weights.parent} does not match the model: {first_line(err)}") from None
            head, saved = self.get(name).head, (weights.parent / HEAD_FILE).is_file()
            if head is None and saved:
                raise UserError(f"{weights.parent} holds a scalar head, but this engine's adapter '{name}' has none")
            if head is not None:
                read_head(head, weights.parent / HEAD_FILE)  # refuses a checkpoint without one
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise UserError(f"adapter in {weights.parent} does not match the model ({len(unexpected)} unexpected keys)")

    def save_heads(self, path: Path) -> None:
        """Each head beside its adapter's weights in a checkpoint `path` (call inside `fp32_weights`)."""
        for name in self.heads:
            write_head(self._adapters[name].head, adapter_dir(path, name) / HEAD_FILE)

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

    def __init__(self, model: torch.nn.Module, compute_dtype: torch.dtype, optimizer: str = "adamw") -> None:
        super().__init__(model, compute_dtype, optimizer)
        params = list(model.parameters())  # deduplicated: tied weights appear once
        for p in params:
            p.requires_grad_(True)
        self._adapters["default"] = new_adapter(params, compute_dtype, optimizer=optimizer)

    def get(self, name: str) -> Adapter:
        if name != "default":
            raise UserError(f"no adapter '{name}': {FULL_ONLY_DEFAULT}")
        return super().get(name)

    def register(self, name: str, head: torch.nn.Linear | None = None) -> None:
        raise UserError(f"cannot add adapter '{name}': {FULL_ONLY_DEFAULT}")

    def create(self, name: str, cfg: ModelConfig, init: str | Path | None = None, head: bool = False,
               rank: int | None = None) -> None:
        self.register(name)

    def use(self, scales: Mapping[str, float], trained: Collection[str] | None = None) -> None:
        for name in [*scales, *(trained or ())]:
            self.get(name)
        if dict(scales) != {"default": 1.0}:
            raise UserError(f"adapter scales {dict(scales)}: {FULL_ONLY_DEFAULT}")
