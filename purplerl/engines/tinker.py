"""The Tinker engine: purplerl's training primitives over the Tinker API (the hosted service, or any server that
speaks it, such as SkyRL's), through the official `tinker` SDK (tested with 0.24.1; `pip install tinker`).

What maps, and what does not:
- Batches become `tinker.Datum`s: model_input = tokens 0..L-2, loss_fn_inputs = target_tokens, weights,
  logprobs (sampling), advantages (see engines.tinker_data for the alignment).
- A registered loss whose `LossDef.tinker` names a Tinker built-in for its parameters runs as that built-in:
  cross_entropy, importance_sampling and ppo_clip (as `ppo`, clip bounds in loss_fn_config) without KL and with
  the sampler's logprobs as the ratio's denominator. purplerl's token aggregation is a fixed weight per token,
  sent in the weights (or, for losses linear in the advantages, in the advantages). Every other loss, and those
  configurations, run the way Tinker's `forward_backward_custom` does: a forward pass for the logprobs, the
  registry's own function and its gradient dloss/dlogprobs here, then a surrogate whose gradient is exactly
  sum(dloss/dlogprobs * grad logprobs). The SDK's own forward_backward_custom sends that surrogate as
  cross_entropy weights, which a server that divides by the weights' sum ('sequence_mean', SkyRL) would
  rescale per sequence; this engine sends it as an importance_sampling datum at ratio 1 whose advantages
  carry the gradient, exact under both reductions (`engine.tinker_loss_reduction`).
- Losses that consume logits (the Token Noiser) are refused: the Tinker API returns no logits.
- Temperature: the service scores at temperature 1; any other loss or scoring temperature is refused.
- Entropies: the Tinker API returns none, so `Completion.entropies_C` is NaN; the entropy reward refuses it.
- AdamParams map onto Tinker's (max_grad_norm -> grad_clip_norm). SkyRL's 0.3.0 server drops grad_clip_norm.
- Named adapters are separate LoRA training clients on the same base model (each its own slot on the
  server); the reference is a sampling client of the base. `create_adapter(init=...)` from a local PEFT dir
  is refused: the service cannot load one.
- LoRA: lora_rank maps; lora_alpha is the service's own; lora_targets other than 'all-linear', dropout and
  full fine-tuning are refused.
- save/load: the service's `save_state` / `load_state_with_optimizer`; the checkpoint dir holds only
  `tinker_state.json` (the service's paths), never the API key, which is read from TINKER_API_KEY alone.
- Every call is bounded by `engine.tinker_timeout_s` (the SDK retries for minutes, or forever against a
  server that keeps answering 400 to its bodies); a failure or a timeout stops the run with one line.
"""

from __future__ import annotations

import json
import threading
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.losses import aggregate_loss
from purplerl.algorithms.registry import CustomLoss, Loss
from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines.base import check_batch, check_prompts
from purplerl.engines.distributed import SINGLE, World
from purplerl.engines.loading import load_tokenizer, stop_token_ids
from purplerl.engines.tinker_data import (
    aggregation_coefficients,
    datum_slice,
    loss_metrics,
    reduction_scale,
    refuse_temperature,
    refuse_unmappable,
    row_lengths,
    scatter_targets,
)
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch

STATE_FILE = "tinker_state.json"
SDK_HINT = "pip install tinker"


def import_tinker():
    try:
        import tinker
    except ImportError:
        raise UserError(f"--engine tinker needs the Tinker SDK, which is not installed: {SDK_HINT}") from None
    return tinker


class Remote:
    """Calls into the SDK, each bounded in time and reduced to one line on failure."""

    def __init__(self, tinker, timeout_s: float) -> None:
        import httpx

        self.timeout_s = timeout_s
        self.errors = (tinker.TinkerError, httpx.HTTPError, OSError, ValueError)

    def __call__(self, what: str, fn: Callable[[], Any]) -> Any:
        # A daemon thread: the SDK's own waits (retries, futures) have no overall bound, and a thread left
        # waiting on a dead service must not keep the process alive at exit.
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except self.errors as err:
                box["error"] = err

        worker = threading.Thread(target=run, name=f"tinker-{what}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise ExperimentError(f"tinker service: {what} got no answer within {self.timeout_s:g} s "
                                  "(engine.tinker_timeout_s)")
        if "error" in box:
            raise ExperimentError(f"tinker service: {what} failed: {first_line(box['error'])}")
        return box["value"]


