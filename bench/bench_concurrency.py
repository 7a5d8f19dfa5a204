"""Two training runs on one machine: in sequence, at once with disjoint thread budgets, and at once with all-core
thread pools each (oversubscribed). `make bench-concurrency`.

Each run is the same small GRPO attack on the embedded SmolLM2 (seed 0 and seed 1), started as `purplerl attack`
in its own process with OMP_NUM_THREADS and MKL_NUM_THREADS set:

- sequential: one run after the other, each with every core (what a lone run gets);
- split: both at once, each with cores / 2 threads (what `purplerl sweep --cpus_per_run cores/2` gives them);
- oversubscribed: both at once, each with every core (two torch pools on the same cores: the issue-22 failure,
  where a demo step went from ~6 s to 40-155 s);
- sweep (unless --no-sweep): the same two runs through `purplerl sweep --seeds 0,1 --cpus_per_run cores/2` on a
  local Ray cluster, the diversity eval off, so the scheduler's own cost is in the number.

The ratio of each mode's wall time to the sequential one says what running two at once costs or saves: below 1 it
saves time. Per-step times come from each run's metrics.jsonl (time/step_s; median over the run's steps).
Writes bench/results/concurrency-<date>-<host>.json and prints a table.
Run: .venv/bin/python bench/bench_concurrency.py [--steps 3] [--model embedded:smollm2-135m-instruct] [--no-sweep]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_args(args: argparse.Namespace) -> list[str]:
    """The attack's settings, shared by every mode (the seed and the run dir are each run's)."""
    return ["--model", args.model, "--steps", str(args.steps), "--batch_size", str(args.batch_size),
            "--group_size", str(args.group_size), "--max_new_tokens", str(args.max_new_tokens),
            "--save_every", str(args.steps), "--logging.progress", "false"]


def env_with(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def start(args: argparse.Namespace, out: Path, name: str, seed: int, threads: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "purplerl", "attack", *run_args(args), "--seed", str(seed),
               "--output_dir", str(out), "--name", name]
    return subprocess.Popen(command, env=env_with(threads), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen, name: str) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed ({proc.returncode}): {err.strip().splitlines()[-1:]}")


def step_times(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["time/step_s"] for row in rows if "time/step_s" in row]


def mode(args: argparse.Namespace, root: Path, name: str, together: bool, threads: int) -> dict[str, Any]:
    """Runs seed 0 and seed 1 in sequence or at once, each with `threads` threads; wall time and step times."""
    out = root / name
    started = time.perf_counter()
    if together:
        procs = [start(args, out, f"s{seed}", seed, threads) for seed in (0, 1)]
        for seed, proc in enumerate(procs):
            finish(proc, f"{name}/s{seed}")
    else:
        for seed in (0, 1):
            finish(start(args, out, f"s{seed}", seed, threads), f"{name}/s{seed}")
    wall = time.perf_counter() - started
    steps = {f"s{seed}": step_times(out / f"s{seed}") for seed in (0, 1)}
    return {"wall_s": wall, "threads_per_run": threads, "together": together, "step_s": steps,
            "median_step_s": statistics.median([t for times in steps.values() for t in times])}


def sweep_mode(args: argparse.Namespace, root: Path, threads: int) -> dict[str, Any]:
    """The same two runs through `purplerl sweep` (a local Ray cluster, cpus_per_run = threads)."""
    out = root / "sweep"
    fixed = [f"{key.lstrip('-')}={value}" for key, value in zip(run_args(args)[::2], run_args(args)[1::2],
                                                                  strict=True)]
    command = [sys.executable, "-m", "purplerl", "sweep", "--recipe", "attack", "--seeds", "0,1", "--out", str(out),
               "--cpus_per_run", str(threads), "--eval.diversity", "false", "--fixed", *fixed]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env_with(threads), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    steps = {run.name: step_times(run) for run in sorted((out / "runs").iterdir())}
    return {"wall_s": wall, "threads_per_run": threads, "together": True, "step_s": steps,
            "median_step_s": statistics.median([t for times in steps.values() for t in times])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--group_size", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=24)
    parser.add_argument("--no-sweep", action="store_true", help="skip the run through purplerl sweep (Ray)")
    args = parser.parse_args()
    n = cores()
    half = max(1, n // 2)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_concurrency_") as tmp:
        root = Path(tmp)
        for name, together, threads in (("sequential", False, n), ("split", True, half),
                                        ("oversubscribed", True, n)):
            print(f"{name}: 2 runs {'at once' if together else 'in sequence'}, {threads} threads each", flush=True)
            results[name] = mode(args, root, name, together, threads)
        if not args.no_sweep:
            print(f"sweep: 2 runs through purplerl sweep, {half} CPUs each", flush=True)
            results["sweep"] = sweep_mode(args, root, half)
    base = results["sequential"]["wall_s"]
    for row in results.values():
        row["wall_vs_sequential"] = row["wall_s"] / base
    report = {"date": datetime.date.today().isoformat(), "host": platform.node(), "cores": n,
              "settings": {k: v for k, v in vars(args).items() if k != "no_sweep"}, "modes": results}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"concurrency-{report['date']}-{report['host']}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"{'mode':16} {'threads/run':>11} {'wall s':>8} {'vs sequential':>14} {'median step s':>14}")
    for name, row in results.items():
        print(f"{name:16} {row['threads_per_run']:>11} {row['wall_s']:>8.1f} {row['wall_vs_sequential']:>14.2f} "
              f"{row['median_step_s']:>14.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
