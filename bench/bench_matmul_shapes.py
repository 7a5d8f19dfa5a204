"""The matmuls of a GRPO step at their own shapes: which kernel runs each, and how fast. `make bench-matmul-shapes`.

The embedded SmolLM2-135M's linear layers (hidden 576, 192-wide K/V projections, 1536-wide MLP, a 49,152-row LM
head) at the row counts a step uses: 32 (one decode token of 8 prompts x 4 answers), 256 (a prompt prefill) and
1536 (a training micro-batch of 32 x 48 tokens). For each shape and dtype, the time of `F.linear(x, w)` (the
model's own call) against the matmul peak measured on a large square product, and the weight bandwidth it reaches
(the decode floor: a decode step must read every weight once). With `--verbose` each shape runs once more in a
child process under ONEDNN_VERBOSE=1, and the kernel oneDNN dispatched (its implementation name, e.g.
`brg_matmul:avx10_1_512_amx`) or `aten` (torch's own kernel: oneDNN was not called) is recorded per shape.

Levers measured at the same shapes (bench/NOTES.md, issue 37):
- `transposed`: the weight stored transposed ([in, out], contiguous), the product as `x @ w_t`;
- `mkldnn`: the layer prepacked for oneDNN through torch's own API (`torch.utils.mkldnn.to_mkldnn`).

Writes bench/results/matmul-shapes-<date>-<host>-<kind>.json and prints a table. Run alone.
Run: .venv/bin/python bench/bench_matmul_shapes.py [--repeats 50] [--verbose]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).parent / "results"
HIDDEN, KV, MLP, VOCAB = 576, 192, 1536, 49152
LAYERS = {"q/o": (HIDDEN, HIDDEN), "k/v": (HIDDEN, KV), "gate/up": (HIDDEN, MLP), "down": (MLP, HIDDEN),
          "lm_head": (HIDDEN, VOCAB)}
ROWS = (32, 256, 1536)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cpu_kind() -> str:
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    return "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "avx2"


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def peak(dtype: torch.dtype) -> float:
    """FLOP/s of a 2048^3 product: the matmul peak these shapes are compared with."""
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    return 2 * 2048**3 / timed(lambda: a @ b, 10)


def variants(x: torch.Tensor, w: torch.Tensor) -> dict[str, object]:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
    linear.weight.data.copy_(w)
    out = {"linear": lambda: F.linear(x, w)}
    w_t = w.t().contiguous()
    out["transposed"] = lambda: x @ w_t
    try:
        from torch.utils import mkldnn

        packed = mkldnn.to_mkldnn(torch.nn.Sequential(linear), w.dtype)
        packed(x)  # MkldnnLinear takes a dense input and returns a dense output
        out["mkldnn"] = lambda: packed(x)
    except (RuntimeError, TypeError, ValueError) as e:  # a dtype this build cannot prepack
        out["mkldnn"] = str(e).splitlines()[0]
    return out


def measure(repeats: int) -> list[dict[str, object]]:
    rows = []
    for dname, dtype in DTYPES.items():
        for layer, (k, n) in LAYERS.items():
            w = torch.randn(n, k, dtype=dtype) / k**0.5
            for m in ROWS:
                x = torch.randn(m, k, dtype=dtype)
                flops, weight_bytes = 2 * m * k * n, w.numel() * w.element_size()
                row = {"dtype": dname, "layer": layer, "m": m, "k": k, "n": n}
                for name, fn in variants(x, w).items():
                    if isinstance(fn, str):
                        row[name] = {"error": fn}
                        continue
                    s = timed(fn, repeats)
                    row[name] = {"s": s, "gflops": flops / s / 1e9, "weight_gbs": weight_bytes / s / 1e9}
                rows.append(row)
    return rows


def kernels() -> dict[str, str]:
    """{"dtype layer m": oneDNN's implementation name, or "aten"} from one call per shape in a child process."""
    found = {}
    for dname in DTYPES:
        for layer, (k, n) in LAYERS.items():
            for m in ROWS:
                code = (f"import torch, torch.nn.functional as F; d = {DTYPES[dname]}"  # str(dtype): torch.NAME
                        + f"; x = torch.randn({m}, {k}, dtype=d); w = torch.randn({n}, {k}, dtype=d)"
                        + "; F.linear(x, w); print('---', flush=True); F.linear(x, w)")
                env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": str(torch.get_num_threads())}
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                     check=True).stdout.split("---", 1)[-1]
                execs = [line.split(",") for line in out.splitlines() if line.startswith("onednn_verbose")
                         and ",exec," in line]
                names = sorted({parts[5] for parts in execs if len(parts) > 5})
                found[f"{dname} {layer} {m}"] = ", ".join(names) or "aten"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--verbose", action="store_true", help="record the oneDNN kernel of each shape")
    args = parser.parse_args()
    torch.manual_seed(0)
    kind = cpu_kind()
    peaks = {name: peak(dtype) for name, dtype in DTYPES.items()}
    rows = measure(args.repeats)
    dispatched = kernels() if args.verbose else {}
    for row in rows:
        row["kernel"] = dispatched.get(f"{row['dtype']} {row['layer']} {row['m']}")
        row["linear"]["of_peak"] = row["linear"]["gflops"] * 1e9 / peaks[row["dtype"]]
    print(f"{kind}, {torch.get_num_threads()} threads; peak fp32 {peaks['fp32'] / 1e9:.0f}, "
          f"bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s")
    print(f"{'dtype':5} {'layer':8} {'m':>5} | {'linear GF/s':>11} {'of peak':>7} {'w GB/s':>7} | "
          f"{'transposed':>10} {'mkldnn':>8} | kernel")
    for r in rows:
        lin = r["linear"]
        alt = [f"{r[v]['gflops']:.0f}" if "gflops" in r[v] else "n/a" for v in ("transposed", "mkldnn")]
        print(f"{r['dtype']:5} {r['layer']:8} {r['m']:>5} | {lin['gflops']:>11.0f} {lin['of_peak']:>7.1%} "
              f"{lin['weight_gbs']:>7.1f} | {alt[0]:>10} {alt[1]:>8} | {r['kernel'] or ''}")
    RESULTS.mkdir(exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", platform.node())[:40]
    path = RESULTS / f"matmul-shapes-{datetime.date.today()}-{host}-{kind}.json"
    path.write_text(json.dumps({"date": str(datetime.date.today()), "host": host, "cpu_kind": kind,
                                "threads": torch.get_num_threads(), "torch": torch.__version__,
                                "peak_gflops": {k: v / 1e9 for k, v in peaks.items()}, "shapes": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
