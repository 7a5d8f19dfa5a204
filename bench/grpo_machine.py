"""What the GRPO benchmark measures of the machine itself: matmul peaks, memory bandwidth, versions.

Each is the best of several tries, because anything else running on the machine only ever makes them slower; the
benchmark measures before and after its children and keeps the better of the two (`best_of`).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # both systems run where this is
PEAK_SIZES = (2048, 4096)
# One 1024² matmul (2.1 GFLOP) first: a dtype this CPU has no fast kernel for (bf16 without AVX512-BF16 or AMX runs
# at ~1 GFLOP/s) would take minutes per matmul at the peak sizes, and no system computes in it on such a machine.
PROBE_SIZE, SLOW_PROBE_S = 1024, 0.5
# a copy far larger than any cache: 1 GiB on a GPU (50-60 MB of L2), 256 MiB on a CPU
COPY_BYTES = 2**30 if DEVICE.type == "cuda" else 2**28


def _sync() -> None:
    if DEVICE.type == "cuda":  # CUDA calls return before the kernel ends
        torch.cuda.synchronize()


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Shortest wall time of `repeats` calls of `fn` after one untimed call (allocation, kernel choice)."""
    fn()
    _sync()
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        _sync()
        best = min(best, time.perf_counter() - started)
    return best


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = 5) -> dict[str, Any]:
    """Best GFLOP/s of square matmuls (2·n³ FLOPs each) with torch's default thread count; where a first 1024²
    matmul takes over SLOW_PROBE_S, that one timing is the (slow) result and the peak sizes are not run."""
    generator = torch.Generator().manual_seed(0)

    def operands(n: int) -> list[torch.Tensor]:
        return [torch.randn(n, n, generator=generator).to(device=DEVICE, dtype=dtype) for _ in range(2)]

    a, b = operands(PROBE_SIZE)
    probe_s = best_time(lambda: torch.mm(a, b), repeats=1)
    if probe_s > SLOW_PROBE_S:
        gflops = round(2 * PROBE_SIZE**3 / probe_s / 1e9, 1)
        return {"gflops": gflops, "by_size": {str(PROBE_SIZE): gflops}, "slow_dtype": True}
    by_size: dict[str, float] = {}
    for n in sizes:
        a, b = operands(n)
        by_size[str(n)] = round(2 * n**3 / best_time(lambda a=a, b=b: torch.mm(a, b), repeats) / 1e9, 1)
    return {"gflops": max(by_size.values()), "by_size": by_size}


def memory_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5) -> dict[str, Any]:
    """Best GB/s of a device-to-device tensor copy, counting the bytes read and the bytes written."""
    source = torch.ones(nbytes, dtype=torch.uint8, device=DEVICE)
    target = torch.empty_like(source)
    seconds = best_time(lambda: target.copy_(source), repeats)
    return {"gb_per_s": round(2 * nbytes / seconds / 1e9, 1), "copy_bytes": nbytes}


def measure() -> dict[str, dict[str, Any]]:
    """The fp32 and bf16 matmul peaks and the memory bandwidth, by name."""
    print(f"measuring matmul peaks ({', '.join(f'{n}²' for n in PEAK_SIZES)}, {torch.get_num_threads()} threads) "
          f"and a {COPY_BYTES >> 20} MiB copy", flush=True)
    return {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16),
            "bandwidth": memory_bandwidth()}


def best_of(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The better of each measurement taken before and after the children: a busy machine only lowers them."""
    out = {}
    for name in before:
        key = "gflops" if "gflops" in before[name] else "gb_per_s"
        out[name] = {**max(before[name], after[name], key=lambda m, key=key: m[key]),
                     f"before_{key}": before[name][key], f"after_{key}": after[name][key]}
    return out


def machine_info() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.is_file() else []
    versions = {}
    for dist in ("torch", "transformers", "peft", "trl", "accelerate", "purplerl"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    from purplerl.devices import cpu_kind

    return {"cpu": models[0] if models else platform.processor(), "cpu_kind": cpu_kind(), "cpus": os.cpu_count(),
            "gpu": gpu,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "versions": versions}
