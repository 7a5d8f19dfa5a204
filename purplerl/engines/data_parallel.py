"""Data parallel: the local engine in every process of a torchrun group, gradients summed across them.

Why a wrapper engine and not an all-reduce inside `LocalEngine` or the loop: the seam is where a gradient
becomes the global one, and only `forward_backward` knows how its loss was normalized. Each rank trains on its
own shard of the rollout batch, normalized by its own counts; this wrapper then weighs the rank's gradient by
its share of the global count the loss divides by (loss tokens for `token_mean`, sequences for the
sequence-mean modes and for losses of whole sequences) and sums over the ranks. For token_mean:
    sum_r (N_r / N) * grad(sum_{tokens of r} l / N_r) = grad(sum_{all tokens} l / N),
the single-process gradient of the global batch, however the tokens fall on the ranks (per-rank means averaged
would weigh a rank of short answers as much as one of long answers). Each `forward_backward` returns with the
global gradient accumulated, so `optim_step` (clipping, AdamW) runs unchanged and identically on every rank,
and the weights stay equal without being sent again. The loop stays engine-agnostic: it shards the prompts
and gathers step results through `World`, which is the single process for every other engine.

Sampling draws from a per-rank seed (rank 0's is the single-process seed), and the global RNG (LoRA dropout)
is reseeded per rank; `save` is a collective that hands every rank's RNG state to rank 0, which writes the
checkpoint, and `load` restores each rank's own.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from purplerl.algorithms.registry import CustomLoss, Loss, normalizer_count
from purplerl.engines.distributed import World
from purplerl.engines.loading import load_tensors
from purplerl.engines.local import LocalEngine
from purplerl.errors import UserError
from purplerl.types import AdamParams, Completion, SamplingParams, TrainBatch

RANK_RNG_FILE = "rng_ranks.pt"  # every rank's global RNG state, by rank


def rank_seed(seed: int, rank: int) -> int:
    """A seed of its own for each rank; rank 0 keeps the single-process seed."""
    return seed if rank == 0 else (seed * 1_000_003 + 7_919 * rank) % (2**63 - 1)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


class DataParallelEngine:
    """A LocalEngine in each of `world.size` processes; see the module docstring."""

    def __init__(self, inner: LocalEngine, world: World) -> None:
        self.inner, self.world = inner, world
        self.tokenizer = inner.tokenizer
        self._broadcast_weights()  # equal by seeding already; made certain, as every later update relies on it
        if world.rank:
            torch.manual_seed(rank_seed(inner.seed, world.rank))

    @property
    def sample_metrics(self) -> dict[str, float]:
        return self.inner.sample_metrics  # this rank's sampler's report

    def __getattr__(self, name: str) -> Any:  # adapters, active_adapter, device, cfg, ...: the local engine's
        # not set yet (no recursion through __getattr__), or adapter mixing, which data parallel has not
        # (engines.capabilities: each rank's rows of each label differ in number, one weight per call does not follow)
        if name == "inner" or name in ("use_adapters", "adapter_scales"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _broadcast_weights(self) -> None:
        """Rank 0's weights of every adapter on every rank (also a point where all ranks meet)."""
        active = self.inner.active_adapter
        for name in self.inner.adapters:
            self.inner.use_adapter(name)
            with torch.no_grad():
                for p, m in zip(self.inner.trainable, self.inner.master, strict=True):
                    self.world.broadcast_(m.data, "sharing the weights")
                    if m is not p:
                        p.copy_(m)
        self.inner.use_adapter(active)

    def create_adapter(self, name: str, init: str | Path | None = None, head: bool = False) -> None:
        self.inner.create_adapter(name, init, head=head)
        self._broadcast_weights()

    def sample(self, prompt_tokens: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        return self.inner.sample(prompt_tokens, n, dataclasses.replace(sampling, seed=rank_seed(sampling.seed,
                                                                                                 self.world.rank)))

    def gist_sample(self, prompt_tokens: list[list[int]], first_keys: list[list[int]], n: int,
                    sampling: SamplingParams) -> list[list[Completion]]:
        return self.inner.gist_sample(prompt_tokens, first_keys, n,
                                      dataclasses.replace(sampling, seed=rank_seed(sampling.seed, self.world.rank)))

    def forward_backward(self, batch: TrainBatch, loss: Loss) -> dict[str, float]:
        return self._global(batch, normalizer_count(batch, loss), lambda: self.inner.forward_backward(batch, loss))

    def forward_backward_custom(self, batch: TrainBatch, loss: CustomLoss) -> dict[str, float]:
        return self._global(batch, batch.num_sequences, lambda: self.inner.forward_backward_custom(batch, loss))

    def _global(self, batch: TrainBatch, count: int, run: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Run the local backward, then replace its gradient contribution (and metrics) by the global one."""
        masters = self.inner.master
        before = [None if m.grad is None else m.grad.clone() for m in masters]
        metrics = run()
        device = masters[0].device
        counts = torch.tensor([count, batch.num_loss_tokens], dtype=torch.float64, device=device)
        self.world.all_reduce_(counts, "summing the batch counts")
        weight, token_share = count / float(counts[0]), batch.num_loss_tokens / float(counts[1])
        grads = [torch.zeros_like(m) if m.grad is None else m.grad for m in masters]  # an unused weight: none
        deltas = [(g if b is None else g - b).reshape(-1) for g, b in zip(grads, before, strict=True)]
        keys = sorted(k for k in metrics if k != "tokens")
        shares = torch.tensor([metrics[k] * (weight if k == "loss" else token_share) for k in keys],
                              dtype=torch.float32, device=device)
        flat = torch.cat([torch.cat(deltas).float() * weight, shares])
        self.world.all_reduce_(flat, "summing the gradients")
        offset = 0
        for m, b in zip(masters, before, strict=True):
            piece = flat[offset:offset + m.numel()].view_as(m).to(m.dtype)
            m.grad = piece.clone() if b is None else b + piece
            offset += m.numel()
        summed = dict(zip(keys, flat[offset:].tolist(), strict=True))
        return {**summed, "tokens": float(counts[1])}

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        return self.inner.optim_step(adam)  # the gradients are already global: every rank steps identically

    def logprobs(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.inner.logprobs(*args, **kwargs)

    def values(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.inner.values(*args, **kwargs)

    def use_adapter(self, name: str) -> None:
        self.inner.use_adapter(name)

    def save(self, path: Path) -> None:
        """A collective: every rank calls it with the same path; rank 0 writes the checkpoint and every rank's
        RNG state, and no rank returns before the checkpoint is complete (a rank may read it next)."""
        states = self.world.gather(_rng_state())
        if self.world.is_writer:
            self.inner.save(path)
            buffer = io.BytesIO()
            torch.save({"ranks": states}, buffer)
            with open(Path(path) / RANK_RNG_FILE, "wb") as f:
                f.write(buffer.getbuffer())
        self.world.agree(True)  # the others wait here for rank 0's write (a failed write stops the run instead)

    def load(self, path: Path) -> None:
        """Every rank loads the same checkpoint, then takes its own RNG state (a checkpoint of another number of
        processes gives the ranks it lacks a fresh seed)."""
        self.inner.load(path)
        file = Path(path) / RANK_RNG_FILE
        states = load_tensors(file, torch.device("cpu"))["ranks"] if file.is_file() else []
        if not isinstance(states, list):
            raise UserError(f"{file} does not hold per-rank RNG states")
        if self.world.rank < len(states):
            torch.set_rng_state(states[self.world.rank]["cpu"])
            if "cuda" in states[self.world.rank] and torch.cuda.is_available():
                torch.cuda.set_rng_state(states[self.world.rank]["cuda"], torch.cuda.current_device())
        elif self.world.rank:
            torch.manual_seed(rank_seed(self.inner.seed, self.world.rank))
        # no rank goes on (and rank 0 starts cleaning the run dir) before every rank has read the checkpoint
        self._broadcast_weights()
