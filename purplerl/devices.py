"""Which torch device a setting names: the one resolver the engines, scorers and judges share."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from purplerl.errors import UserError

if TYPE_CHECKING:
    import torch


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' (or 'cuda:N') without a GPU is a UserError."""
    import torch  # deferred: the config layer imports this module and must not pay for torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device '{name}' requested but no CUDA device is available (use --device cpu)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device '{name}' (use auto, cpu or cuda)") from None


# a CPU's kind: its fastest matmul instructions, from the flags Linux lists in /proc/cpuinfo (torch has no public
# probe): AMX tiles, AVX512 with bf16 dot products, AVX2 (fp32 only); bf16 matmuls are fast on the first two
CPU_KINDS = ("amx", "avx512_bf16", "avx2", "baseline")
FAST_BF16_KINDS = ("amx", "avx512_bf16")


def cpu_kind(cpuinfo: str | None = None) -> str:
    """This CPU's kind (CPU_KINDS), from `cpuinfo` (the text of /proc/cpuinfo; read when None). 'baseline' when
    the flags say none of them or cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "baseline"
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(line.partition(":")[2].split())
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return "avx2" if "avx2" in flags else "baseline"
