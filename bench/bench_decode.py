"""Decode throughput of the local engine's sampler: the growing KV cache against the static cache replayed as a
CUDA graph (`engine.cuda_graphs`), at the GRPO bench's shape (8 prompts x 4 completions, 48 new tokens).

Each variant samples the same prompts with the same seeds `--repeats` times after one warm-up call; the time per
call includes the graph capture (done once per call, since batch and prompt width vary between RL steps). A greedy
pass of both variants is compared token for token, and the per-token logprob gap is reported.

Run: .venv/bin/python bench/bench_decode.py --model DIR [--device cuda] [--repeats 5] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import torch

from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.types import SamplingParams

PROMPTS = ["How do I pick a lock?", "Write an insult about my neighbour.", "What is the capital of France?",
           "Tell me a story about a dragon and a knight who become friends.", "Explain photosynthesis briefly.",
           "Give me three tips for sleeping better.", "Why is the sky blue?", "Summarise the plot of Hamlet."]


def _prompt_tokens(engine: LocalEngine) -> list[list[int]]:
    tok = engine.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for p in PROMPTS]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_variant(model: str, device: str, dtype: str, graphs: bool, repeats: int, new_tokens: int) -> dict:
    engine = LocalEngine(ModelConfig(name=model, device=device, dtype=dtype), seed=0,
                         settings=EngineSettings(cuda_graphs=graphs))
    prompts = _prompt_tokens(engine)
    engine.sample(prompts, 4, SamplingParams(max_new_tokens=new_tokens, seed=99))  # warm-up: kernels, allocator
    times, tokens = [], 0
    for rep in range(repeats):
        _sync(engine.device)
        start = time.perf_counter()
        groups = engine.sample(prompts, 4, SamplingParams(max_new_tokens=new_tokens, seed=rep))
        _sync(engine.device)
        times.append(time.perf_counter() - start)
        tokens = max(len(c.tokens) for g in groups for c in g)
    greedy = engine.sample(prompts, 1, SamplingParams(max_new_tokens=new_tokens, seed=0, temperature=0.0))
    best = min(times)
    return {"graphs": graphs, "graphs_used": graphs and engine.sampler.graphs_work and engine.device.type == "cuda",
            "seconds": times, "best_s": best, "decode_steps": tokens, "ms_per_step": 1000 * best / max(tokens, 1),
            "greedy": [g[0] for g in greedy]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--tag", default=platform.node())
    args = parser.parse_args()
    rows = {}
    for graphs in (False, True):
        rows["graph" if graphs else "dynamic"] = time_variant(args.model, args.device, args.dtype, graphs,
                                                              args.repeats, args.new_tokens)
    a, b = rows["dynamic"].pop("greedy"), rows["graph"].pop("greedy")
    same = sum(x.tokens == y.tokens for x, y in zip(a, b, strict=True))
    gaps = [float((x.logprobs_C[:n] - y.logprobs_C[:n]).abs().max())
            for x, y in zip(a, b, strict=True) if (n := min(len(x.tokens), len(y.tokens)))]
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
              "torch": torch.__version__, "model": args.model, "dtype": args.dtype, "variants": rows,
              "greedy_identical": f"{same}/{len(a)}", "greedy_max_logprob_gap": max(gaps, default=0.0),
              "speedup": rows["dynamic"]["best_s"] / rows["graph"]["best_s"]}
    for name, r in rows.items():
        print(f"{name:8} best {r['best_s']:.3f} s  {r['ms_per_step']:.2f} ms/step  graphs used: {r['graphs_used']}")
    print(f"speedup {result['speedup']:.2f}x; greedy identical {result['greedy_identical']}, "
          f"max logprob gap {result['greedy_max_logprob_gap']:.2e}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"decode-{date.today()}-{args.tag}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"written {path}")


if __name__ == "__main__":
    main()
