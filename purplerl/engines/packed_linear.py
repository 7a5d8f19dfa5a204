"""The sampler's linear layers over bf16 weights prepacked for oneDNN, where this machine measures that it pays.

A decode step multiplies a few rows (one token per sequence) by every weight of the model. At 32 rows oneDNN's
bf16 matmul reached 11-34% of an AMX CPU's peak: each call also reorders the weight into the blocked layout its
kernels read. A weight reordered once (`torch.ops.mkldnn._reorder_linear_weight`, the call torch's own CPU compiler
makes) skips that: 1.2-1.5x faster at 32 rows on that CPU, with the same bits (bench/NOTES.md, "Where AMX time
goes"). What pays differs by CPU kind, so it is measured: once per machine (CPU model, torch version, the model's
weight shapes, the decode's rows), cached under $PURPLERL_CACHE/machine/, and used only when it is at least
PACKED_MARGIN faster there. The packed copy must be rebuilt after every change of the weights (the merged sampler's
copy changes after each optimizer step), so a decode uses it only when its tokens save more than the repack costs.
It holds a second copy of the packed weights while in use.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
import types
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from purplerl.devices import cpu_kind
from purplerl.engines.model_cache import PACKED_CACHE, cache_dir

PACKED_MAX_ROWS = 128  # a prefill has more rows: there the packed kernel was no faster (slower at 384 rows)
PACKED_MARGIN = 0.9  # chosen only where it measures at least 10% faster: timing noise must not pick a loser
_PACKED = "_purplerl_packed"
_REPEATS = 3


@dataclass(frozen=True)
class PackTiming:
    """One machine's measurement for one model at one decode batch: seconds per decoded token over all the model's
    linear layers, plain and packed, and the seconds to pack them all."""

    plain_s: float
    packed_s: float
    pack_s: float

    @property
    def pays(self) -> bool:
        return self.packed_s <= PACKED_MARGIN * self.plain_s


def packing_available(device: torch.device) -> bool:
    """This torch has the oneDNN bf16 linear kernels, on CPU."""
    mkldnn = torch.ops.mkldnn
    return (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(mkldnn, "_reorder_linear_weight") and hasattr(mkldnn, "_linear_pointwise")
            and bool(mkldnn._is_mkldnn_bf16_supported()))


def use_packed(timing: PackTiming, packed_now: bool, new_tokens: int) -> bool:
    """Whether a decode of `new_tokens` tokens runs the packed weights: where they are faster here, and, when the
    weights changed since they were packed, where the tokens save more than the repack costs."""
    if not timing.pays:
        return False
    return packed_now or (timing.plain_s - timing.packed_s) * new_tokens > timing.pack_s


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packed = self.__dict__.get(_PACKED)
    if packed is None or x.dtype != packed.dtype or x.numel() > PACKED_MAX_ROWS * x.shape[-1] \
            or torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16]


class PackedLinears:
    """The bf16 linear layers of a model that only decodes (the merged sampler's copy), each able to run over a
    packed copy of its weight. `prepare` before a decode packs them (or drops the packs) by the measurement;
    `invalidate` after the weights changed."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.linears = _linears(model)
        self.packed = False  # every linear holds a pack of its current weight
        self.timings: dict[int, PackTiming] = {}  # by decode rows: this process's copy of the machine's cache
        for module in self.linears:
            module.forward = types.MethodType(_packed_forward, module)

    def invalidate(self) -> None:
        """The weights changed: the packs no longer hold them."""
        self._drop()

    def prepare(self, rows: int, new_tokens: int) -> bool:
        """Pack (or keep the packs) for a decode of `rows` sequences x `new_tokens`, where that pays on this
        machine; else drop them. Returns whether the decode runs packed."""
        if not self.linears or rows > PACKED_MAX_ROWS:
            return False
        if rows not in self.timings:
            self.timings[rows] = machine_timing(self.linears, rows)
        if not use_packed(self.timings[rows], self.packed, new_tokens):
            self._drop()
            return False
        if not self.packed:
            self._pack(rows)
        return True

    def _pack(self, rows: int) -> None:
        for module in self.linears:
            module.__dict__[_PACKED] = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows)
        self.packed = True

    def _drop(self) -> None:
        for module in self.linears:
            module.__dict__.pop(_PACKED, None)
        self.packed = False


def _best_seconds(fn) -> float:
    best = float("inf")
    for _ in range(_REPEATS + 1):  # the first call warms the kernels up
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@torch.no_grad()
def measure(linears: list[torch.nn.Linear], rows: int) -> PackTiming:
    """Time one decoded token's pass over `linears` at `rows` rows, plain and packed (their own weights, streamed
    in order as a decode step reads them), and the packing of them all."""
    inputs = {m.in_features: torch.randn(rows, m.in_features, dtype=torch.bfloat16) for m in linears}
    plain_s = _best_seconds(lambda: [F.linear(inputs[m.in_features], m.weight) for m in linears])
    packs: list[torch.Tensor] = []
    pack_s = _best_seconds(lambda: packs.__setitem__(slice(None), [
        torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows) for m in linears]))
    pairs = list(zip(linears, packs, strict=True))
    packed_s = _best_seconds(lambda: [torch.ops.mkldnn._linear_pointwise(inputs[m.in_features], p, None, "none", [],
                                                                         "") for m, p in pairs])
    return PackTiming(plain_s=plain_s, packed_s=packed_s, pack_s=pack_s)


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def machine_key(linears: list[torch.nn.Linear], rows: int) -> str:
    """What a measurement depends on: the CPU, its cores, torch, the weight shapes (with their counts) and rows."""
    shapes = sorted(Counter((m.out_features, m.in_features) for m in linears).items())
    what = json.dumps([_cpu_name(), cpu_kind(), os.cpu_count(), torch.__version__, torch.get_num_threads(), rows,
                       shapes])
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def cache_file() -> Path:
    return cache_dir() / PACKED_CACHE


def _read_cache(path: Path) -> dict:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or a damaged one: measured again and rewritten
        return {}
    return cached if isinstance(cached, dict) else {}


def machine_timing(linears: list[torch.nn.Linear], rows: int) -> PackTiming:
    """This machine's PackTiming for these layers at `rows`: from the cache, else measured and cached."""
    path, key = cache_file(), machine_key(linears, rows)
    cached = _read_cache(path).get(key)
    if isinstance(cached, dict):
        with contextlib.suppress(TypeError, ValueError):
            return PackTiming(**{k: float(cached[k]) for k in ("plain_s", "packed_s", "pack_s")})
    timing = measure(linears, rows)
    with contextlib.suppress(OSError):  # a read-only cache costs a measurement per process, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = {**_read_cache(path), key: {**asdict(timing), "faster": timing.pays, "cpu": _cpu_name(),
                                               "cpu_kind": cpu_kind(), "rows": rows, "torch": torch.__version__}}
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(entries, indent=1))
        partial.replace(path)  # atomic: a concurrent reader sees the old file or the new one
    return timing
