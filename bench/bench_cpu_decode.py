"""Where CPU sampling's time goes, and the KV-cache strategy on the CPU. `make bench-cpu-decode`.

One `LocalEngine.sample` of the GRPO benchmark's work (8 red-team prompts x 4 answers x 48 tokens) on the embedded
SmolLM2-135M-Instruct, in this process:
1. a warm-up, then the torch profiler over one sample: the ops by self CPU time;
2. the growing KV cache (the CPU default) against the static cache the CUDA path uses (forced through the sampler's
   `decode_static` hook), greedy, interleaved --repeats times, and whether their greedy texts are identical.
Writes bench/results/cpu-decode-<date>-<host>.json and prints both. Run alone: another torch process on 2 cores
slows this one several times.
Run: .venv/bin/python bench/bench_cpu_decode.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
PROMPTS, GROUP, TOKENS = 8, 4, 48


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    args = parser.parse_args()

    from torch.profiler import ProfilerActivity, profile

    from purplerl.config import DataConfig, ModelConfig
    from purplerl.data import load_prompts
    from purplerl.engines.local import LocalEngine
    from purplerl.types import SamplingParams

    engine = LocalEngine(ModelConfig(name=args.model, device="cpu"))
    tok = engine.tokenizer
    records = load_prompts(DataConfig(source="builtin:redteam"))[:PROMPTS]
    prompts = [tok.encode(tok.apply_chat_template(list(r.messages), add_generation_prompt=True, tokenize=False),
                          add_special_tokens=False) for r in records]
    sampled = SamplingParams(max_new_tokens=TOKENS, temperature=1.0, top_p=1.0, top_k=0, seed=0)
    engine.sample(prompts, GROUP, sampled)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        engine.sample(prompts, GROUP, sampled)
        profiled_s = time.perf_counter() - started
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    ops = [{"op": e.key, "self_s": round(e.self_cpu_time_total / 1e6, 3), "share": round(e.self_cpu_time_total / total,
                                                                                           4), "calls": e.count}
           for e in events[:15]]

    greedy = SamplingParams(max_new_tokens=TOKENS, temperature=0.0, top_p=1.0, top_k=0, seed=0)
    times: dict[str, list[float]] = {"growing": [], "static": []}
    texts: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, mode in (("growing", None), ("static", "static")):
            engine.sampler.decode_static = mode
            started = time.perf_counter()
            groups = engine.sample(prompts, GROUP, greedy)
            times[name].append(round(time.perf_counter() - started, 2))
            texts[name] = [c.text for group in groups for c in group]
    engine.sampler.decode_static = None

    result = {"date": datetime.date.today().isoformat(), "host": platform.node(), "cpu": platform.processor(),
              "work": {"prompts": PROMPTS, "group": GROUP, "new_tokens": TOKENS}, "profiled_sample_s": profiled_s,
              "top_ops": ops, "kv_cache_s": times, "same_greedy_texts": texts["growing"] == texts["static"]}
    for row in ops:
        print(f"{row['op'][:50]:50s} {row['self_s']:7.3f} s {100 * row['share']:5.1f}% {row['calls']:7d} calls")
    print(f"growing cache {times['growing']} s; static cache {times['static']} s; "
          f"same greedy texts: {result['same_greedy_texts']}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"cpu-decode-{result['date']}-{result['host']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
