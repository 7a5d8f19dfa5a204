"""The processes of one run: who this process is among them, and the few collectives the loop needs.

A run of `procs` processes is started by torchrun (or by `purplerl ... --engine.procs N`, which starts torchrun
itself, see `launch`). torchrun's elastic agent owns the processes: it sets RANK / WORLD_SIZE / LOCAL_RANK and
the rendezvous address, and when one process dies it stops the others. The process group is gloo on CPU and
NCCL on CUDA. Every collective here turns a lost peer into one ExperimentError line, so a survivor never
prints a traceback; the group's timeout bounds a wait on a peer that hangs without dying.
"""

from __future__ import annotations

import atexit
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch

from purplerl.errors import ExperimentError, UserError, first_line

T = TypeVar("T")
# A rank waits this long for its peers in one collective: rank 0 alone writes checkpoints and runs held-out
# evaluations meanwhile, so it must exceed the longest of those. A dead peer is caught sooner by torchrun's
# agent, which stops the survivors within a second of the death.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
LOST_PEER = "continue with --resume RUN_DIR"


@dataclass(frozen=True)
class World:
    """This process among the run's processes (rank 0 writes logs, samples and checkpoints)."""

    rank: int = 0
    size: int = 1

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[T], what: str = "training.batch_size") -> list[T]:
        """This rank's contiguous share of a global batch (whole items: a prompt's group is never split)."""
        if len(items) % self.size:
            raise UserError(f"{what}={len(items)} does not divide by the {self.size} data-parallel processes")
        share = len(items) // self.size
        return list(items[self.rank * share:(self.rank + 1) * share])

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order (picklable objects; tensors travel on the CPU)."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        _collective("gathering step results", torch.distributed.all_gather_object, out, obj)
        return out

    def agree(self, obj: T) -> T:
        """Rank 0's `obj` on every rank: decisions (stop early, collapse) must be the same everywhere."""
        if self.size == 1:
            return obj
        box = [obj]
        _collective("agreeing on rank 0's decision", torch.distributed.broadcast_object_list, box, src=0)
        return box[0]

    def all_reduce_(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place."""
        if self.size > 1:
            _collective(what, torch.distributed.all_reduce, tensor)
        return tensor

    def leave(self) -> None:
        """The end of a run that went well: wait until every rank is done, then tear the group down together."""
        if self.size > 1:
            _collective("finishing the run", torch.distributed.barrier)
            _leave_world()

    def broadcast_(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Rank 0's `tensor` on every rank, in place."""
        if self.size > 1:
            _collective(what, torch.distributed.broadcast, tensor, src=0)
        return tensor


SINGLE = World()


def _collective(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except RuntimeError as err:  # gloo / NCCL report a closed or timed-out peer as RuntimeError subclasses
        raise ExperimentError(f"rank {torch.distributed.get_rank()}: lost another process of the run while "
                              f"{what} ({_cause(err)}); {LOST_PEER}") from None


def _cause(err: BaseException) -> str:
    """The backend's message without its source location: '[.../pair.cc:537] Read error ...' -> 'Read error ...'."""
    return re.sub(r"^\[[^\]]*\]\s*", "", first_line(err))[:100]


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join_world(procs: int, device: torch.device) -> World:
    """The World of this process: joins torchrun's process group (once) when started by torchrun."""
    if not under_torchrun():
        if procs > 1:
            raise UserError(f"engine.procs={procs} needs torchrun: run `purplerl` itself (it starts torchrun), "
                            f"or `torchrun --nproc-per-node {procs} -m purplerl ...`")
        return SINGLE
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if procs not in (1, size):
        raise UserError(f"engine.procs={procs} but torchrun started {size} processes: make them agree")
    if size == 1:
        return SINGLE
    if not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend_for(device), timeout=COLLECTIVE_TIMEOUT)
        atexit.register(_leave_world)
    return World(rank, size)


def _leave_world() -> None:
    """Tear the process group down while the interpreter is whole: left to the interpreter's own teardown, gloo's
    threads can outlive it and abort the process ("terminate called without an active exception") after a
    run that succeeded."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
