"""GRPO step throughput: purplerl's attack loop against TRL's GRPOTrainer at identical work (`make bench`).

By default both train a rank-16 LoRA on the embedded SmolLM2-135M-Instruct against the embedded toxicity scorer:
per step 8 prompts x G=4 completions of at most 48 tokens, k3 KL to the base model in the loss (beta 0.1),
group-normalized advantages, PPO clip 0.2, token-mean loss, one AdamW step (lr 5e-4). The prompts of step k are
purplerl's own (builtin:redteam train split, its seeded order), so both systems see the same prompts each step.
`Work` in grpo_work.py holds the knobs (--prompts, --group-size, --new-tokens, --finetune, --dtype, --model or
--shape set them); each child gets the same Work, and the settings each system really ran with are saved.

This process measures the machine's fp32 and bf16 matmul peaks and its memory bandwidth, then runs each system in
its own child process, one after the other (own peak memory, no shared caches). Step 1 is warm-up: it is in the
toxicity curves, not in the timings. A child that fails or runs past --child-timeout is recorded as failed (with
the end of its log), the others still run, and the run exits 1 after writing the report. Writes
bench/results/grpo-<date>-<host>.json and .png (toxicity per step) and prints a table. FLOPs, MFU and the decode
floor follow grpo_flops.py (useful FLOPs of real tokens; padding counts as waste).

Run: .venv/bin/python bench/bench_grpo.py [--steps 20] [--systems purplerl,trl] [--trl-bf16]
        [--prompts 8] [--group-size 4] [--new-tokens 48] [--finetune lora|full] [--dtype auto|bfloat16|float32]
        [--model PATH | --shape qwen2.5-1.5b] [--trl-micro-batch 0] [--child-timeout S]
        [--purplerl-set model.dtype=autocast_bf16 ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpo_flops
import grpo_machine
from grpo_flops import ModelShape, lora_params, matmul_params
from grpo_report import learning_comparison, plot, summarize_system, table
from grpo_work import DTYPES, FINETUNES, Work, purplerl_config, unfair_sets
from random_twin import SHAPES, make_shape_twin

from purplerl.engines.loading import cache_dir, resolve_model_path
from purplerl.errors import UserError

RESULTS = Path(__file__).parent / "results"
SYSTEMS = ("purplerl", "trl", "trl-bf16")


def twin_path(shape: str, twin_dir: Path | None) -> Path:
    """Where the random twin of a named shape is kept: $PURPLERL_CACHE/bench-twins/NAME unless --twin-dir."""
    return (twin_dir or cache_dir() / "bench-twins") / shape


def ensure_twin(shape: str, path: Path) -> None:
    """Make the bf16 random twin of `shape` at `path` unless it is there (on the GPU when there is one)."""
    if (path / "config.json").is_file():
        return
    partial = path.with_name(path.name + ".partial")
    print(f"making the random twin of {shape} in {path}", flush=True)
    make_shape_twin(shape, partial, dtype="bfloat16", device=grpo_machine.DEVICE.type)
    partial.rename(path)  # a killed build leaves only the .partial dir, rebuilt next time


def run_child(system: str, work: Work, sets: list[str], workdir: Path, timeout_s: float | None) -> dict[str, Any]:
    """Run one system in its own process; its output goes to a log, whose end is kept when it fails."""
    out, log = workdir / f"{system}.json", workdir / f"{system}.log"
    cmd = [sys.executable, __file__, "--child", system, "--child-work", json.dumps(asdict(work)),
           "--child-out", str(out), *(f"--purplerl-set={s}" for s in sets)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.perf_counter()
    with log.open("w") as f:
        try:
            failure = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False,
                                     timeout=timeout_s).returncode or None
        except subprocess.TimeoutExpired:
            failure = f"ran past --child-timeout {timeout_s:g} s"
    wall_s = time.perf_counter() - started
    lines = log.read_text(errors="replace").splitlines()
    for line in lines:
        if line.startswith("warning: "):
            print(f"{system}: {line}", file=sys.stderr)
    if failure is not None:
        reason = failure if isinstance(failure, str) else f"exited with {failure}"
        print(f"{system} child {reason}; the end of its log:\n" + "\n".join(lines[-40:]), file=sys.stderr)
        return {"system": system, "failed": reason, "log_tail": lines[-40:], "wall_s": wall_s}
    return {**json.loads(out.read_text()), "wall_s": wall_s}


def run_child_process(system: str, work: Work, sets: list[str], out: Path) -> None:
    if system == "purplerl":
        from grpo_work import run_purplerl

        run_purplerl(work, sets, out)
    else:
        from grpo_trl import run_trl  # imports trl: only the TRL children need it

        run_trl(work, bf16=system == "trl-bf16", out=out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("BENCH_STEPS", "20")),
                        help="RL steps per system, the first untimed (default: $BENCH_STEPS or 20)")
    parser.add_argument("--systems", default="purplerl,trl", help=f"comma-separated, from {', '.join(SYSTEMS)}")
    parser.add_argument("--trl-bf16", action="store_true", help="also run TRL with bf16=True (autocast) as trl-bf16")
    parser.add_argument("--purplerl-set", action="append", default=[], metavar="KEY=VALUE",
                        help="purplerl config override for a variant, e.g. model.dtype=autocast_bf16 (repeatable)")
    parser.add_argument("--prompts", type=int, default=Work.prompts_per_step, help="prompts per step (B)")
    parser.add_argument("--group-size", type=int, default=Work.group_size, help="completions per prompt (G)")
    parser.add_argument("--new-tokens", type=int, default=Work.max_new_tokens, help="max tokens per completion")
    parser.add_argument("--finetune", choices=FINETUNES, default=Work.finetune,
                        help="'lora' (rank 16 on all linear layers) or 'full' (every weight)")
    parser.add_argument("--dtype", choices=DTYPES, default=Work.dtype,
                        help="'auto': each system's default (TRL fp32); 'bfloat16': both load bf16 (the GPU setting)")
    parser.add_argument("--trl-micro-batch", type=int, default=Work.trl_micro_batch,
                        help="sequences per TRL forward/backward (gradient accumulation); 0: all B·G in one pass")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default=Work.model,
                        help="policy model for both systems: a local model dir or hub id (default: the embedded "
                             "SmolLM2); bench/random_twin.py makes a random-weight twin of its shapes")
    source.add_argument("--shape", choices=sorted(SHAPES),
                        help="a random-weight twin of a published architecture (bench/random_twin.py), made once")
    parser.add_argument("--twin-dir", type=Path, default=None, help="where --shape twins are kept "
                        "(default: $PURPLERL_CACHE/bench-twins)")
    parser.add_argument("--child-timeout", type=float, default=None, metavar="S",
                        help="stop a system's child after S seconds and record it as failed (default: no limit)")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/grpo-DATE-HOST.json")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--child-work", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def work_from_args(args: argparse.Namespace) -> Work:
    """The Work the options ask for (a --shape twin is named here, made later by `ensure_twin`)."""
    model = str(twin_path(args.shape, args.twin_dir)) if args.shape else args.model
    try:
        return Work(steps=args.steps, prompts_per_step=args.prompts, group_size=args.group_size,
                    max_new_tokens=args.new_tokens, finetune=args.finetune, dtype=args.dtype,
                    trl_micro_batch=args.trl_micro_batch, model=model)
    except ValueError as err:
        raise SystemExit(f"work: {err}") from None


def checked_systems(args: argparse.Namespace, work: Work) -> list[str]:
    """The systems to run, after the checks that need no model: names, steps, TRL installed, overrides."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()] + (["trl-bf16"] * args.trl_bf16)
    systems = list(dict.fromkeys(systems))
    if unknown := [s for s in systems if s not in SYSTEMS]:
        raise SystemExit(f"unknown system(s) {', '.join(unknown)}: choose from {', '.join(SYSTEMS)}")
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2: step 1 is warm-up and is not timed")
    if "trl-bf16" in systems and work.dtype == "bfloat16":
        raise SystemExit("--dtype bfloat16 already runs TRL with bf16=True: drop trl-bf16")
    if any(s.startswith("trl") for s in systems) and importlib.util.find_spec("trl") is None:
        raise SystemExit("TRL is not installed: pip install -e '.[bench]' (make bench does it)")
    try:  # a bad setting fails now, not minutes later inside the purplerl child
        purplerl_config(work, Path(tempfile.gettempdir()), args.purplerl_set)
    except UserError as err:
        raise SystemExit(f"work or --purplerl-set: {err}") from None
    for s in unfair_sets(args.purplerl_set):
        print(f"warning: --purplerl-set {s} changes the work itself: purplerl and TRL no longer do the same work",
              file=sys.stderr)
    return systems


