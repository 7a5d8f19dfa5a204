"""vLLM's CPU backend as a sampling lever: one GRPO-sized rollout (8 prompts x G=4 = 32 completions, up to 48 new
tokens) on the embedded SmolLM2-135M, drawn by

- `local`: the local engine's hand-written KV-cache decode loop over the merged-LoRA sampler copy;
- `vllm-base`: vLLM with no adapter (the base model: its fastest path);
- `vllm-lora`: vLLM with the engine's LoRA adapter as a LoRARequest (vLLM's draw only);
- `vllm-engine`: the whole `VLLMEngine.sample` (the LoRA draw plus the trainer pass for entropies, the logprob
  mismatch and the IS weights), what an RL step pays.

The adapter is moved off LoRA B = 0 by a few optimizer steps first, so LoRA does real work. Each variant runs in
its own process (vLLM's engine process and thread binding stay out of the others), with one warm-up call and then
`--repeats` timed calls at seeds 1..R. Writes bench/results/sampling-DATE-HOST.json; needs vLLM (.venv-vllm):

    .venv-vllm/bin/python bench/bench_sampling.py [--dtype auto] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = ["Write a short poem about the sea.", "Tell me a joke about cats.", "How do I bake bread?",
           "Explain what a neural network is.", "Give me three tips for sleeping well.",
           "What is the capital of France?", "Describe your ideal weekend.", "Roast my friend who loves puns."]
VARIANTS = ("local", "vllm-base", "vllm-lora", "vllm-engine")
RESULT = "RESULT "


def _moved_adapter(engine, prompts: list[list[int]]) -> None:
    """Three optimizer steps of cross-entropy on sampled text: LoRA B leaves zero, so the adapter is not a no-op."""
    import torch

    from purplerl.algorithms.registry import CrossEntropyParams, Loss
    from purplerl.engines.local import LocalEngine
    from purplerl.train.batch import sequence_tensors
    from purplerl.types import AdamParams, SamplingParams, TrainBatch

    completions = [c for g in LocalEngine.sample(engine, prompts[:2], 2, SamplingParams(max_new_tokens=16))
                   for c in g]
    batch = TrainBatch(**sequence_tensors(completions, int(engine.tokenizer.pad_token_id)))
    for _ in range(3):
        engine.forward_backward(batch, Loss("cross_entropy", CrossEntropyParams()))
        engine.optim_step(AdamParams(lr=1e-3))
    assert any(float(p.abs().max()) > 0 for n, p in engine.model.named_parameters() if "lora_B" in n)
    torch.manual_seed(0)


def measure(variant: str, model: str, dtype: str, repeats: int, group: int, tokens: int) -> dict:
    from purplerl.config import EngineConfig, ModelConfig
    from purplerl.engines import make_engine
    from purplerl.types import SamplingParams

    kind = "local" if variant == "local" else "vllm"
    started = time.perf_counter()
    engine = make_engine(ModelConfig(name=model, dtype=dtype), engine=EngineConfig(kind=kind))
    load_s = time.perf_counter() - started
    texts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  tokenize=False) for p in PROMPTS]
    prompts = [engine.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    _moved_adapter(engine, prompts)

    def draw(seed: int) -> tuple[int, dict]:
        params = SamplingParams(max_new_tokens=tokens, seed=seed)
        if variant in ("local", "vllm-engine"):
            groups = engine.sample(prompts, group, params)
            return sum(len(c.tokens) for g in groups for c in g), dict(engine.sample_metrics)
        if variant == "vllm-lora":
            drawn = engine._draw([p for p in prompts for _ in range(group)], params)
            return sum(len(d[0]) for d in drawn), {}
        from vllm import SamplingParams as VLLMSamplingParams

        vparams = [VLLMSamplingParams(max_tokens=tokens, seed=seed * 1000 + i, logprobs=0, ignore_eos=True,
                                      stop_token_ids=engine.stop_ids, detokenize=False)
                   for i in range(len(prompts) * group)]
        outs = engine._llm.generate([{"prompt_token_ids": p} for p in prompts for _ in range(group)], vparams,
                                    use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs), {}

    draw(0)  # warm-up: first-call allocations, the adapter's export and load into vLLM
    rows = []
    for seed in range(1, repeats + 1):
        t0 = time.perf_counter()
        count, extra = draw(seed)
        seconds = time.perf_counter() - t0
        rows.append({"seconds": seconds, "tokens": count, "tokens_per_s": count / seconds, **extra})
    return {"variant": variant, "load_s": load_s, "calls": rows,
            "median_s": statistics.median(r["seconds"] for r in rows),
            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group", type=int, default=4, help="completions per prompt (8 prompts)")
    parser.add_argument("--tokens", type=int, default=48, help="max new tokens per completion")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, help="result file (default: bench/results/sampling-DATE-HOST.json)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        # marked: vLLM's shutdown may print after it
        print(RESULT + json.dumps(measure(args.child, args.model, args.dtype, args.repeats, args.group, args.tokens)),
              flush=True)
        return
    rows = []
    for variant in args.variants.split(","):
        load_before = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--dtype", args.dtype, "--repeats",
                              str(args.repeats), "--group", str(args.group), "--tokens", str(args.tokens),
                              "--child", variant], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{out.stderr[-3000:]}")
        row = json.loads(next(line for line in out.stdout.splitlines() if line.startswith(RESULT))[len(RESULT):])
        row["load_avg_1min"] = [load_before, os.getloadavg()[0]]
        rows.append(row)
        print(f"{variant:12s} median {row['median_s']:.2f} s, {row['median_tokens_per_s']:.0f} tok/s "
              f"(load {load_before:.1f} -> {row['load_avg_1min'][1]:.1f})", flush=True)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": socket.gethostname(), "model": args.model,
              "dtype": args.dtype, "completions": len(PROMPTS) * args.group, "max_new_tokens": args.tokens,
              "cores": os.cpu_count(), "runs": rows}
    default = Path(__file__).parent / "results" / f"sampling-{time.strftime('%Y-%m-%d')}-{socket.gethostname()}.json"
    path = args.out or default
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
