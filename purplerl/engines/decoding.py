"""The model side of the local engine's decode loop: a prefill, then one forward per drawn token.

Two ways to hold the KV cache:
- `DynamicDecoder`: transformers' DynamicCache, which grows by one position per token (a concatenation per
  layer). The default wherever CUDA graphs are not used.
- `StaticDecoder`: a cache preallocated for the whole completion (transformers' StaticCache, which keeps its
  write position on the device), with the step's inputs (token, position, attention mask) in buffers updated in
  place. Every tensor the step touches then stays at a fixed address, so on a GPU the step is recorded once as a
  CUDA graph and replayed with one launch per token. A small model's decode step is bound by the host, not the
  GPU: SmolLM2's 30 layers launch ~1,000 kernels per token, ~23 ms on an H200 (bench/NOTES.md), for well under a
  millisecond of GPU work.

Both compute the same function: the static cache's unused positions are masked out, so they add exactly zero to
each softmax. The prefill takes each distinct prompt once with the number of rows that continue it (a GRPO group
samples G answers to one prompt): the growing cache runs the B distinct prompts and repeats their keys and values
G times, so the prompt's FLOPs are paid once per group; the static cache, which cannot grow a batch, prefills every
row (on a GPU, where it is used, a prefill is a few large matmuls). Only the last position's logits are computed
where the model can skip the others (`logits_to_keep`), not a vocabulary-wide row per prompt token.
`tests/engines/test_decoding.py` checks the two against each other on CPU (without the graph) and
`tests/engines/test_engine_cuda.py` the graph against eager decoding on a GPU.
"""

from __future__ import annotations

import sys

import torch


class DynamicDecoder:
    """Decoding over a cache that grows by one position per token."""

    def __init__(self, model, cache_kwarg: str, attn_NP: torch.Tensor, last_logits: dict | None = None) -> None:
        from transformers import DynamicCache

        self.model, self.cache_kwarg, self.last_logits = model, cache_kwarg, last_logits or {}
        self.cache = self._new_cache(DynamicCache, model)
        self.attn = attn_NP

    @staticmethod
    def _new_cache(cache_type, model):
        try:
            return cache_type(config=model.config)
        except TypeError:  # transformers < 4.56 builds its cache without the config
            return cache_type()

    def _forward(self, ids, attn, position):
        keep = self.last_logits
        if keep and ids.shape[1] > 1:
            # the last column as an index, not a slice: the slice of a prefill's hidden states is a strided view,
            # whose LM head torch runs as a batched matmul over a copy of the weight per row (453 MB per prefill of
            # 8 prompts, 12% of sampling on an AMX CPU, bench/NOTES.md); the index gives a contiguous row
            keep = {"logits_to_keep": torch.tensor([ids.shape[1] - 1], device=ids.device)}
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=position, use_cache=True,
                         **{self.cache_kwarg: self.cache}, **keep)
        return out.logits[:, -1, :]

    def prefill(self, ids_BP: torch.Tensor, position_BP: torch.Tensor, repeats: int = 1,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B·repeats, V] after the B (left-padded) distinct prompts, prompt b continued by rows
        b·repeats to b·repeats + repeats - 1 (the rows of the attention mask given at construction). `mask`: a
        4D mask [B, 1, P, P] for the prompts instead (gist prompts, engines.local_scoring.model_inputs)."""
        logits_BV = self._forward(ids_BP, self.attn[::repeats] if mask is None else mask, position_BP)
        if repeats == 1:
            return logits_BV
        if all(hasattr(layer, "batch_repeat_interleave") for layer in getattr(self.cache, "layers", [self.cache])):
            self.cache.batch_repeat_interleave(repeats)
            return logits_BV.repeat_interleave(repeats, dim=0)
        # a cache layer that cannot repeat its batch (a linear-attention state): every row is prefilled instead
        self.cache = self._new_cache(type(self.cache), self.model)
        return self._forward(ids_BP.repeat_interleave(repeats, 0),
                             self.attn if mask is None else mask.repeat_interleave(repeats, 0),
                             position_BP.repeat_interleave(repeats, 0))

    def keep_from(self, first_N: torch.Tensor) -> None:
        """After a gist prompt's prefill: row n attends only its keys from column first_N[n] on (the last gist
        block's start), so the columns before every row's first are cut from the cache and the others masked. The
        decode then reads K keys of history, not the history's length; the outputs are those of the masked forward.
        """
        cut = int(first_N.min())
        layers = getattr(self.cache, "layers", None)
        if layers is None or not all(hasattr(layer, "keys") for layer in layers):
            raise RuntimeError("gist decoding needs a cache of key/value layers")  # a model purplerl does not run
        for layer in layers:
            layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]
        columns = torch.arange(cut, self.attn.shape[1], device=self.attn.device)
        self.attn = self.attn[:, cut:] * (columns[None, :] >= first_N[:, None]).to(self.attn.dtype)

    def step(self, tok_N: torch.Tensor, position_N1: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] after appending one token per row at `position_N1`."""
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        return self._forward(tok_N[:, None], self.attn, position_N1)