class TinkerEngine:
    """Tinker-shaped training primitives over the Tinker API (see the module docstring for what maps)."""

    world: World = SINGLE  # one process: the service spreads the work

    @property
    def sample_metrics(self) -> dict[str, float]:
        return {}  # the service reports nothing about its sampler

    def __init__(self, cfg: ModelConfig, engine: EngineConfig, seed: int = 0) -> None:
        refuse_unmappable(cfg)
        self.tinker = import_tinker()
        self.cfg, self.engine_cfg, self.seed = cfg, engine, seed
        self.reduction = engine.tinker_loss_reduction
        self.remote = Remote(self.tinker, engine.tinker_timeout_s)
        self.tokenizer = load_tokenizer(cfg.name, cfg.revision)
        self.stop_ids = stop_token_ids(self.tokenizer, None)
        self.service = self.remote("connect", lambda: self.tinker.ServiceClient(
            base_url=engine.tinker_url, max_retries=engine.tinker_retries, timeout=engine.tinker_timeout_s))
        self._clients: dict[str, Any] = {}  # adapter name -> training client
        self._samplers: dict[str, Any] = {}  # adapter name -> sampling client of its current weights
        self._base_sampler = None
        self._active = "default"
        self._pending_datums = 0  # sent since the last optimizer step ('sequence_mean' cannot accumulate)
        self._prefix = uuid.uuid4().hex[:8]  # names this engine's saved states on the service
        self._saves = 0
        self._clients["default"] = self._new_client("default")

    def _new_client(self, name: str):
        seed = (self.seed + zlib.crc32(name.encode())) % 2**31
        return self.remote(f"create adapter '{name}'", lambda: self.service.create_lora_training_client(
            base_model=self.cfg.name, rank=self.cfg.lora_rank, seed=seed, train_unembed=False))

    # ----- named adapters: one training client each ---------------------------------------------------

    @property
    def adapters(self) -> list[str]:
        return list(self._clients)

    @property
    def active_adapter(self) -> str:
        return self._active

    def create_adapter(self, name: str, init: str | Path | None = None) -> None:
        if init is not None:
            raise UserError("the tinker engine cannot load a local PEFT adapter into the service")
        if name in self._clients:
            raise UserError(f"adapter '{name}' already exists")
        self._clients[name] = self._new_client(name)

    def use_adapter(self, name: str) -> None:
        if name not in self._clients:
            raise UserError(f"unknown adapter '{name}' (adapters: {', '.join(self._clients)})")
        self._active = name

    @property
    def _client(self):
        return self._clients[self._active]

    # ----- sampling and scoring --------------------------------------------------------------------

    def _sampler(self, reference: bool):
        if reference:
            if self._base_sampler is None:
                self._base_sampler = self.remote("open the base sampler", lambda: self.service.create_sampling_client(
                    base_model=self.cfg.name))
            return self._base_sampler
        if self._active not in self._samplers:
            client = self._client
            self._samplers[self._active] = self.remote("export weights for sampling",
                                                       client.save_weights_and_get_sampling_client)
        return self._samplers[self._active]

    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        check_prompts(prompt_tokens, n)
        types, sampler = self.tinker.types, self._sampler(reference=False)

        def params(b: int):
            # one request per prompt: each its own seed, a pure function of (seed, prompt index)
            return types.SamplingParams(max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                        top_p=sampling.top_p, top_k=sampling.top_k or -1,
                                        seed=(sampling.seed * 7919 + b) % 2**31, stop=list(self.stop_ids))

        def draw():
            futures = [sampler.sample(types.ModelInput.from_ints(list(p)), n, params(b))
                       for b, p in enumerate(prompt_tokens)]
            return [f.result() for f in futures]

        responses = self.remote("sample", draw)
        return [[self._completion(prompt, seq) for seq in response.sequences][:n]
                for prompt, response in zip(prompt_tokens, responses, strict=True)]

    def _completion(self, prompt: list[int], seq) -> Completion:
        tokens = tuple(int(t) for t in seq.tokens)
        if seq.logprobs is None or len(seq.logprobs) != len(tokens):
            raise ExperimentError("the service returned a completion without one logprob per token")
        logprobs_C = torch.tensor(seq.logprobs, dtype=torch.float32)
        if not torch.isfinite(logprobs_C).all():
            raise ExperimentError("sampling produced non-finite logprobs")
        return Completion(prompt_tokens=tuple(prompt), tokens=tokens, logprobs_C=logprobs_C,
                          # the Tinker API reports no entropies: NaN marks them missing (rewards.entropy refuses)
                          entropies_C=torch.full((len(tokens),), float("nan")),
                          text=self.tokenizer.decode(list(tokens), skip_special_tokens=True),
                          finish_reason="stop" if seq.stop_reason == "stop" else "length")

    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, *,
                 reference: bool = False, temperature: float = 1.0,
                 targets_NT: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token logprobs [N, T] from a sampling client's compute_logprobs: the base's if reference, else
        the active adapter's current weights'."""
        refuse_temperature(temperature, "scoring")
        lengths = row_lengths(attention_mask_NT)
        sampler = self._sampler(reference)
        types = self.tinker.types

        def score():
            futures = [sampler.compute_logprobs(types.ModelInput.from_ints(input_ids_NT[i, :n].tolist()))
                       for i, n in enumerate(lengths)]
            return [f.result() for f in futures]

        # the service answers one value per token, None for the first (nothing predicts it)
        rows = [list(values)[-(n - 1):] for values, n in zip(self.remote("score", score), lengths, strict=True)]
        if targets_NT is None:
            targets_NT = torch.nn.functional.pad(attention_mask_NT[:, 1:], (1, 0))
        out = scatter_targets(rows, lengths, input_ids_NT.shape[1], targets_NT)
        if not torch.isfinite(out).all():
            raise ExperimentError(f"non-finite {'reference' if reference else 'policy'} logprobs")
        return out

    # ----- training -----------------------------------------------------------------------------------

    def _datums(self, batch: TrainBatch, **fields_NT: torch.Tensor) -> list:
        types, lengths = self.tinker.types, row_lengths(batch.attention_mask_NT)
        ids = batch.input_ids_NT
        return [types.Datum(model_input=types.ModelInput.from_ints(ids[i, :n - 1].tolist()),
                            loss_fn_inputs={"target_tokens": ids[i, 1:n].tolist(),
                                            **{k: datum_slice(v.float(), i, n).tolist() for k, v in fields_NT.items()}})
                for i, n in enumerate(lengths)]

    def _send(self, what: str, batch: TrainBatch, loss_fn: str, config: dict[str, float] | None,
              **fields_NT: torch.Tensor) -> torch.Tensor:
        """Run forward(_backward) of a built-in loss on the batch; the logprobs [N, T] it saw (target-aligned)."""
        if what == "forward_backward":
            if self.reduction == "sequence_mean" and self._pending_datums:
                raise ExperimentError("with engine.tinker_loss_reduction 'sequence_mean' the service averages "
                                      "gradients over a step's datums: one forward_backward per optim_step")
            self._pending_datums += batch.num_sequences
        datums, client = self._datums(batch, **fields_NT), self._client
        call = client.forward_backward if what == "forward_backward" else client.forward
        output = self.remote(what, lambda: call(datums, loss_fn, config).result())
        rows = [list(out["logprobs"].tolist()) for out in output.loss_fn_outputs]
        return scatter_targets(rows, row_lengths(batch.attention_mask_NT), batch.input_ids_NT.shape[1],
                               batch.loss_mask_NT)

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        definition = loss.definition
        check_batch(batch, loss)
        if definition.consumes == "logits":
            raise ExperimentError(f"loss '{loss.name}' needs the full next-token logits, which the Tinker API "
                                  "does not return")
        if definition.consumes == "values":
            raise ExperimentError(f"loss '{loss.name}' reads a scalar head's values, which the Tinker API has not")
        if loss.scale != 1.0:
            raise ExperimentError(f"loss '{loss.name}' scaled by {loss.scale}: the service's built-in losses take no "
                                  "factor")
        refuse_temperature(loss.temperature, f"loss '{loss.name}'")

        def registered(lp_NT: torch.Tensor, inputs) -> tuple[torch.Tensor, dict[str, float]]:
            if definition.consumes == "sequences":
                return definition.fn(lp_NT, inputs, loss.params)
            loss_NT, metrics = definition.fn(lp_NT, inputs, loss.params)
            return aggregate_loss(loss_NT, inputs["loss_mask_NT"], loss.aggregation,
                                  total_tokens=batch.num_loss_tokens, total_sequences=batch.num_sequences,
                                  length_norm=loss.length_norm), metrics

        builtin = definition.tinker(loss.params) if definition.tinker and definition.consumes == "logprobs" else None
        takes_advantages = "advantages_NT" in definition.inputs
        if builtin is None or (self.reduction != "sum" and not takes_advantages):
            return self._linearized(batch, registered)
        loss_fn, config = builtin
        mask_NT = batch.loss_mask_NT
        coefficients_NT = aggregation_coefficients(loss, mask_NT)
        on_NT = (mask_NT != 0).float()
        if takes_advantages:  # linear in the advantages: they carry the weighting, under either reduction
            scaled_NT = batch.advantages_NT * coefficients_NT * reduction_scale(on_NT, self.reduction)
            fields = {"weights": on_NT, "advantages": scaled_NT}
        else:
            fields = {"weights": coefficients_NT}
        if "sampling_logprobs_NT" in definition.inputs:
            fields["logprobs"] = batch.sampling_logprobs_NT
        lp_NT = self._send("forward_backward", batch, loss_fn, config or None, **fields)
        with torch.no_grad():  # the reported numbers are the registry's, on the logprobs the service used
            value, metrics = registered(lp_NT, batch.inputs())
        return loss_metrics(value, metrics, batch)

    def forward_backward_custom(self, batch: TrainBatch, loss: CustomLoss) -> dict[str, float]:
        check_batch(batch)
        refuse_temperature(loss.temperature, "a custom loss")
        return self._linearized(batch, loss.fn)

    def _linearized(self, batch: TrainBatch, fn) -> dict[str, float]:
        """Tinker's forward_backward_custom: logprobs from a forward pass, the loss and dloss/dlogprobs here,
        then an importance_sampling surrogate at ratio 1 (its logprobs are the forward's) whose advantages
        are -dloss/dlogprobs: its gradient is sum(dloss/dlogprobs * grad logprobs)."""
        on_NT = (batch.loss_mask_NT != 0).float()
        lp_NT = self._send("forward", batch, "cross_entropy", None, weights=on_NT)
        lp_NT = lp_NT.clone().requires_grad_(True)
        out = fn(lp_NT, batch.inputs())
        value, metrics = (out, {}) if isinstance(out, torch.Tensor) else out
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or not torch.isfinite(value):
            raise ExperimentError(f"the loss must be one finite number, got {value!r}"[:200])
        value.backward()
        if lp_NT.grad is None:
            raise ExperimentError("the loss does not depend on the logprobs it was given")
        advantages_NT = -lp_NT.grad * on_NT * reduction_scale(on_NT, self.reduction)
        self._send("forward_backward", batch, "importance_sampling", None, weights=on_NT,
                   logprobs=lp_NT.detach(), advantages=advantages_NT)
        return loss_metrics(value.detach(), metrics, batch)

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        params = self.tinker.types.AdamParams(learning_rate=adam.lr, beta1=adam.beta1, beta2=adam.beta2,
                                              eps=adam.eps, weight_decay=adam.weight_decay,
                                              grad_clip_norm=adam.max_grad_norm)
        client = self._client
        response = self.remote("optim_step", lambda: client.optim_step(params).result())
        self._pending_datums = 0
        self._samplers.pop(self._active, None)  # the next sample or score exports the new weights
        reported = {k: float(v) for k, v in (response.metrics or {}).items() if k.endswith("grad_norm")}
        # the loop checks grad_norm; a service that reports none is marked, not guessed
        grad_norm = next(iter(reported.values()), 0.0)
        return {"grad_norm": grad_norm, "grad_norm_reported": float(bool(reported)), "lr": adam.lr}

    # ----- state ------------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Each adapter's weights + optimizer state saved on the service; `tinker_state.json` in path names them."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self._saves += 1
        saved = {}
        for name, client in self._clients.items():
            label = f"purplerl-{self._prefix}-{self._saves:06d}-{name}"
            saved[name] = self.remote(f"save adapter '{name}'", lambda c=client, n=label: c.save_state(n).result()).path
        state = {"base_model": self.cfg.name, "lora_rank": self.cfg.lora_rank, "active": self._active,
                 "adapters": saved}
        (path / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")

    def load(self, path: Path) -> None:
        state = read_state(Path(path))
        if state["base_model"] != self.cfg.name or state.get("lora_rank") != self.cfg.lora_rank:
            raise UserError(f"{path} holds adapters of {state['base_model']} (rank {state.get('lora_rank')}), "
                            f"not of {self.cfg.name} (rank {self.cfg.lora_rank})")
        for name, tinker_path in state["adapters"].items():
            if name not in self._clients:
                self.create_adapter(name)
            client = self._clients[name]
            self.remote(f"load adapter '{name}'",
                        lambda c=client, p=tinker_path: c.load_state_with_optimizer(p).result())
        self._samplers.clear()
        self.use_adapter(state["active"])

    def close(self) -> None:
        """Nothing to stop here: the SDK's clients end their sessions themselves when collected (no public close)."""


def read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except FileNotFoundError:
        raise UserError(f"{path} holds no {STATE_FILE}: not a checkpoint of the tinker engine") from None
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path / STATE_FILE}: {first_line(err)}") from None
    adapters = state.get("adapters") if isinstance(state, dict) else None
    if not isinstance(adapters, dict) or "default" not in adapters or state.get("active") not in adapters:
        raise UserError(f"{path / STATE_FILE} does not name the adapters' saved states")
    return state
