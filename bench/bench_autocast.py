"""One GRPO-sized step of the local engine in fp32 and under bf16 autocast (embedded SmolLM2, CPU).

Times sampling (8 prompts x G=4, 48 new tokens), the reference pass and one forward_backward + optim_step,
and reports how far sampling logprobs drift from a recomputation. Writes bench/results/autocast-<date>-<host>.json.
Run: .venv/bin/python bench/bench_autocast.py
"""

from __future__ import annotations

import datetime
import json
import platform
import time
from pathlib import Path

import torch

from purplerl.config import ModelConfig
from purplerl.engines.local import LocalEngine
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, LossSpec, SamplingParams


def measure(autocast: bool, repeats: int = 2) -> dict[str, float]:
    engine = LocalEngine(ModelConfig(device="cpu", autocast_bf16=autocast), seed=0)
    texts = [f"Roast my friend number {i} who is always late." for i in range(8)]
    prompts = [engine.tokenizer.encode(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)) for t in texts]
    rows = []
    for rep in range(repeats):
        start = time.perf_counter()
        groups = engine.sample(prompts, 4, SamplingParams(max_new_tokens=48, seed=rep))
        sampled = time.perf_counter()
        tensors = sequence_tensors([c for g in groups for c in g], engine.tokenizer.pad_token_id)
        engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], reference=True)
        referenced = time.perf_counter()
        # before the update, so the drift is the sampler's numerics, not the optimizer step
        policy = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"])
        mask = tensors["loss_mask_NT"].bool()
        drift = float((policy[mask] - tensors["sampling_logprobs_NT"][mask]).abs().max())
        started_train = time.perf_counter()
        batch = build_train_batch(tensors, torch.randn(32, generator=torch.Generator().manual_seed(rep)))
        engine.forward_backward(batch, LossSpec())
        engine.optim_step(AdamParams(lr=1e-4))
        trained = time.perf_counter()
        rows.append({"sample_s": sampled - start, "reference_s": referenced - sampled,
                     "train_s": trained - started_train, "max_logprob_drift": drift})
    return {k: min(r[k] for r in rows) if k.endswith("_s") else max(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    result = {"date": datetime.date.today().isoformat(), "host": platform.node(), "threads": torch.get_num_threads(),
              "fp32": measure(False), "bf16_autocast": measure(True)}
    out = Path(__file__).parent / "results" / f"autocast-{result['date']}-{result['host']}.json"
    out.write_text(json.dumps(result, indent=1))
    for name in ("fp32", "bf16_autocast"):
        r = result[name]
        print(f"{name:14} sample {r['sample_s']:.1f}s  reference {r['reference_s']:.1f}s  "
              f"train {r['train_s']:.1f}s  max logprob drift {r['max_logprob_drift']:.4f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
