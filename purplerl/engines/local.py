"""The local engine: torch + transformers + PEFT in this process, on CPU or CUDA.

The PEFT model serves as the LoRA policy (adapter on) and as the frozen base for KL (adapter disabled,
never a second copy). Sampling runs on a plain copy of the model with the LoRA update merged into its
weights (`model.merged_sampler`), refreshed after every optimizer step: decoding then pays for no adapter
layers, which dominate a small model's per-token cost. Sampling is a hand-written KV-cache decode loop
rather than `generate()` so that it draws from a seeded `torch.Generator` (no global RNG), and records
the logprob and entropy of every drawn token from the very logits it drew from.

Scoring (`logprobs`, `forward_backward`) runs the decoder once and applies the LM head only at the
positions that are scored (completion tokens), in row chunks: prompt and padding positions never pay for
the vocabulary projection, and the full [N, T, V] logits never exist.

With `model.finetune: full` there is no PEFT wrapping: every weight of the model trains (fp32 masters and AdamW
as for an adapter), the model samples itself, and the KL reference is the initial model, loaded again from
`model.name` the first time a reference logprob is asked for (SFT never asks, so never pays for that copy; a
resumed run gets the initial model too, not the checkpoint it loaded).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import zlib
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from purplerl.algorithms.logprobs import selective_log_softmax
from purplerl.algorithms.losses import aggregate_loss
from purplerl.algorithms.registry import CustomLoss, Loss
from purplerl.config import ModelConfig
from purplerl.engines.adapters import AdapterSet, FullWeights, adapter_weights_file, lora_config
from purplerl.engines.base import EngineSettings, check_batch, check_prompts
from purplerl.engines.decoding import DynamicDecoder, StaticDecoder
from purplerl.engines.full_weights import copy_weights, read_weights, refuse_other_kind, save_model_dir
from purplerl.engines.fused_lora import install_fused_lora
from purplerl.engines.loading import (
    load_causal_lm,
    load_peft_adapter,
    load_tokenizer,
    read_adapter_config,
    resolve_device,
    resolve_dtype,
    stop_token_ids,
)
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch

OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng_state.pt"
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
DECODE_SYNC_EVERY = 8  # on GPUs: decode steps between reads of the stop / non-finite flags


@contextlib.contextmanager
def _attention_for(config, width: int, device: torch.device):
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


def _truncate_probs(scaled_NV: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Sampling probabilities after top-k / nucleus truncation of softmax(scaled logits)."""
    if top_k > 0 and top_k < scaled_NV.shape[-1]:
        kth = torch.topk(scaled_NV, top_k, dim=-1).values[:, -1:]
        scaled_NV = scaled_NV.masked_fill(scaled_NV < kth, float("-inf"))
    probs_NV = torch.softmax(scaled_NV, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs_NV, dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p (the top token always survives)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs_NV = torch.zeros_like(probs_NV).scatter(-1, order, sorted_p)
    return probs_NV


def _draw(probs_NV: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row by inverse-CDF sampling: a uniform draw located in the cumulative distribution.

    Same distribution as torch.multinomial(probs, 1), which on CPU draws one exponential per vocabulary
    entry (~27 ms per decode step at 32 x 49k here); this draws one uniform per row."""
    cdf_NV = probs_NV.cumsum(-1)
    u_N1 = torch.rand((probs_NV.shape[0], 1), generator=generator, device=probs_NV.device, dtype=cdf_NV.dtype)
    total_N1 = cdf_NV[:, -1:]
    # u * total can round up to total itself; below it, the first cdf entry above the draw is a token with p > 0
    x_N1 = torch.minimum(u_N1 * total_N1, torch.nextafter(total_N1, torch.zeros_like(total_N1)))
    # clamped: rows of NaN probabilities (caught by the caller) must still give valid token ids
    return torch.searchsorted(cdf_NV, x_N1, right=True).squeeze(-1).clamp_(max=probs_NV.shape[-1] - 1)


class LocalEngine:
    """Tinker-shaped training primitives over a PEFT LoRA model (or, full-parameter, the model itself) held in
    this process."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, settings: EngineSettings | None = None) -> None:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.seed = seed
        self.settings = settings or EngineSettings()
        self.device = resolve_device(cfg.device)
        self.decode_sync_every = 1 if self.device.type == "cpu" else DECODE_SYNC_EVERY
        self.decode_static: str | None = None  # None: chosen by device and config; "static" / "graph": forced
        self._graphs_work = True  # False once a capture failed: later decodes do not try again
        self.full = cfg.finetune == "full"
        if cfg.init_adapter:
            if self.full:
                raise UserError("model.init_adapter is a LoRA adapter, model.finetune 'full' trains the model "
                                "itself: start from a model dir with --model, or use --model.finetune lora")
            read_adapter_config(cfg.init_adapter, "init_adapter")  # a malformed one fails before the model loads
        self.tokenizer = load_tokenizer(cfg.name, cfg.revision)
        # full: loaded in fp32 so the fp32 masters start from the exact weights, then cast to the compute dtype
        base = load_causal_lm(cfg.name, cfg.revision, "float32" if self.full else cfg.dtype, cfg.device)
        self.stop_ids = stop_token_ids(self.tokenizer, base)
        self._causal_lm = base  # PEFT injects its LoRA layers into this very model
        self._reference_lm = None  # full: the initial model, loaded on first use
        # final-logit transforms (softcapping, scaling) live in the model's forward: score through it then
        config = base.config
        self._head_only = not any(getattr(config, k, None) for k in ("final_logit_softcapping", "logit_scale"))
        # transformers renamed the KV-cache argument from past_key_values to cache (5.x); take what the model has
        params = inspect.signature(base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        compute_dtype = resolve_dtype(cfg.dtype, self.device)
        if self.full:
            self._sampler, self._sampler_synced = None, False  # the model samples itself: nothing to merge
            torch.manual_seed(self.seed)  # the global RNG drives dropout, if the model has any
            self.model = base
            self._adapters = FullWeights(self.model, compute_dtype)
        else:
            self._wrap_lora(base, compute_dtype)

    def _wrap_lora(self, base, compute_dtype: torch.dtype) -> None:
        from peft import get_peft_model

        cfg = self.cfg
        # copied before PEFT wraps `base` in place; its LoRA-targeted weights are rewritten by _sync_sampler
        self._sampler = copy.deepcopy(base) if cfg.merged_sampler else None
        self._sampler_synced = False
        torch.manual_seed(self.seed)  # LoRA A matrices are drawn from torch's default generator by PEFT
        if cfg.init_adapter:
            self.model = load_peft_adapter(base, cfg.init_adapter)
        else:
            try:
                self.model = get_peft_model(base, lora_config(cfg))
            except ValueError as err:
                raise UserError(f"cannot apply LoRA: {str(err).splitlines()[0]}") from None
        self.model.to(self.device)
        if cfg.fused_lora:
            install_fused_lora(self.model)
        # Mixed precision: over a bf16 base the adapters run in bf16 too (PEFT would otherwise cast every
        # activation to fp32 and back around each of the ~200 adapted layers), while each adapter's optimizer
        # updates fp32 master copies; gradients are accumulated into the masters after every micro-batch.
        self._adapters = AdapterSet(self.model, compute_dtype)
        self._adapters.register("default")

    # ----- named adapters (one frozen base; the reference is the base with every adapter off) -------

    @property
    def adapters(self) -> list[str]:
        return self._adapters.names

    @property
    def active_adapter(self) -> str:
        return self._adapters.active

    def create_adapter(self, name: str, init: str | Path | None = None) -> None:
        """Add a LoRA adapter `name` on the same base: fresh (LoRA B = 0, so it starts as the base; shaped by the
        model config) or loaded from a PEFT dir `init`. It does not become active: see `use_adapter`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + zlib.crc32(name.encode()))  # its own A matrices, global RNG untouched
            self._adapters.create(name, self.cfg, init)
        if self.cfg.fused_lora and not self.full:
            install_fused_lora(self.model)

    def use_adapter(self, name: str) -> None:
        """Make `name` the adapter that samples, scores and trains."""
        self._adapters.activate(name)
        self._sampler_synced = False

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return self._adapters.current.params

    @property
    def master(self) -> list[torch.Tensor]:
        return self._adapters.current.master

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._adapters.current.optimizer

    # ----- sampling -------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        check_prompts(prompt_tokens, n)
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        expanded = [p for p in prompt_tokens for _ in range(n)]
        tokens_NC, logprobs_NC, entropies_NC, lengths_N, stopped_N = self._decode(expanded, sampling, generator)
        completions = []
        for i, prompt in enumerate(expanded):
            c = int(lengths_N[i])
            toks = tuple(int(t) for t in tokens_NC[i, :c])
            completions.append(Completion(
                prompt_tokens=tuple(prompt), tokens=toks,
                logprobs_C=logprobs_NC[i, :c].float().cpu(), entropies_C=entropies_NC[i, :c].float().cpu(),
                text=self.tokenizer.decode(list(toks), skip_special_tokens=True),
                finish_reason="stop" if bool(stopped_N[i]) else "length"))
        return [completions[b * n:(b + 1) * n] for b in range(len(prompt_tokens))]

    def _autocast(self):
        # bf16 matmuls with fp32 master weights: several times faster on CPUs with AMX / AVX512-BF16
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.cfg.autocast_bf16)

    @torch.no_grad()
    def _sync_sampler(self) -> None:
        """Write base weight + LoRA delta into the sampler copy of every adapted layer."""
        from peft.tuners.lora import LoraLayer

        adapter = self.model.active_adapter
        shared = Counter(p.data_ptr() for _, p in self._sampler.named_parameters(remove_duplicate=False))
        for name, module in self.model.get_base_model().named_modules():
            if not isinstance(module, LoraLayer):
                continue
            if adapter not in module.scaling:  # another adapter's layer: the sampler must hold the base weight
                self._sampler.get_submodule(name).weight.copy_(module.get_base_layer().weight)
                continue
            if module.use_dora.get(adapter, False):
                raise UserError(f"cannot merge the DoRA layer {name} for sampling: set model.merged_sampler false")
            target = self._sampler.get_submodule(name)
            merged = module.get_base_layer().weight.float() + module.get_delta_weight(adapter).float()
            if merged.shape != target.weight.shape:
                raise UserError(f"cannot merge LoRA layer {name} for sampling: set model.merged_sampler false")
            if shared[target.weight.data_ptr()] > 1:  # a tied weight (lm_head = embeddings): untie it first
                target.weight = torch.nn.Parameter(merged.to(target.weight.dtype), requires_grad=False)
            else:
                target.weight.copy_(merged)
        self._sampler_synced = True

    def _decoder(self, model, attn_NP: torch.Tensor, max_new_tokens: int):
        """The KV-cache strategy of one decode (purplerl.engines.decoding): on CUDA a static cache whose step is
        replayed as a CUDA graph (`model.cuda_graphs`), elsewhere a growing cache. Autocast keeps the growing
        cache: its casts would be recorded into the graph and its weight cache freed under it."""
        if self.decode_static is None:
            static = self.device.type == "cuda" and self.cfg.cuda_graphs and not self.cfg.autocast_bf16
            graphed = static and self._graphs_work
        else:  # set by tests: the static cache on any device, with or without the graph
            static, graphed = True, self.decode_static == "graph"
        if static:
            return StaticDecoder(model, self._cache_kwarg, attn_NP, max_new_tokens, graphed)
        return DynamicDecoder(model, self._cache_kwarg, attn_NP)

    def _sampling_model(self):
        if self._sampler is None:
            self.model.eval()
            return self.model
        if not self._sampler_synced:
            self._sync_sampler()
        return self._sampler

    def _decode(self, prompts: list[list[int]], sampling: SamplingParams, generator: torch.Generator):
        """Left-padded batched decoding with a KV cache; returns per-step tokens/logprobs/entropies."""
        model = self._sampling_model()
        N, P = len(prompts), max(len(p) for p in prompts)
        pad = int(self.tokenizer.pad_token_id)
        ids_NP = torch.full((N, P), pad, dtype=torch.long, device=self.device)
        attn_NP = torch.zeros((N, P), dtype=torch.long, device=self.device)
        for i, p in enumerate(prompts):
            ids_NP[i, P - len(p):] = torch.tensor(p, device=self.device)
            attn_NP[i, P - len(p):] = 1
        stop = torch.tensor(self.stop_ids, device=self.device)
        position_NP = (attn_NP.cumsum(-1) - 1).clamp(min=0)
        decoder = self._decoder(model, attn_NP, sampling.max_new_tokens)
        with self._autocast():
            logits_NV = decoder.prefill(ids_NP, position_NP)
        next_pos = position_NP[:, -1:] + 1
        finished_N = torch.zeros(N, dtype=torch.bool, device=self.device)
        lengths_N = torch.zeros(N, dtype=torch.long, device=self.device)
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        # Reading a flag back from a GPU waits for every queued kernel, so the host cannot queue the next step
        # while the GPU runs this one; there the flags are read every DECODE_SYNC_EVERY tokens. Steps past the
        # end of every sequence only draw padding, so stopping a few tokens late changes no completion.
        toks, lps, ents = [], [], []
        for step in range(sampling.max_new_tokens):
            greedy = sampling.temperature == 0  # greedy decoding reports logprobs at temperature 1
            scaled_NV = logits_NV.float()
            if not greedy and sampling.temperature != 1.0:
                scaled_NV = scaled_NV / sampling.temperature
            nonfinite |= ~torch.isfinite(scaled_NV).all()
            logp_NV = torch.log_softmax(scaled_NV, dim=-1)
            p_NV = logp_NV.exp()
            if greedy:
                tok_N = scaled_NV.argmax(-1)
            elif sampling.top_k == 0 and sampling.top_p >= 1.0:
                tok_N = _draw(p_NV, generator)  # untruncated: the softmax is already at hand
            else:
                tok_N = _draw(_truncate_probs(scaled_NV, sampling.top_p, sampling.top_k), generator)
            tok_N = torch.where(finished_N, torch.full_like(tok_N, pad), tok_N)
            toks.append(tok_N)
            lps.append(logp_NV.gather(-1, tok_N[:, None]).squeeze(-1))
            ents.append(-(p_NV * logp_NV).sum(-1))
            lengths_N += (~finished_N).long()
            finished_N |= torch.isin(tok_N, stop)
            if (step + 1) % self.decode_sync_every == 0 or step + 1 == sampling.max_new_tokens:
                if bool(nonfinite):  # a NaN model draws garbage tokens: stop at once, loudly
                    raise ExperimentError("sampling produced non-finite logits (model weights or logits are NaN/inf)")
                if bool(finished_N.all()) or step + 1 == sampling.max_new_tokens:
                    break
            with self._autocast():
                logits_NV = decoder.step(tok_N, next_pos)
            next_pos = next_pos + 1
        self._graphs_work = self._graphs_work and getattr(decoder, "graphed", True)
        tokens_NC, logprobs_NC, ent_NC = torch.stack(toks, 1), torch.stack(lps, 1), torch.stack(ents, 1)
        if not torch.isfinite(logprobs_NC).all():
            raise ExperimentError("sampling produced non-finite logprobs (model weights or logits are NaN/inf)")
        return tokens_NC.cpu(), logprobs_NC.cpu(), ent_NC.cpu(), lengths_N.cpu(), finished_N.cpu()

    # ----- scoring ----------------------------------------------------------------------------------

    def _logits(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, causal_lm=None) -> torch.Tensor:
        """fp32 logits [N, T-1, V] of the policy (or `causal_lm`): position t predicts token t+1."""
        with self._autocast():
            model = self._causal_lm if causal_lm is None else causal_lm
            logits_NTV = model(input_ids=input_ids_NT, attention_mask=attention_mask_NT).logits
        return logits_NTV[:, :-1].float()

    @contextlib.contextmanager
    def _scorer(self, reference: bool):
        """The causal LM that scores: the policy, or the frozen reference (LoRA: the base with every adapter
        off; full: the initial model, loaded again from model.name on first use)."""
        if not reference:
            yield self._causal_lm
        elif not self.full:
            with self.model.disable_adapter():
                yield self._causal_lm
        else:
            if self._reference_lm is None:
                c = self.cfg
                self._reference_lm = load_causal_lm(c.name, c.revision, c.dtype, c.device)
            yield self._reference_lm

    def _target_logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor,
                         targets_NT: torch.Tensor, temperature: float, causal_lm=None) -> torch.Tensor:
        """fp32 logprobs [N, T] of the tokens where targets_NT is 1 (aligned to targets), 0 elsewhere, under the
        policy (or `causal_lm`).

        The decoder runs once; the LM head and log-softmax run only on the scored positions, in chunks."""
        causal_lm = self._causal_lm if causal_lm is None else causal_lm
        picked_NT = targets_NT[:, 1:].bool()  # the logits at position t-1 score token t
        if not self._head_only:
            logits_NTV = self._logits(input_ids_NT, attention_mask_NT, causal_lm)
            logp_NT = selective_log_softmax(logits_NTV, input_ids_NT[:, 1:], temperature=temperature)
            return F.pad(logp_NT * picked_NT, (1, 0))
        with self._autocast(), _attention_for(causal_lm.config, input_ids_NT.shape[1], self.device):
            hidden_NTH = causal_lm.get_decoder()(input_ids=input_ids_NT, attention_mask=attention_mask_NT
                                                 ).last_hidden_state
        rows_RH, tokens_R = hidden_NTH[:, :-1][picked_NT], input_ids_NT[:, 1:][picked_NT]
        head = causal_lm.get_output_embeddings()
        chunk_rows = max(16, HEAD_CHUNK_BYTES // (4 * head.weight.shape[0]))  # 128 rows at a 49k vocabulary

        def chunk_logprobs(rows_CH: torch.Tensor, tokens_C: torch.Tensor) -> torch.Tensor:
            with self._autocast():
                logits_CV = head(rows_CH)
            return selective_log_softmax(logits_CV[None], tokens_C[None], temperature=temperature,
                                         chunk_rows=chunk_rows)[0]

        out_R = []
        for start in range(0, rows_RH.shape[0], chunk_rows):
            chunk = (rows_RH[start:start + chunk_rows], tokens_R[start:start + chunk_rows])
            if torch.is_grad_enabled() and rows_RH.shape[0] > HEAD_CHECKPOINT_ROWS:
                # keep only the hidden rows for backward and recompute the chunk's [C, V] logits there: the
                # saved logits would otherwise be the largest activation of a small-model batch
                out_R.append(torch.utils.checkpoint.checkpoint(chunk_logprobs, *chunk, use_reentrant=False))
            else:
                out_R.append(chunk_logprobs(*chunk))
        logp_R = torch.cat(out_R) if out_R else hidden_NTH.new_zeros(0, dtype=torch.float32)
        logp_NT = torch.zeros(picked_NT.shape, dtype=torch.float32, device=self.device)
        logp_NT = logp_NT.masked_scatter(picked_NT, logp_R)
        return F.pad(logp_NT, (1, 0))

    @staticmethod
    def _micro_batches(attention_mask_NT: torch.Tensor, max_sequences: int, max_tokens: int) -> list[torch.Tensor]:
        """Row indices of each micro-batch: sequences sorted by length (so a micro-batch trims to little
        padding), as many per micro-batch as fit in max_tokens padded tokens, at most max_sequences, at least 1."""
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

    @torch.no_grad()
    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, *,
                 reference: bool = False, temperature: float = 1.0,
                 targets_NT: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token logprobs [N, T]; only the `targets_NT` positions are computed (default: every token
        after the first), the rest are 0."""
        self.model.eval()
        ids, attn = input_ids_NT.to(self.device), attention_mask_NT.to(self.device)
        if targets_NT is None:
            targets_NT = F.pad(attention_mask_NT[:, 1:], (1, 0))
        targets = targets_NT.to(self.device)
        out = torch.zeros(ids.shape, dtype=torch.float32, device=self.device)
        for rows in self._micro_batches(attn, self.settings.micro_batch_size, self.settings.micro_batch_tokens):
            width = int(attn[rows].sum(-1).max())  # right padding: trim unused columns
            with self._scorer(reference) as causal_lm:
                out[rows, :width] = self._target_logprobs(ids[rows, :width], attn[rows, :width],
                                                          targets[rows, :width], temperature, causal_lm)
        out = out.cpu()
        if not torch.isfinite(out).all():
            raise ExperimentError(f"non-finite {'reference' if reference else 'policy'} logprobs")
        return out

    # ----- training ---------------------------------------------------------------------------------

    def _parts(self, batch: TrainBatch):
        """(rows, width, inputs) per micro-batch: the batch's tensors cut to the rows and trimmed of padding."""
        tensors = {"input_ids_NT": batch.input_ids_NT, "attention_mask_NT": batch.attention_mask_NT,
                   **{k: v for k, v in batch.inputs().items() if k != "pairs_P2"}}
        s = self.settings
        for rows in self._micro_batches(batch.attention_mask_NT, s.micro_batch_size, s.micro_batch_tokens):
            width = int(batch.attention_mask_NT[rows].sum(-1).max())  # right padding: trim unused columns
            yield rows, width, {name: t[rows, :width].to(self.device) for name, t in tensors.items()}

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        """Accumulate the gradient of a registered loss on the batch into the active adapter."""
        definition = loss.definition
        check_batch(batch, loss)
        if definition.consumes == "sequences":
            return self._linearized_backward(batch, lambda lp, inputs: definition.fn(lp, inputs, loss.params),
                                             loss.temperature)
        self.model.train()
        generator = torch.Generator(device=self.device).manual_seed(loss.seed)
        totals: dict[str, float] = {}
        normalizer = batch.num_loss_tokens
        for rows, _, part in self._parts(batch):
            ids, attn, mask = part["input_ids_NT"], part["attention_mask_NT"], part["loss_mask_NT"]
            if definition.consumes == "logits":
                # per-token tensors start at position 1, where the logits of position 0 predict the first target
                shifted = {k: v[:, 1:] for k, v in part.items()}
                loss_nt, metrics = definition.fn(self._logits(ids, attn), shifted, loss.params, targets_NT=ids[:, 1:],
                                                 temperature=loss.temperature, generator=generator)
                loss_NT = F.pad(loss_nt, (1, 0))
            else:
                logp_NT = self._target_logprobs(ids, attn, mask, loss.temperature)
                loss_NT, metrics = definition.fn(logp_NT, part, loss.params)
            total = aggregate_loss(loss_NT, mask, loss.aggregation, total_tokens=normalizer,
                                   total_sequences=batch.num_sequences, length_norm=loss.length_norm)
            if not torch.isfinite(total):
                raise ExperimentError(f"non-finite loss in the micro-batch with sequence {int(rows[0])}")
            total.backward()
            self._accumulate_master_grads()
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

    def _linearized_backward(self, batch: TrainBatch, fn, temperature: float) -> dict[str, float]:
        """The gradient of fn(logprobs of the whole batch) in one micro-batch of memory: logprobs without
        gradient, the loss and dloss/dlogprobs from them, then per micro-batch the backward pass of
        sum(dloss/dlogprobs * logprobs), whose gradient is exactly the chain rule's. (Exact when the forward
        pass is deterministic: LoRA dropout would draw other masks in the two passes.)"""
        targets_NT = (batch.loss_mask_NT != 0).long()
        logp_NT = self.logprobs(batch.input_ids_NT, batch.attention_mask_NT, temperature=temperature,
                                targets_NT=targets_NT).requires_grad_(True)
        out = fn(logp_NT, batch.inputs())
        value, metrics = (out, {}) if isinstance(out, torch.Tensor) else out  # the metrics dict is optional
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or not torch.isfinite(value):
            raise ExperimentError(f"the loss must be one finite number, got {value!r}"[:200])
        value.backward()
        if logp_NT.grad is None:
            raise ExperimentError("the loss does not depend on the logprobs it was given")
        grad_NT = logp_NT.grad
        self.model.train()
        for rows, width, part in self._parts(batch):
            lp = self._target_logprobs(part["input_ids_NT"], part["attention_mask_NT"],
                                       targets_NT[rows, :width].to(self.device), temperature)
            (lp * grad_NT[rows, :width].to(self.device)).sum().backward()
            self._accumulate_master_grads()
        return {"loss": float(value.detach()), **{k: float(v) for k, v in metrics.items()},
                "tokens": float(batch.num_loss_tokens)}

    def _accumulate_master_grads(self) -> None:
        self._adapters.current.accumulate_master_grads()

    def _fp32_adapter(self):
        """Point every adapter's weights at its fp32 masters (for exact save/load), then back."""
        return self._adapters.fp32_weights()

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        for group in self.optimizer.param_groups:
            group.update(lr=adam.lr, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay)
        max_norm = adam.max_grad_norm if adam.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.master, max_norm)
        if not torch.isfinite(grad_norm):
            raise ExperimentError(f"non-finite gradient norm ({float(grad_norm)})")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not self.trainable:
            with torch.no_grad():
                for p, m in zip(self.trainable, self.master, strict=True):
                    p.copy_(m)
        self._sampler_synced = False
        return {"grad_norm": float(grad_norm), "lr": adam.lr}

    # ----- state ------------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Every adapter (a standard PEFT dir: `default` at the top, others in subdirs by name), each adapter's
        optimizer state, which one is active, and the global RNG. Full-parameter: the model as a standard
        Hugging Face model dir (fp32 weights + tokenizer, loadable on its own) instead of the adapters."""
        path = Path(path)
        with self._fp32_adapter():  # the exported weights are the exact fp32 masters
            if self.full:
                save_model_dir(self.model, self.tokenizer, path)
            else:
                self.model.save_pretrained(path, selected_adapters=self.adapters)
        # sampling draws from its own seeded generator; the global RNG still drives LoRA dropout
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        optimizers = {"adapters": {name: self._adapters.get(name).optimizer.state_dict() for name in self.adapters},
                      "active": self.active_adapter}
        # serialized in memory and written by Python: a full disk then raises OSError(ENOSPC), where torch's
        # own file writer reports only "unexpected pos"
        for name, obj in ((OPTIMIZER_FILE, optimizers), (RNG_FILE, rng)):
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            with open(path / name, "wb") as f:
                f.write(buffer.getbuffer())

    def load(self, path: Path) -> None:
        """Restore what save() wrote; adapters the checkpoint has and this engine lacks are created."""
        path = Path(path)
        refuse_other_kind(path, self.cfg.finetune)
        if self.full:
            state = read_weights(path, self.device)
            with self._fp32_adapter():  # copied into the masters; the compute-dtype weights follow on exit
                copy_weights(self.model, state, path)
        else:
            names = ["default", *sorted(d.name for d in path.iterdir() if (d / "adapter_config.json").is_file())]
            for name in names:
                if name not in self.adapters:
                    self.create_adapter(name)
                self._load_weights(name, adapter_weights_file(path, name))
        state = load_tensors(path / OPTIMIZER_FILE, self.device)
        # a checkpoint of one unnamed adapter (purplerl before named adapters) holds a plain state dict
        optimizers = state.get("adapters") if isinstance(state, dict) and "adapters" in state else {"default": state}
        for name, optimizer_state in optimizers.items():
            try:
                self._adapters.get(name).optimizer.load_state_dict(optimizer_state)
            except (KeyError, ValueError, TypeError) as err:
                raise UserError(f"optimizer state of adapter '{name}' in {path} does not match it: "
                                f"{first_line(err)}") from None
        self.use_adapter(str(state.get("active", "default")) if isinstance(state, dict) else "default")
        if (path / RNG_FILE).is_file():
            rng = load_tensors(path / RNG_FILE, torch.device("cpu"))
            if not isinstance(rng, dict) or not isinstance(rng.get("cpu"), torch.Tensor):
                raise UserError(f"{path / RNG_FILE} does not hold an RNG state")
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])

    def _load_weights(self, name: str, weights: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if not weights.is_file():
            raise UserError(f"{weights.parent} holds no adapter_model.safetensors")
        try:
            state = load_file(str(weights), device=str(self.device))
        except (SafetensorError, OSError) as err:
            raise UserError(f"cannot read {weights}: {first_line(err)}") from None
        with self._fp32_adapter():  # loads in place into the masters; the bf16 copies follow on exit
            try:
                result = set_peft_model_state_dict(self.model, state, adapter_name=name)
            except RuntimeError as err:  # a tensor of another shape: another LoRA rank or model
                raise UserError(f"adapter in {weights.parent} does not match the model: {first_line(err)}") from None
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise UserError(f"adapter in {weights.parent} does not match the model ({len(unexpected)} unexpected keys)")
        self._sampler_synced = False



def load_tensors(path: Path, device: torch.device):
    """torch.load restricted to tensors and plain containers: a pickle that would run code is refused, unrun."""
    import pickle

    if not path.is_file():
        raise UserError(f"{path} is missing")
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(f"{path} holds objects other than tensors and plain values: refused without "
                        "unpickling them (only tensors are ever loaded from a checkpoint)") from None
    except (RuntimeError, OSError, EOFError) as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None