def write_report(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result["systems"], out.with_suffix(".png"), f"GRPO toxicity per step ({result['host']}, {result['date']})")
    peaks, machine = result["peaks_gflops"], result["machine"]
    where = machine["gpu"] or f"{machine['cpu']}, {machine['torch_threads']} threads"
    print(f"GRPO step on {where}; matmul peak fp32 {peaks['fp32']['gflops']} GFLOP/s, bf16 "
          f"{peaks['bf16']['gflops']} GFLOP/s; copy bandwidth {result['memory_bandwidth']['gb_per_s']} GB/s")
    print(table(result["systems"]))
    for name, ratio in result["ratios"].items():
        print(f"{name}: {ratio:.2f}")
    for name, c in result["learning"].items():
        verdict = "not below" if c["purplerl_not_below_beyond_noise"] else "BELOW"
        print(f"toxicity, second half of the run: purplerl {c['purplerl_second_half_mean']:.3f} vs {name} "
              f"{c['other_second_half_mean']:.3f} (difference {c['difference']:+.3f} ± {c['difference_se']:.3f} SE): "
              f"purplerl {verdict} {name} beyond noise")
    print(f"written to {out} and {out.with_suffix('.png')}")


def main() -> None:
    args = parse_args()
    sets = args.purplerl_set
    if args.child:
        run_child_process(args.child, Work(**json.loads(args.child_work)), sets, args.child_out)
        return
    work = work_from_args(args)
    systems = checked_systems(args, work)
    if args.shape:
        ensure_twin(args.shape, Path(work.model))
    try:
        model_path = resolve_model_path(work.model)  # builds the embedded model's cache once, before any child
    except UserError as err:
        raise SystemExit(f"--model: {err}") from None
    from transformers import AutoConfig

    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_path))
    before = grpo_machine.measure()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        for system in systems:
            print(f"running {system}: {work.steps} steps in a child process", flush=True)
            results[system] = run_child(system, work, sets, Path(tmp), args.child_timeout)
    measured = grpo_machine.best_of(before, grpo_machine.measure())
    rank = work.lora_rank if work.lora else None
    for result in results.values():
        summarize_system(result, shape, rank, measured)
    done = {name: r for name, r in results.items() if "failed" not in r}
    ratios = {f"{name} / purplerl median s/step": done[name]["summary"]["step_s"]["median"]
              / done["purplerl"]["summary"]["step_s"]["median"] for name in done
              if name != "purplerl" and "purplerl" in done}
    host, today = platform.node() or "unknown", datetime.date.today().isoformat()
    work_info = {**asdict(work), "model_path": model_path, "shape_name": args.shape, "shape": asdict(shape),
                 "matmul_params_per_token": matmul_params(shape),
                 "lora_params": lora_params(shape, rank) if rank is not None else None,
                 "purplerl_overrides": sets, "overrides_changing_work": unfair_sets(sets)}
    write_report({"benchmark": "grpo-step", "date": today, "host": host, "machine": grpo_machine.machine_info(),
                  "peaks_gflops": {k: measured[k] for k in ("fp32", "bf16")},
                  "memory_bandwidth": measured["bandwidth"], "work": work_info,
                  "flops_convention": grpo_flops.__doc__, "systems": results, "ratios": ratios,
                  "learning": learning_comparison({n: [s["toxicity"] for s in r["steps"]] for n, r in done.items()})
                  if "purplerl" in done else {}}, args.out or RESULTS / f"grpo-{today}-{host}.json")
    if len(done) < len(results):
        raise SystemExit(f"failed: {', '.join(sorted(set(results) - set(done)))} (recorded in the report)")


if __name__ == "__main__":
    main()