class StaticDecoder:
    """Decoding over a KV cache preallocated for prompt + max_new_tokens positions; with `graphed`, each step
    after the first is a replay of one captured CUDA graph.

    Capture needs one eager run of the step first (lazy cuBLAS and allocator state), done on a side stream as
    torch's CUDA graph notes require; that run is the first real decode step, not a throwaway."""

    def __init__(self, model, cache_kwarg: str, attn_NP: torch.Tensor, max_new_tokens: int, graphed: bool,
                 last_logits: dict | None = None) -> None:
        from transformers import StaticCache

        N, P = attn_NP.shape
        self.model, self.cache_kwarg, self.graphed = model, cache_kwarg, graphed
        self.last_logits = last_logits or {}
        self.cache = StaticCache(config=model.config, max_cache_len=P + max_new_tokens)
        device = attn_NP.device
        # the step's inputs: fixed buffers, refilled before every step
        self.mask_N11L = torch.zeros((N, 1, 1, P + max_new_tokens), dtype=torch.bool, device=device)
        self.mask_N11L[:, 0, 0, :P] = attn_NP.bool()
        self.ids_N1 = torch.zeros((N, 1), dtype=torch.long, device=device)
        self.position_N1 = torch.zeros((N, 1), dtype=torch.long, device=device)
        self.column = P  # the cache position the next token is written to
        self.attn_NP = attn_NP
        self.steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits_NV: torch.Tensor | None = None

    def prefill(self, ids_BP: torch.Tensor, position_BP: torch.Tensor, repeats: int = 1) -> torch.Tensor:
        """As DynamicDecoder.prefill, with every row prefilled: the static cache's batch is fixed at allocation."""
        ids_NP, position_NP = ids_BP.repeat_interleave(repeats, 0), position_BP.repeat_interleave(repeats, 0)
        out = self.model(input_ids=ids_NP, attention_mask=self.attn_NP, position_ids=position_NP, use_cache=True,
                         **{self.cache_kwarg: self.cache}, **self.last_logits)
        return out.logits[:, -1, :]

    def _forward(self) -> torch.Tensor:
        # a 4D boolean mask is passed to attention as it is: no mask building, no host sync, inside the graph
        out = self.model(input_ids=self.ids_N1, attention_mask=self.mask_N11L, position_ids=self.position_N1,
                         use_cache=True, **{self.cache_kwarg: self.cache}, **self.last_logits)
        return out.logits[:, -1, :]

    def step(self, tok_N: torch.Tensor, position_N1: torch.Tensor) -> torch.Tensor:
        if self.column >= self.mask_N11L.shape[-1]:
            raise RuntimeError(f"static KV cache full at {self.column} positions")  # a caller bug, not user input
        self.ids_N1.copy_(tok_N[:, None])
        self.position_N1.copy_(position_N1)
        self.mask_N11L[:, 0, 0, self.column] = True
        self.column += 1
        self.steps += 1
        if not self.graphed:
            return self._forward()
        if self.graph is not None:
            self.graph.replay()
            return self.logits_NV.clone()  # the graph's output buffer is overwritten by the next replay
        if self.steps == 1:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits_NV = self._forward()
            torch.cuda.current_stream().wait_stream(side)
            return logits_NV
        return self._capture_and_replay()

    def _capture_and_replay(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.logits_NV = self._forward()
        except Exception as err:  # noqa: BLE001 - a model whose forward cannot be captured still decodes
            # Recording does not run the step, so nothing has been written: the same step runs eagerly instead,
            # and so do the rest. Same maths, only slower: said once on stderr rather than stopping the run.
            print(f"warning: CUDA graph capture of the decode step failed ({type(err).__name__}: "
                  f"{str(err).splitlines()[0] if str(err) else ''}); decoding without graphs", file=sys.stderr)
            self.graphed = False
            return self._forward()
        self.graph = graph
        graph.replay()
        return self.logits_NV.clone()
