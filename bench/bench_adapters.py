"""Memory of named adapters: RSS of the local engine on SmolLM2 with one LoRA adapter vs two on the same base.

Each count runs in its own process (RSS is per process and never shrinks): load the engine, create the
adapters, give each one training step (so its optimizer moments exist) and one sampling call, then read the
resident and peak RSS. Writes bench/results/adapters-DATE-HOST.json and prints the ratio.

    .venv/bin/python bench/bench_adapters.py [--model embedded:smollm2-135m-instruct] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(model: str, dtype: str, adapters: int) -> dict:
    from purplerl.algorithms.registry import CrossEntropyParams, Loss
    from purplerl.config import ModelConfig
    from purplerl.engines import make_engine
    from purplerl.train.batch import sequence_tensors
    from purplerl.types import AdamParams, SamplingParams, TrainBatch

    engine = make_engine(ModelConfig(name=model, dtype=dtype))
    loaded = rss_mib()
    names = ["default"] + [f"adapter{i}" for i in range(1, adapters)]
    for name in names[1:]:
        engine.create_adapter(name)
    prompt = engine.tokenizer.encode("Write a short poem about the sea.")
    for name in names:
        engine.use_adapter(name)
        completions = engine.sample([prompt], 4, SamplingParams(max_new_tokens=32, seed=0))[0]
        batch = TrainBatch(**sequence_tensors(completions, int(engine.tokenizer.pad_token_id)))
        engine.forward_backward(batch, Loss("cross_entropy", CrossEntropyParams()))
        engine.optim_step(AdamParams(lr=1e-4))
    return {"adapters": adapters, "rss_after_load_mib": loaded, "rss_mib": rss_mib(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", type=Path, help="result file (default: bench/results/adapters-DATE-HOST.json)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.model, args.dtype, args.child)))
        return
    rows = []
    for count in (1, 2):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--dtype", args.dtype,
                              "--child", str(count)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    one, two = rows
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": socket.gethostname(), "model": args.model,
              "dtype": args.dtype, "runs": rows,
              "rss_ratio": two["rss_mib"] / one["rss_mib"], "peak_ratio": two["peak_rss_mib"] / one["peak_rss_mib"]}
    default = Path(__file__).parent / "results" / f"adapters-{time.strftime('%Y-%m-%d')}-{socket.gethostname()}.json"
    path = args.out or default
    path.write_text(json.dumps(result, indent=1))
    print(f"RSS one adapter {one['rss_mib']:.0f} MiB, two {two['rss_mib']:.0f} MiB (x{result['rss_ratio']:.3f}); "
          f"peak {one['peak_rss_mib']:.0f} -> {two['peak_rss_mib']:.0f} MiB (x{result['peak_ratio']:.3f}); "
          f"wrote {path}")


if __name__ == "__main__":
    main()
