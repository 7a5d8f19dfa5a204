"""The `compiled` fast path (torch.compile of the policy's decoder) against the eager engine, on one GRPO-sized
batch of the embedded SmolLM2: 8 prompts x G=4, 48 new tokens, LoRA r16, the default dtype of this CPU.

Times one forward_backward + optim_step (the train phase) and one reference pass (the base with the adapter off),
eager first, then compiled: the first compiled call of each includes its compile time, reported apart. Sampling is
not compiled (the sampler decodes with its own module), so it is not timed here.
Writes bench/results/compile-<date>-<host>.json.
Run: .venv/bin/python bench/bench_compile.py [--repeats 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from purplerl.algorithms.registry import Loss, PolicyGradientParams
from purplerl.config import ModelConfig
from purplerl.engines.base import EngineSettings
from purplerl.engines.local import LocalEngine
from purplerl.train.batch import build_train_batch, sequence_tensors
from purplerl.types import AdamParams, SamplingParams

TEXTS = [f"Roast my friend number {i} who is always late." for i in range(8)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(compiled: bool, repeats: int) -> dict[str, object]:
    engine = LocalEngine(ModelConfig(device="cpu"), seed=0, settings=EngineSettings(compiled=compiled))
    prompts = [engine.tokenizer.encode(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)) for t in TEXTS]
    groups = engine.sample(prompts, 4, SamplingParams(max_new_tokens=48, seed=0))
    t = sequence_tensors([c for g in groups for c in g], engine.tokenizer.pad_token_id)
    ids, attn, mask = t["input_ids_NT"], t["attention_mask_NT"], t["loss_mask_NT"]
    loss = Loss("ppo_clip", PolicyGradientParams(kl_beta=0.1, kl_estimator="k3", old_logprobs="current"))

    def reference() -> torch.Tensor:
        return engine.logprobs(ids, attn, reference=True, targets_NT=mask)

    start = time.perf_counter()
    ref = reference()
    first_ref = time.perf_counter() - start
    batch = build_train_batch(t, torch.randn(32, generator=torch.Generator().manual_seed(0)))
    batch = batch.__class__(**{**batch.__dict__, "ref_logprobs_NT": ref})

    def train() -> None:
        engine.forward_backward(batch, loss)
        engine.optim_step(AdamParams(lr=1e-6))

    first_train = _timed(train)
    trains = [_timed(train) for _ in range(repeats)]
    refs = [_timed(reference) for _ in range(repeats)]
    return {"dtype": str(next(engine.trainer.model.parameters()).dtype), "shape": list(ids.shape),
            "first_train_s": first_train, "first_reference_s": first_ref,
            "train_s": statistics.median(trains), "reference_s": statistics.median(refs),
            "train_all_s": trains, "reference_all_s": refs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    eager, compiled = measure(False, args.repeats), measure(True, args.repeats)
    saved_per_step = eager["train_s"] + eager["reference_s"] - compiled["train_s"] - compiled["reference_s"]
    compile_s = (compiled["first_train_s"] - compiled["train_s"]) + (compiled["first_reference_s"]
                                                                      - compiled["reference_s"])
    result = {"date": datetime.date.today().isoformat(), "host": platform.node(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "eager": eager, "compiled": compiled,
              "saved_per_step_s": saved_per_step, "compile_s": compile_s,
              "break_even_steps": compile_s / saved_per_step if saved_per_step > 0 else None}
    out = Path(__file__).parent / "results" / f"compile-{result['date']}-{result['host']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("eager", "compiled")}, indent=1))
    print(f"eager train {eager['train_s']:.2f} s, reference {eager['reference_s']:.2f} s; compiled train "
          f"{compiled['train_s']:.2f} s, reference {compiled['reference_s']:.2f} s; wrote {out}")


if __name__ == "__main__":
    main()
