"""Answers to label for the compliance judge's validation (docs/results/compliance_judge/README.md).

Writes OUT/answers_<part>.jsonl, one row per answer: {"id", "source", "kind", "request", "answer"}, from
- the demo attack's samples.jsonl (--attack_run): `per_step` completions of each of `steps` spread over the run
  (source "attack_train:step_N"), prompts from builtin:redteam's train split;
- each model on the alignment data's held-out requests (test split: templates and topics the alignment never saw),
  harmful and benign, greedy and sampled (T = 1, top-p 0.95), `per_cell` requests per cell, each cell its own
  evenly spaced requests (source "<model>/<kind>/<mode>"); the models: the base SmolLM2-135M-Instruct, the
  aligned smollm2-135m-safe and, with --checkpoint, the attacked policy (prompted as its run was trained).

    .venv/bin/python docs/results/compliance_judge/generate_answers.py --out runs/judge \
        --attack_run runs/judge/judge_demo --checkpoint runs/judge/judge_demo/checkpoints/step_000040
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from purplerl.config import ModelLoadConfig, PromptFormatConfig
from purplerl.data.alignment import alignment_examples, to_prompt_records
from purplerl.experiments import align as _align  # noqa: F401  registers embedded:smollm2-135m-safe
from purplerl.runs.policy import resolve_policy
from purplerl.types import SamplingParams

MODES = {"greedy": {"temperature": 0.0, "top_p": 1.0}, "sampled": {"temperature": 1.0, "top_p": 0.95}}
MODELS = {"base": "embedded:smollm2-135m-instruct", "aligned": "embedded:smollm2-135m-safe"}


def attack_rows(run: Path, steps: int, per_step: int) -> list[dict]:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    last = max(row["step"] for row in rows)
    wanted = sorted({1 + round(i * (last - 1) / max(1, steps - 1)) for i in range(steps)})
    out = []
    for step in wanted:
        at = [row for row in rows if row["step"] == step]
        for row in at[::max(1, len(at) // per_step)][:per_step]:
            out.append({"source": f"attack_train:step_{step}", "kind": "harmful", "request": row["prompt"],
                        "answer": row["completion"]})
    return out


def model_rows(label: str, checkpoint: str | None, model: str, per_cell: int, max_new_tokens: int) -> list[dict]:
    policy = resolve_policy(checkpoint, ModelLoadConfig(name=model, device="cpu"), PromptFormatConfig())
    engine = policy.load()
    out = []
    for k, kind in enumerate(("harmful", "benign")):
        examples = alignment_examples("test", kind)
        for m, (mode, knobs) in enumerate(MODES.items()):
            # each (model, kind, mode) cell its own evenly spaced requests, so the set covers more requests
            offset = (3 * k + 7 * m + 11 * len(label)) % max(1, len(examples) // per_cell)
            chosen = examples[offset::max(1, len(examples) // per_cell)][:per_cell]
            params = SamplingParams(max_new_tokens=max_new_tokens, seed=0, **knobs)
            texts = policy.generate(engine, to_prompt_records(chosen), 1, params)
            out += [{"source": f"{label}/{kind}/{mode}", "kind": kind, "request": ex.messages[-1]["content"],
                     "answer": group[0]} for ex, group in zip(chosen, texts, strict=True)]
            print(f"{label} {kind} {mode}: {len(chosen)} answers", flush=True)
    return out


PARTS = ("attack", "base", "aligned", "attacked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="writes OUT/answers_<part>.jsonl")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {PARTS}")
    parser.add_argument("--attack_run", type=Path, help="the demo attack's run dir (part attack)")
    parser.add_argument("--checkpoint", help="the attacked policy's checkpoint (part attacked)")
    parser.add_argument("--steps", type=int, default=8, help="attack steps sampled from the run")
    parser.add_argument("--per_step", type=int, default=8)
    parser.add_argument("--per_cell", type=int, default=12)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for part in args.parts.split(","):
        if part == "attack":
            rows = attack_rows(args.attack_run, args.steps, args.per_step)
        elif part == "attacked":
            rows = model_rows(part, args.checkpoint, MODELS["aligned"], args.per_cell, args.max_new_tokens)
        else:
            rows = model_rows(part, None, MODELS[part], args.per_cell, args.max_new_tokens)
        with open(args.out / f"answers_{part}.jsonl", "w") as f:
            for i, row in enumerate(rows):
                f.write(json.dumps({"id": f"{part}-{i}", **row}) + "\n")
        print(f"{len(rows)} answers -> {args.out / f'answers_{part}.jsonl'}", flush=True)


if __name__ == "__main__":
    main()
