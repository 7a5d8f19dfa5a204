"""The local engine's trainer: a PEFT LoRA model (or, full-parameter, the model itself) held in this process, with
its named adapters, scoring, gradients, optimizer steps and checkpoints. The local and vLLM engines hold one each.

The PEFT model serves as the LoRA policy (adapter on) and as the frozen base for KL (adapter disabled, never a
second copy). Scoring (`logprobs`, `forward_backward`) runs through purplerl.engines.local_scoring: the decoder
once, the LM head only at the scored positions. An adapter may carry a scalar head (purplerl.engines.adapters):
`values` reads it at every position, and losses that consume "values" train it with its adapter.

With `model.finetune: full` there is no PEFT wrapping: every weight of the model trains (fp32 masters and AdamW
as for an adapter), and the KL reference is the initial model, loaded again from `model.name` the first time a
reference logprob is asked for (SFT never asks, so never pays for that copy; a resumed run gets the initial
model too, not the checkpoint it loaded).
"""

from __future__ import annotations

import contextlib
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

from purplerl.algorithms.losses import aggregate_loss
from purplerl.algorithms.packing import layout_of, row_layout, unpack, unpack_inputs
from purplerl.algorithms.registry import CustomLoss, Loss
from purplerl.config import ModelConfig
from purplerl.engines.adapters import AdapterSet, FullWeights, lora_config
from purplerl.engines.base import EngineSettings, check_batch
from purplerl.engines.fused_lora import install_fused_lora
from purplerl.engines.host_memory import release_free_memory
from purplerl.engines.loading import (
    load_causal_lm,
    load_peft_adapter,
    load_tokenizer,
    read_adapter_config,
    require_quantizable,
    resolve_device,
    resolve_dtype,
    stop_token_ids,
)
from purplerl.engines.local_scoring import autocast, final_hidden, full_logits, micro_batches, target_logprobs
from purplerl.engines.local_state import OPTIMIZER_FILE, RNG_FILE, load_state, save_state
from purplerl.errors import ExperimentError, UserError
from purplerl.types import AdamParams, TrainBatch

__all__ = ["OPTIMIZER_FILE", "RNG_FILE", "LocalTrainer", "load_base"]


def load_base(cfg: ModelConfig, settings: EngineSettings):
    """(tokenizer, base causal LM) of `cfg`, the base frozen and not yet wrapped by PEFT: a caller that needs a
    plain copy of it (the merged sampler) takes one before handing it to `LocalTrainer`."""
    full = cfg.finetune == "full"
    if cfg.init_adapter:
        if full:
            raise UserError("model.init_adapter is a LoRA adapter, model.finetune 'full' trains the model "
                            "itself: start from a model dir with --model, or use --model.finetune lora")
        read_adapter_config(cfg.init_adapter, "init_adapter")  # a malformed one fails before the model loads
    require_quantizable(cfg.quantize)  # before the tokenizer too
    tokenizer = load_tokenizer(cfg.name, cfg.revision)
    # full: loaded in fp32 so the fp32 masters start from the exact weights, then cast to the compute dtype
    return tokenizer, load_causal_lm(cfg.name, cfg.revision, "float32" if full else cfg.dtype, cfg.device,
                                     cfg.quantize)


