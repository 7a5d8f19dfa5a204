"""Performance levers of the local engine, each timed on one GRPO-sized step of the embedded SmolLM2.

The step: 8 prompts x G=4, 48 new tokens; sampling, the reference pass (KL to the base), and one
forward_backward + optim_step with the in-loss KL. Each variant changes one lever against the default
engine; numerics are compared with the fp32 variant on the same sampled batch. Best of `--repeats` runs.
Writes bench/results/levers-<date>-<host>.json.
Run: .venv/bin/python bench/bench_levers.py [--repeats 2] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, SamplingParams

# name -> (ModelConfig overrides, trainer attributes to set, EngineSettings overrides)
VARIANTS: dict[str, tuple[dict, dict, dict]] = {
    "default": ({}, {}, {}),
    "fp32": ({"dtype": "float32"}, {}, {}),
    "fp32_unmerged_sampler": ({"dtype": "float32"}, {}, {"merged_sampler": False}),
    "fp32_autocast_bf16": ({"dtype": "autocast_bf16"}, {}, {}),
    "unmerged_sampler": ({}, {}, {"merged_sampler": False}),
    "unfused_lora": ({}, {}, {"fused_lora": False}),
    "full_logits": ({}, {"head_only": False}, {}),
    "micro_batch_8": ({}, {}, {"micro_batch_size": 8}),  # the old default: 4 passes instead of 1
    "micro_batch_4": ({}, {}, {"micro_batch_size": 4}),
    "threads_1": ({}, {}, {}),  # torch.set_num_threads(1) for the whole process (measure): keep it last
}
TEXTS = [f"Roast my friend number {i} who is always late." for i in range(8)]


def measure(name: str, repeats: int) -> dict[str, float]:
    model_kw, attrs, settings_kw = VARIANTS[name]
    if name == "threads_1":
        torch.set_num_threads(1)  # what OMP_NUM_THREADS=1 does
    engine = LocalEngine(ModelConfig(device="cpu", **model_kw), seed=0, settings=EngineSettings(**settings_kw))
    for key, value in attrs.items():
        setattr(engine.trainer, key, value)
    prompts = [engine.tokenizer.encode(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)) for t in TEXTS]
    loss = Loss("ppo_clip", PolicyGradientParams(kl_beta=0.1, kl_estimator="k3", old_logprobs="current"))
    rows = []
    for rep in range(repeats):
        start = time.perf_counter()
        groups = engine.sample(prompts, 4, SamplingParams(max_new_tokens=48, seed=rep))
        sampled = time.perf_counter()
        tensors = sequence_tensors([c for g in groups for c in g], engine.tokenizer.pad_token_id)
        ref = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"], reference=True,
                              targets_NT=tensors["loss_mask_NT"])
        referenced = time.perf_counter()
        # the pass an off-policy recomputation of old logprobs would cost (and the sampler's numerics)
        policy = engine.logprobs(tensors["input_ids_NT"], tensors["attention_mask_NT"],
                                 targets_NT=tensors["loss_mask_NT"])
        recomputed = time.perf_counter()
        mask = tensors["loss_mask_NT"].bool()
        drift = (policy[mask] - tensors["sampling_logprobs_NT"][mask]).abs()
        batch = build_train_batch(tensors, torch.randn(32, generator=torch.Generator().manual_seed(rep)))
        batch = batch.__class__(**{**batch.__dict__, "ref_logprobs_NT": ref})
        started_train = time.perf_counter()
        engine.forward_backward(batch, loss)
        engine.optim_step(AdamParams(lr=1e-4))
        trained = time.perf_counter()
        rows.append({"sample_s": sampled - start, "reference_s": referenced - sampled,
                     "old_logprob_pass_s": recomputed - referenced, "train_s": trained - started_train,
                     "completion_tokens": float(mask.sum()),
                     "prompt_tokens": float(sum(len(p) for p in prompts) * 4),
                     "max_sampler_drift": float(drift.max()), "mean_sampler_drift": float(drift.mean())})
    return {k: min(r[k] for r in rows) if k.endswith("_s") else max(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variant names")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: unknown variant(s) {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    result = {"date": datetime.date.today().isoformat(), "host": platform.node(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "variants": {}}
    for name in names:
        result["variants"][name] = measure(name, args.repeats)
        r = result["variants"][name]
        print(f"{name:22} sample {r['sample_s']:5.2f}s  reference {r['reference_s']:5.2f}s  "
              f"old-logprob pass {r['old_logprob_pass_s']:5.2f}s  train {r['train_s']:5.2f}s  "
              f"sampler drift max {r['max_sampler_drift']:.4f} mean {r['mean_sampler_drift']:.5f}", flush=True)
    out = Path(__file__).parent / "results" / f"levers-{result['date']}-{result['host']}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
