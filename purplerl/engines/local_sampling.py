"""The local engine's sampler: batched decoding over the trainer's model, in this process.

Sampling runs on a plain copy of the model with the LoRA update merged into its weights (`engine.merged_sampler`),
refreshed whenever the trainer's active adapter changed (an optimizer step, a load, another adapter): decoding
then pays for no adapter layers, which dominate a small model's per-token cost. Without that copy (or with full
fine-tuning, where the model samples itself) it decodes through the trainer's model. Sampling is a hand-written
KV-cache decode loop rather than `generate()` so that it draws from a seeded `torch.Generator` (no global RNG),
and records the logprob and entropy of every drawn token from the very logits it drew from.
"""

from __future__ import annotations

import inspect
from collections import Counter

import torch

from purplerl.engines.base import check_prompts
from purplerl.engines.decoding import DynamicDecoder, StaticDecoder
from purplerl.engines.local_scoring import model_inputs
from purplerl.engines.local_training import LocalTrainer
from purplerl.engines.packed_linear import PackedLinears, packing_available
from purplerl.errors import ExperimentError, UserError
from purplerl.types import Completion, SamplingParams

DECODE_SYNC_EVERY = 8  # on GPUs: decode steps between reads of the stop / non-finite flags


def truncate_probs(scaled_NV: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
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


def check_first_keys(prompt_tokens: list[list[int]], first_keys: list[list[int]]) -> None:
    """Gist prompts' first keys: one per prompt token, each a column from 0 up to its own (ExperimentError: a
    caller's mistake, not the user's)."""
    if len(first_keys) != len(prompt_tokens):
        raise ExperimentError(f"{len(first_keys)} first-key lists for {len(prompt_tokens)} prompts")
    for i, (prompt, keys) in enumerate(zip(prompt_tokens, first_keys, strict=True)):
        if len(keys) != len(prompt) or any(not 0 <= k <= q for q, k in enumerate(keys)):
            raise ExperimentError(f"prompt {i}: its first keys must be one per token, each from 0 up to its column")


def draw(probs_NV: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
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


class LocalSampler:
    """Draws completions from the trainer's acting adapter(s): through `merged`, a plain copy of the base taken
    before PEFT wrapped it, or through the trainer's model when there is none."""

    def __init__(self, trainer: LocalTrainer, merged: torch.nn.Module | None = None) -> None:
        self.trainer, self.merged = trainer, merged
        # CPU bf16: the merged copy's linear layers over prepacked weights, where this machine measures it faster
        self.packed = PackedLinears(merged) if merged is not None and trainer.settings.packed_decode \
            and packing_available(trainer.device) else None
        self._synced: int | None = None  # the trainer version whose weights `merged` holds
        self.decode_sync_every = 1 if trainer.device.type == "cpu" else DECODE_SYNC_EVERY
        self.decode_static: str | None = None  # None: chosen by device and settings; "static" / "graph": forced
        self.graphs_work = True  # False once a capture failed: later decodes do not try again
        # transformers renamed the KV-cache argument from past_key_values to cache (5.x); take what the model has
        params = inspect.signature(trainer.causal_lm.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # the lm_head at the last position only (transformers >= 4.50 names it logits_to_keep)
        self.last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    @torch.no_grad()
    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams,
               first_keys: list[list[int]] | None = None) -> list[list[Completion]]:
        """n completions per prompt; with `first_keys` (gist prompts, one first key per prompt token) each prompt
        token attends from its first key on and the completion from its last token's (`gist_mask`)."""
        check_prompts(prompt_tokens, n)
        if first_keys is not None:
            check_first_keys(prompt_tokens, first_keys)
        generator = torch.Generator(device=self.trainer.device).manual_seed(sampling.seed)
        expanded = [p for p in prompt_tokens for _ in range(n)]
        tokens_NC, logprobs_NC, entropies_NC, lengths_N, stopped_N = self._decode(prompt_tokens, n, sampling,
                                                                                  generator, first_keys)
        completions = []
        for i, prompt in enumerate(expanded):
            c = int(lengths_N[i])
            toks = tuple(int(t) for t in tokens_NC[i, :c])
            completions.append(Completion(
                prompt_tokens=tuple(prompt), tokens=toks,
                logprobs_C=logprobs_NC[i, :c].float().cpu(), entropies_C=entropies_NC[i, :c].float().cpu(),
                text=self.trainer.tokenizer.decode(list(toks), skip_special_tokens=True),
                finish_reason="stop" if bool(stopped_N[i]) else "length"))
        return [completions[b * n:(b + 1) * n] for b in range(len(prompt_tokens))]

    @torch.no_grad()
    def _sync(self) -> None:
        """Write base weight + the acting adapters' LoRA deltas (each with its scale, which PEFT's scaling holds)
        into the merged copy of every adapted layer."""
        from peft.tuners.lora import LoraLayer

        model = self.trainer.model
        acting = list(self.trainer.adapter_scales)
        shared = Counter(p.data_ptr() for _, p in self.merged.named_parameters(remove_duplicate=False))
        for name, module in model.get_base_model().named_modules():
            if not isinstance(module, LoraLayer):
                continue
            here = [a for a in acting if a in module.scaling]
            if not here:  # another adapter's layer: the copy must hold the base weight
                self.merged.get_submodule(name).weight.copy_(module.get_base_layer().weight)
                continue
            if any(module.use_dora.get(a, False) for a in here):
                raise UserError(f"cannot merge the DoRA layer {name} for sampling: set engine.merged_sampler false")
            target = self.merged.get_submodule(name)
            merged = module.get_base_layer().weight.float()
            for adapter in here:
                merged = merged + module.get_delta_weight(adapter).float()
            if merged.shape != target.weight.shape:
                raise UserError(f"cannot merge LoRA layer {name} for sampling: set engine.merged_sampler false")
            if shared[target.weight.data_ptr()] > 1:  # a tied weight (lm_head = embeddings): untie it first
                target.weight = torch.nn.Parameter(merged.to(target.weight.dtype), requires_grad=False)
            else:
                target.weight.copy_(merged)
        self._synced = self.trainer.version
        if self.packed is not None:
            self.packed.invalidate()

    def decoding_model(self):
        """The model that decodes: the merged copy, brought up to the active adapter, or the trainer's model."""
        if self.merged is None:
            self.trainer.model.eval()
            return self.trainer.model
        if self._synced != self.trainer.version:
            self._sync()
        return self.merged

    def decoder(self, model, attn_NP: torch.Tensor, max_new_tokens: int, gist: bool = False):
        """The KV-cache strategy of one decode (purplerl.engines.decoding): on CUDA a static cache whose step is
        replayed as a CUDA graph (`engine.cuda_graphs`), elsewhere a growing cache. Autocast keeps the growing
        cache: its casts would be recorded into the graph and its weight cache freed under it. Gist prompts keep
        the growing cache, whose history is cut after the prefill (`DynamicDecoder.keep_from`)."""
        settings, device = self.trainer.settings, self.trainer.device
        if gist:
            return DynamicDecoder(model, self.cache_kwarg, attn_NP, self.last_logits)
        if self.decode_static is None:
            static = device.type == "cuda" and settings.cuda_graphs and not self.trainer.autocast_bf16
            graphed = static and self.graphs_work
        else:  # set by tests: the static cache on any device, with or without the graph
            static, graphed = True, self.decode_static == "graph"
        if static:
            return StaticDecoder(model, self.cache_kwarg, attn_NP, max_new_tokens, graphed, self.last_logits)
        return DynamicDecoder(model, self.cache_kwarg, attn_NP, self.last_logits)

    @staticmethod
    def _gist_prefill(decoder: DynamicDecoder, ids_BP: torch.Tensor, attn_BP: torch.Tensor, position_BP: torch.Tensor,
                      n: int, first_keys: list[list[int]]) -> torch.Tensor:
        """The prefill of left-padded gist prompts: each token attends from its first key; then every row's cache
        keeps the keys from its last first key on (the last gist block)."""
        B, P = ids_BP.shape
        key_BP = torch.zeros((B, P), dtype=torch.long, device=ids_BP.device)
        for i, keys in enumerate(first_keys):
            key_BP[i, P - len(keys):] = torch.tensor(keys, device=ids_BP.device) + (P - len(keys))
        inputs = model_inputs(decoder.model.config, ids_BP, attn_BP, position_BP, key_BP)
        logits_NV = decoder.prefill(ids_BP, position_BP, n, mask=inputs["attention_mask"])
        decoder.keep_from(key_BP[:, -1].repeat_interleave(n, 0))
        return logits_NV

    def _decode(self, prompts: list[list[int]], n: int, sampling: SamplingParams, generator: torch.Generator,
                first_keys: list[list[int]] | None = None):
        """Left-padded batched decoding with a KV cache of n rows per prompt (rows b·n … b·n + n - 1 continue
        prompt b); returns per-step tokens/logprobs/entropies."""
        model, trainer, device = self.decoding_model(), self.trainer, self.trainer.device
        B, P = len(prompts), max(len(p) for p in prompts)
        N = B * n
        pad = int(trainer.tokenizer.pad_token_id)
        ids_BP = torch.full((B, P), pad, dtype=torch.long, device=device)
        attn_BP = torch.zeros((B, P), dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            ids_BP[i, P - len(p):] = torch.tensor(p, device=device)
            attn_BP[i, P - len(p):] = 1
        stop = torch.tensor(trainer.stop_ids, device=device)
        position_BP = (attn_BP.cumsum(-1) - 1).clamp(min=0)
        if self.packed is not None and model is self.merged:
            self.packed.prepare(N, sampling.max_new_tokens)
        decoder = self.decoder(model, attn_BP.repeat_interleave(n, 0), sampling.max_new_tokens, first_keys is not None)
        with trainer.autocast():
            logits_NV = decoder.prefill(ids_BP, position_BP, n) if first_keys is None else \
                self._gist_prefill(decoder, ids_BP, attn_BP, position_BP, n, first_keys)
        next_pos = position_BP[:, -1:].repeat_interleave(n, 0) + 1
        finished_N = torch.zeros(N, dtype=torch.bool, device=device)
        lengths_N = torch.zeros(N, dtype=torch.long, device=device)
        nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        # Reading a flag back from a GPU waits for every queued kernel, so the host cannot queue the next step
        # while the GPU runs this one; there the flags are read every DECODE_SYNC_EVERY tokens. Steps past the
        # end of every sequence only draw padding, so stopping a few tokens late changes no completion.
        toks, lps, ents = [], [], []
        for step in range(sampling.max_new_tokens):
            greedy = sampling.temperature == 0  # greedy decoding reports logprobs at temperature 1
            scaled_NV = logits_NV.float()
            if not greedy and sampling.temperature != 1.0:
                scaled_NV = scaled_NV / sampling.temperature
            logp_NV = torch.log_softmax(scaled_NV, dim=-1)
            p_NV = logp_NV.exp()
            if greedy:
                tok_N = scaled_NV.argmax(-1)
            elif sampling.top_k == 0 and sampling.top_p >= 1.0:
                tok_N = draw(p_NV, generator)  # untruncated: the softmax is already at hand
            else:
                tok_N = draw(truncate_probs(scaled_NV, sampling.top_p, sampling.top_k), generator)
            tok_N = torch.where(finished_N, torch.full_like(tok_N, pad), tok_N)
            toks.append(tok_N)
            lps.append(logp_NV.gather(-1, tok_N[:, None]).squeeze(-1))
            ents.append(-(p_NV * logp_NV).sum(-1))
            # a row's entropy is finite iff all its logits are: NaN spreads through the log-softmax, +inf gives
            # inf - inf, -inf gives 0 * -inf; one [N] check instead of a pass over [N, V]
            nonfinite |= ~torch.isfinite(ents[-1]).all()
            lengths_N += (~finished_N).long()
            finished_N |= torch.isin(tok_N, stop)
            if (step + 1) % self.decode_sync_every == 0 or step + 1 == sampling.max_new_tokens:
                if bool(nonfinite):  # a NaN model draws garbage tokens: stop at once, loudly
                    raise ExperimentError("sampling produced non-finite logits (model weights or logits are NaN/inf)")
                if bool(finished_N.all()) or step + 1 == sampling.max_new_tokens:
                    break
            with trainer.autocast():
                logits_NV = decoder.step(tok_N, next_pos)
            next_pos = next_pos + 1
        self.graphs_work = self.graphs_work and getattr(decoder, "graphed", True)
        tokens_NC, logprobs_NC, ent_NC = torch.stack(toks, 1), torch.stack(lps, 1), torch.stack(ents, 1)
        if not torch.isfinite(logprobs_NC).all():
            raise ExperimentError("sampling produced non-finite logprobs (model weights or logits are NaN/inf)")
        return tokens_NC.cpu(), logprobs_NC.cpu(), ent_NC.cpu(), lengths_N.cpu(), finished_N.cpu()