class LocalTrainer:
    """Tinker-shaped training primitives (all but `sample`) over a model held in this process."""

    def __init__(self, cfg: ModelConfig, tokenizer, base, seed: int = 0,
                 settings: EngineSettings | None = None) -> None:
        self.cfg, self.seed = cfg, seed
        self.settings = settings or EngineSettings()
        self.device = resolve_device(cfg.device)
        self.autocast_bf16 = cfg.dtype == "autocast_bf16"  # float32 weights, bfloat16 matmuls under autocast
        self.full = cfg.finetune == "full"
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, base)
        self.causal_lm = base  # PEFT injects its LoRA layers into this very model
        self._reference_lm = None  # full: the initial model, loaded on first use
        # final-logit transforms (softcapping, scaling) live in the model's forward: score through it then
        self.head_only = not any(getattr(base.config, k, None) for k in ("final_logit_softcapping", "logit_scale"))
        self.version = 0  # counts changes of what the active adapter computes: a sampler holding a copy re-reads
        compute_dtype = resolve_dtype(cfg.dtype, self.device)
        if self.full:
            torch.manual_seed(self.seed)  # the global RNG drives dropout, if the model has any
            self.model = base
            self._adapters = FullWeights(self.model, compute_dtype, self.settings.optimizer)
        else:
            self._wrap_lora(base, compute_dtype)
        # the compiled decoder shares the policy's weights and adapters; the sampler decodes with its own module
        self._decoder = torch.compile(base.get_decoder(), dynamic=True) if self.settings.compiled else None

    def _wrap_lora(self, base, compute_dtype: torch.dtype) -> None:
        from peft import get_peft_model

        cfg = self.cfg
        torch.manual_seed(self.seed)  # LoRA A matrices are drawn from torch's default generator by PEFT
        if cfg.init_adapter:
            self.model = load_peft_adapter(base, cfg.init_adapter)
        else:
            try:
                self.model = get_peft_model(base, lora_config(cfg))
            except ValueError as err:
                raise UserError(f"cannot apply LoRA: {str(err).splitlines()[0]}") from None
        self.model.to(self.device)
        if self.settings.fused_lora:
            install_fused_lora(self.model)
        # Mixed precision: over a bf16 base the adapters run in bf16 too (PEFT would otherwise cast every
        # activation to fp32 and back around each of the ~200 adapted layers), while each adapter's optimizer
        # updates fp32 master copies; gradients are accumulated into the masters after every micro-batch.
        self._adapters = AdapterSet(self.model, compute_dtype, self.settings.optimizer)
        self._adapters.register("default")

    def touch(self) -> None:
        """Mark the active adapter as changed: a sampler's copy of it is stale."""
        self.version += 1

    def autocast(self):
        return autocast(self.device, self.autocast_bf16)

    # ----- named adapters (one frozen base; the reference is the base with every adapter off) -------

    @property
    def adapters(self) -> list[str]:
        return self._adapters.names

    @property
    def active_adapter(self) -> str:
        return self._adapters.active

    def create_adapter(self, name: str, init: str | Path | None = None, head: bool = False,
                       rank: int | None = None) -> None:
        """Add a LoRA adapter `name` on the same base: fresh (LoRA B = 0, so it starts as the base; shaped by the
        model config, of its rank or `rank`) or loaded from a PEFT dir `init`; with `head`, a scalar head too
        (init's, when it saved one). It does not become active: see `use_adapter`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + zlib.crc32(name.encode()))  # its own A matrices and head; global RNG kept
            self._adapters.create(name, self.cfg, init, head=head, rank=rank)
        if self.settings.fused_lora and not self.full:
            install_fused_lora(self.model)

    def use_adapter(self, name: str) -> None:
        """Make `name` the adapter that samples, scores and trains."""
        self._adapters.activate(name)
        self.touch()

    def use_adapters(self, scales: dict[str, float], trained: list[str] | tuple[str, ...] | None = None) -> None:
        """Make several adapters act together, each LoRA update times its scale (0: left out, as if absent): they
        sample and score as one; `forward_backward` accumulates gradients into those in `trained` (default: every
        acting adapter) and `optim_step` steps every acting adapter."""
        self._adapters.use(scales, trained)
        self.touch()

    @property
    def adapter_scales(self) -> dict[str, float]:
        """The acting adapters and their scales ({active_adapter: 1.0} for one adapter)."""
        return dict(self._adapters.mix)

    @property
    def trained_adapters(self) -> tuple[str, ...]:
        return self._adapters.trained

    @property
    def heads(self) -> list[str]:
        """Names of the adapters that carry a scalar head."""
        return self._adapters.heads

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        """The acting adapters' weights (the active adapter's alone unless several act together)."""
        return [p for adapter in self._adapters.acting for p in adapter.params]

    @property
    def master(self) -> list[torch.Tensor]:
        """Their fp32 masters, in the same order."""
        return [m for adapter in self._adapters.acting for m in adapter.master]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._adapters.current.optimizer

    def fp32_adapter(self):
        """Point every adapter's weights at its fp32 masters (for exact save/load/export), then back."""
        return self._adapters.fp32_weights()

    # ----- scoring ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def scorer(self, reference: bool):
        """The causal LM that scores: the policy, or the frozen reference (LoRA: the base with every adapter
        off; full: the initial model, loaded again from model.name on first use)."""
        if not reference:
            yield self.causal_lm
        elif not self.full:
            with self.model.disable_adapter():
                yield self.causal_lm
        else:
            if self._reference_lm is None:
                c = self.cfg
                self._reference_lm = load_causal_lm(c.name, c.revision, c.dtype, c.device)
            yield self._reference_lm

    def _target_logprobs(self, ids: torch.Tensor, attn: torch.Tensor, targets: torch.Tensor, temperature: float,
                         causal_lm=None, layout: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """`layout`: the rows' layout tensors (position_ids_NT of packed rows, first_key_NT of gist rows)."""
        policy = causal_lm is None or causal_lm is self.causal_lm
        return target_logprobs(self.causal_lm if causal_lm is None else causal_lm, ids, attn, targets, temperature,
                               head_only=self.head_only, bf16=self.autocast_bf16,
                               decoder=self._decoder if policy else None, **(layout or {}))

    def micro_batches(self, attention_mask_NT: torch.Tensor) -> list[torch.Tensor]:
        return micro_batches(attention_mask_NT, self.settings.micro_batch_size, self.settings.micro_batch_tokens)

    @torch.no_grad()
    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, *,
                 reference: bool = False, temperature: float = 1.0,
                 targets_NT: torch.Tensor | None = None, position_ids_NT: torch.Tensor | None = None,
                 first_key_NT: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token logprobs [N, T]; only the `targets_NT` positions are computed (default: every token
        after its sequence's first), the rest are 0. Packed rows come with their `position_ids_NT`, gist rows with
        their `first_key_NT` (the gist_attention capability)."""
        self.model.eval()
        ids, attn = input_ids_NT.to(self.device), attention_mask_NT.to(self.device)
        if targets_NT is None:
            targets_NT = F.pad(attention_mask_NT[:, 1:], (1, 0))
            if position_ids_NT is not None:  # a sequence's first token is not scored by the one before it
                targets_NT = targets_NT * (position_ids_NT != 0)
        targets = targets_NT.to(self.device)
        layout = row_layout(position_ids_NT, first_key_NT, self.device)
        out = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)
        for rows in self.micro_batches(attn):
            width = int(attn[rows].sum(-1).max())  # right padding: trim unused columns
            part = {name: t[rows, :width] for name, t in layout.items()}
            with self.scorer(reference) as causal_lm:
                out[rows, :width] = self._target_logprobs(ids[rows, :width], attn[rows, :width],
                                                          targets[rows, :width], temperature, causal_lm, part)
        out = out.cpu()
        if not torch.isfinite(out).all():
            raise ExperimentError(f"non-finite {'reference' if reference else 'policy'} logprobs")
        return out

    def _values(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor,
                layout: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """fp32 values [N, T] of the active adapter's head (0 on padding)."""
        head = self._adapters.current.head
        if head is None:
            raise UserError(f"adapter '{self.active_adapter}' has no scalar head (create_adapter(name, head=True) "
                            f"makes one; adapters with a head: {', '.join(self.heads) or 'none'})")
        hidden_NTH = final_hidden(self.causal_lm, input_ids_NT, attention_mask_NT, self.autocast_bf16,
                                  self._decoder, **(layout or {}))
        with self.autocast():
            values_NT = head(hidden_NTH.to(head.weight.dtype))[..., 0]
        return values_NT.float() * attention_mask_NT

    @torch.no_grad()
    def values(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor,
               position_ids_NT: torch.Tensor | None = None, first_key_NT: torch.Tensor | None = None) -> torch.Tensor:
        """Values [N, T] of the active adapter's scalar head at every position (0 on padding)."""
        self.model.eval()
        ids, attn = input_ids_NT.to(self.device), attention_mask_NT.to(self.device)
        layout = row_layout(position_ids_NT, first_key_NT, self.device)
        out = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)
        for rows in self.micro_batches(attn):
            width = int(attn[rows].sum(-1).max())  # right padding: trim unused columns
            part = {name: t[rows, :width] for name, t in layout.items()}
            out[rows, :width] = self._values(ids[rows, :width], attn[rows, :width], part)
        out = out.cpu()
        if not torch.isfinite(out).all():
            raise ExperimentError(f"non-finite values from the head of adapter '{self.active_adapter}'")
        return out

    # ----- training ---------------------------------------------------------------------------------

    def _parts(self, batch: TrainBatch):
        """(rows, width, inputs) per micro-batch: per-token tensors cut to the rows, trimmed of padding (pairs and
        per-row labels couple rows: only the whole-batch losses read them); the heap trimmed between passes."""
        tensors = {"input_ids_NT": batch.input_ids_NT, "attention_mask_NT": batch.attention_mask_NT,
                   **{k: v for k, v in batch.inputs().items() if k.endswith("_NT")}}
        tensors.update(row_layout(batch.position_ids_NT, batch.first_key_NT, None))
        for i, rows in enumerate(self.micro_batches(batch.attention_mask_NT)):
            if i:  # between passes only: the next phase reuses the heap the step's last pass frees
                release_free_memory()
            width = int(batch.attention_mask_NT[rows].sum(-1).max())  # right padding: trim unused columns
            yield rows, width, {name: t[rows, :width].to(self.device) for name, t in tensors.items()}

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        """Accumulate the gradient of a registered loss on the batch into the active adapter."""
        definition = loss.definition
        check_batch(batch, loss)
        if definition.consumes in ("sequences", "values"):  # whole-batch losses
            return self._linearized_backward(batch, lambda lp, inputs: definition.fn(lp, inputs, loss.params),
                                             loss.temperature, head=definition.consumes == "values",
                                             scale=loss.scale)
        self.model.train()
        generator = torch.Generator(device=self.device).manual_seed(loss.seed)
        totals: dict[str, float] = {}
        normalizer = batch.num_loss_tokens
        for rows, _, part in self._parts(batch):
            ids, attn, mask = part["input_ids_NT"], part["attention_mask_NT"], part["loss_mask_NT"]
            layout, positions = layout_of(part), part.get("position_ids_NT")
            if definition.consumes == "logits":
                # per-token tensors start at position 1, where the logits of position 0 predict the first target
                shifted = {k: v[:, 1:] for k, v in part.items()}
                logits = full_logits(self.causal_lm, ids, attn, self.autocast_bf16, **layout)
                loss_nt, metrics = definition.fn(logits, shifted, loss.params, targets_NT=ids[:, 1:],
                                                 temperature=loss.temperature, generator=generator)
                loss_NT = F.pad(loss_nt, (1, 0))
            else:
                logp_NT = self._target_logprobs(ids, attn, mask, loss.temperature, layout=layout)
                loss_NT, metrics = definition.fn(logp_NT, part, loss.params)
            if positions is not None:  # the per-sequence aggregations read one sequence per row
                loss_NT, mask = unpack(loss_NT, positions, attn), unpack(mask, positions, attn)
            total = loss.scale * aggregate_loss(loss_NT, mask, loss.aggregation, total_tokens=normalizer,
                                                total_sequences=batch.num_sequences, length_norm=loss.length_norm)
            if not torch.isfinite(total):
                raise ExperimentError(f"non-finite loss in the micro-batch with sequence {int(rows[0])}")
            total.backward()
            self._adapters.accumulate_master_grads()
            weight = float(mask.sum()) / normalizer
            totals["loss"] = totals.get("loss", 0.0) + float(total.detach())
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + weight * float(value)
        totals["tokens"] = float(normalizer)
        return totals

    def forward_backward_custom(self, batch: TrainBatch, loss: CustomLoss) -> dict[str, float]:
        """Accumulate the gradient of a user-supplied loss of the batch's logprobs (Tinker's
        forward_backward_custom)."""
        check_batch(batch)
        return self._linearized_backward(batch, loss.fn, loss.temperature)

    def _linearized_backward(self, batch: TrainBatch, fn, temperature: float, head: bool = False,
                             scale: float = 1.0) -> dict[str, float]:
        """The gradient of fn(logprobs of the whole batch) in one micro-batch of memory: logprobs without
        gradient, the loss and dloss/dlogprobs from them, then per micro-batch the backward pass of
        sum(dloss/dlogprobs * logprobs), whose gradient is exactly the chain rule's. (Exact when the forward
        pass is deterministic: LoRA dropout would draw other masks in the two passes.) With `head`, the same with
        the values of the active adapter's scalar head in place of the logprobs (a "values" loss). The loss is
        multiplied by `scale` (`Loss.scale`). A packed batch is scored in its packed rows and handed to `fn` one
        sequence per row (purplerl.algorithms.packing.unpack), as `fn` would see the same batch unpacked."""
        targets_NT = (batch.loss_mask_NT != 0).long()
        ids_NT, attn_NT, positions_NT = batch.input_ids_NT, batch.attention_mask_NT, batch.position_ids_NT
        if head:
            logp_NT = self.values(ids_NT, attn_NT, positions_NT, batch.first_key_NT).requires_grad_(True)
        else:
            logp_NT = self.logprobs(ids_NT, attn_NT, temperature=temperature, targets_NT=targets_NT,
                                    position_ids_NT=positions_NT, first_key_NT=batch.first_key_NT
                                    ).requires_grad_(True)
        if positions_NT is None:
            out = fn(logp_NT, batch.inputs())
        else:
            out = fn(unpack(logp_NT, positions_NT, attn_NT), unpack_inputs(batch.inputs(), positions_NT, attn_NT))
        value, metrics = (out, {}) if isinstance(out, torch.Tensor) else out  # the metrics dict is optional
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or not torch.isfinite(value):
            raise ExperimentError(f"the loss must be one finite number, got {value!r}"[:200])
        value = value * scale
        value.backward()
        if logp_NT.grad is None:
            raise ExperimentError(f"the loss does not depend on the {'values' if head else 'logprobs'} it was given")
        grad_NT = logp_NT.grad
        self.model.train()
        for rows, width, part in self._parts(batch):
            ids, attn, layout = part["input_ids_NT"], part["attention_mask_NT"], layout_of(part)
            lp = self._values(ids, attn, layout) if head else self._target_logprobs(
                ids, attn, targets_NT[rows, :width].to(self.device), temperature, layout=layout)
            (lp * grad_NT[rows, :width].to(self.device)).sum().backward()
            self._adapters.accumulate_master_grads()
        return {"loss": float(value.detach()), **{k: float(v) for k, v in metrics.items()},
                "tokens": float(batch.num_loss_tokens)}

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """One AdamW step of every acting adapter, their gradients clipped together (one norm over all of them, as
        one optimizer over their union would); an adapter's weights without a gradient are left as they are."""
        acting = self._adapters.acting
        for adapter in acting:
            for group in adapter.optimizer.param_groups:
                group.update(lr=adam.lr, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay)
        max_norm = adam.max_grad_norm if adam.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.master, max_norm)
        if not torch.isfinite(grad_norm):
            raise ExperimentError(f"non-finite gradient norm ({float(grad_norm)})")
        for adapter in acting:
            adapter.optimizer.step()
            adapter.optimizer.zero_grad(set_to_none=True)
            if adapter.master is not adapter.params:
                with torch.no_grad():
                    for p, m in zip(adapter.params, adapter.master, strict=True):
                        p.copy_(m)
        self.touch()
        return {"grad_norm": float(grad_norm), "lr": adam.lr}

    # ----- state (purplerl.engines.local_state) ------------------------------------------------------

    def save(self, path: Path) -> None:
        """Every adapter, each adapter's optimizer state, which adapters act and the global RNG (see save_state)."""
        save_state(self, Path(path))

    def load(self, path: Path) -> None:
        """Restore what save() wrote; adapters the checkpoint has and this engine lacks are created."""
        load_state(self, Path(path))
