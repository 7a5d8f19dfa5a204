"""GRPO step throughput: purplerl's attack loop against TRL's GRPOTrainer at identical work (`make bench`).

Both train a rank-16 LoRA on the embedded SmolLM2-135M-Instruct against the embedded toxicity scorer: per step
8 prompts x G=4 completions of at most 48 tokens, k3 KL to the base model in the loss (beta 0.1), group-normalized
advantages, PPO clip 0.2, token-mean loss, one AdamW step (lr 5e-4). The prompts of step k are purplerl's own
(builtin:redteam train split, its seeded order), so both systems see the same prompts each step. `Work` in
grpo_work.py holds the knobs; the settings each system really ran with are saved with the results.

This process measures the machine's fp32 and bf16 matmul peak, then runs each system in its own child process,
one after the other (own peak RSS, no shared caches). Step 1 is warm-up: it is in the toxicity curves, not in the
timings. Writes bench/results/grpo-<date>-<host>.json and .png (toxicity per step) and prints a table.
FLOPs and MFU follow the convention in grpo_flops.py (useful FLOPs of real tokens; padding counts as waste).

Run: .venv/bin/python bench/bench_grpo.py [--steps 20] [--systems purplerl,trl] [--trl-bf16]
                                          [--purplerl-set engine.autocast_bf16=true ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpo_flops
import torch
from grpo_flops import ModelShape, lora_params, matmul_params, reference_flops, sampling_flops, training_flops
from grpo_work import Work, purplerl_config, unfair_sets

from purplerl.config import EMBEDDED_MODEL
from purplerl.engines.loading import resolve_model_path
from purplerl.errors import UserError

RESULTS = Path(__file__).parent / "results"
SYSTEMS = ("purplerl", "trl", "trl-bf16")
PEAK_SIZES = (2048, 4096)


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # both systems run where this is


def _sync() -> None:
    if DEVICE.type == "cuda":  # CUDA calls return before the kernel ends
        torch.cuda.synchronize()


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = 5) -> dict[str, Any]:
    """Best GFLOP/s of square matmuls (2·n³ FLOPs each) with torch's default thread count.

    Best of several, because anything else running on the machine only ever makes a matmul slower."""
    generator = torch.Generator().manual_seed(0)
    by_size: dict[str, float] = {}
    for n in sizes:
        a, b = (torch.randn(n, n, generator=generator).to(device=DEVICE, dtype=dtype) for _ in range(2))
        torch.mm(a, b)  # the first call allocates and picks a kernel
        _sync()
        best = math.inf
        for _ in range(repeats):
            started = time.perf_counter()
            torch.mm(a, b)
            _sync()
            best = min(best, time.perf_counter() - started)
        by_size[str(n)] = round(2 * n**3 / best / 1e9, 1)
    return {"gflops": max(by_size.values()), "by_size": by_size}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def add_flops(steps: list[dict[str, Any]], shape: ModelShape, rank: int) -> None:
    """Replace each step's per-sequence token counts by its useful FLOPs per phase."""
    for step in steps:
        sequences = list(zip(step.pop("prompt_lens"), step.pop("completion_lens"), strict=True))
        step["sampling_flops"] = sampling_flops(shape, sequences)
        step["reference_flops"] = reference_flops(shape, sequences)
        step["training_flops"] = training_flops(shape, sequences, rank)


def summarize(steps: list[dict[str, Any]], peaks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Timing spread over the timed steps (all but step 1); rates and MFU as totals over them (sum / sum)."""
    timed = [s for s in steps if s["step"] > 1]
    times = [s["step_s"] for s in timed]

    def total(key: str) -> float:
        return sum(s[key] for s in timed)

    def mfu(flops_key: str, seconds_key: str) -> dict[str, float]:
        return {name: total(flops_key) / total(seconds_key) / (peak["gflops"] * 1e9) for name, peak in peaks.items()}

    return {
        "timed_steps": len(timed),
        "step_s": {"median": statistics.median(times), "min": min(times), "max": max(times),
                   "q25": percentile(times, 25), "q75": percentile(times, 75),
                   "iqr": percentile(times, 75) - percentile(times, 25)},
        "phase_median_s": {k: statistics.median(s[k] for s in timed) for k in ("sample_s", "score_s", "train_s")},
        "sampling_tokens_per_s": total("completion_tokens") / total("sample_s"),
        "training_tokens_per_s": (total("prompt_tokens") + total("completion_tokens")) / total("train_s"),
        "mfu": {"training": mfu("training_flops", "train_s"), "sampling": mfu("sampling_flops", "sample_s"),
                "reference_and_reward": mfu("reference_flops", "score_s")},
        "token_sources": sorted({s["token_source"] for s in steps}),
        "toxicity": [s["toxicity"] for s in steps],
    }


def run_child(system: str, work: Work, sets: list[str], workdir: Path) -> dict[str, Any]:
    """Run one system in its own process; its output goes to a log shown when it fails."""
    out, log = workdir / f"{system}.json", workdir / f"{system}.log"
    cmd = [sys.executable, __file__, "--child", system, "--steps", str(work.steps), "--model", work.model,
           "--child-out", str(out), *(f"--purplerl-set={s}" for s in sets)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False).returncode
    lines = log.read_text(errors="replace").splitlines()
    if code != 0:
        tail = "\n".join(lines[-40:])
        raise SystemExit(f"{system} child exited with {code}; the end of its log:\n{tail}")
    for line in lines:
        if line.startswith("warning: "):
            print(f"{system}: {line}", file=sys.stderr)
    return {**json.loads(out.read_text()), "wall_s": time.perf_counter() - started}


def run_child_process(system: str, work: Work, sets: list[str], out: Path) -> None:
    if system == "purplerl":
        from grpo_work import run_purplerl

        run_purplerl(work, sets, out)
    else:
        from grpo_trl import run_trl  # imports trl: only the TRL children need it

        run_trl(work, bf16=system == "trl-bf16", out=out)


def machine_info() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.is_file() else []
    versions = {}
    for dist in ("torch", "transformers", "peft", "trl", "accelerate", "purplerl"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": models[0] if models else platform.processor(), "cpus": os.cpu_count(), "gpu": gpu,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "versions": versions}


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, result in results.items():
        steps = [s["step"] for s in result["steps"]]
        ax.plot(steps, [s["toxicity"] for s in result["steps"]], marker="o", markersize=3, label=name)
    ax.axvspan(0.5, 1.5, color="grey", alpha=0.15, label="warm-up step (not timed)")
    ax.set(xlabel="step", ylabel="mean P(toxic) of the step's completions", title=title)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| system | s/step median | min | max | IQR | sample / score / train s | sample tok/s | train tok/s "
             "| train MFU fp32 / bf16 | sample MFU fp32 / bf16 | peak RSS / GPU MiB | toxicity step 1 → last |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        s, t, m = r["summary"], r["summary"]["step_s"], r["summary"]["mfu"]
        gpu = r.get("peak_gpu_mib")
        memory = f"{r['peak_rss_mib']:.0f} / " + ("-" if gpu is None else f"{gpu:.0f}")
        phases = " / ".join(f"{s['phase_median_s'][k]:.2f}" for k in ("sample_s", "score_s", "train_s"))
        lines.append(
            f"| {name} | {t['median']:.2f} | {t['min']:.2f} | {t['max']:.2f} | {t['iqr']:.2f} | {phases} | "
            f"{s['sampling_tokens_per_s']:.0f} | {s['training_tokens_per_s']:.0f} | "
            f"{100 * m['training']['fp32']:.1f}% / {100 * m['training']['bf16']:.1f}% | "
            f"{100 * m['sampling']['fp32']:.1f}% / {100 * m['sampling']['bf16']:.1f}% | {memory} | "
            f"{s['toxicity'][0]:.3f} → {s['toxicity'][-1]:.3f} |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("BENCH_STEPS", "20")),
                        help="RL steps per system, the first untimed (default: $BENCH_STEPS or 20)")
    parser.add_argument("--systems", default="purplerl,trl", help=f"comma-separated, from {', '.join(SYSTEMS)}")
    parser.add_argument("--trl-bf16", action="store_true", help="also run TRL with bf16=True (autocast) as trl-bf16")
    parser.add_argument("--purplerl-set", action="append", default=[], metavar="KEY=VALUE",
                        help="purplerl config override for a variant, e.g. engine.autocast_bf16=true (repeatable)")
    parser.add_argument("--model", default=EMBEDDED_MODEL,
                        help="policy model for both systems: a local model dir or hub id (default: the embedded "
                             "SmolLM2); bench/random_twin.py makes a random-weight twin of its shapes")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/grpo-DATE-HOST.json")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def checked_systems(args: argparse.Namespace) -> list[str]:
    """The systems to run, after the checks that need no model: names, steps, TRL installed, overrides."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()] + (["trl-bf16"] * args.trl_bf16)
    systems = list(dict.fromkeys(systems))
    if unknown := [s for s in systems if s not in SYSTEMS]:
        raise SystemExit(f"unknown system(s) {', '.join(unknown)}: choose from {', '.join(SYSTEMS)}")
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2: step 1 is warm-up and is not timed")
    if any(s.startswith("trl") for s in systems) and importlib.util.find_spec("trl") is None:
        raise SystemExit("TRL is not installed: pip install -e '.[bench]' (make bench does it)")
    try:  # a bad override fails now, not minutes later inside the purplerl child
        purplerl_config(Work(steps=args.steps, model=args.model), Path(tempfile.gettempdir()), args.purplerl_set)
    except UserError as err:
        raise SystemExit(f"--purplerl-set: {err}") from None
    for s in unfair_sets(args.purplerl_set):
        print(f"warning: --purplerl-set {s} changes the work itself: purplerl and TRL no longer do the same work",
              file=sys.stderr)
    return systems


def measure_peaks() -> dict[str, dict[str, Any]]:
    print(f"measuring matmul peaks ({', '.join(f'{n}²' for n in PEAK_SIZES)}, {torch.get_num_threads()} threads)",
          flush=True)
    return {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}


def best_peaks(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The better of the peaks measured before and after the children: a busy machine only lowers a peak."""
    return {name: {**max(before[name], after[name], key=lambda p: p["gflops"]),
                   "before_gflops": before[name]["gflops"], "after_gflops": after[name]["gflops"]}
            for name in before}


def learning_comparison(curves: dict[str, list[float]]) -> dict[str, dict[str, float | bool]]:
    """purplerl's toxicity over the second half of the run against each other system's.

    Per system: the mean of the second-half steps and its standard error (steps treated as independent
    draws around a plateau); purplerl is "not below beyond noise" when its mean is no more than two standard
    errors of the difference under the other's."""
    def half_stats(curve: list[float]) -> tuple[float, float]:
        tail = curve[len(curve) // 2:]
        spread = statistics.stdev(tail) if len(tail) > 1 else 0.0
        return statistics.fmean(tail), spread / math.sqrt(len(tail))

    ours, ours_se = half_stats(curves["purplerl"])
    out: dict[str, dict[str, float | bool]] = {}
    for name, curve in curves.items():
        if name == "purplerl":
            continue
        theirs, theirs_se = half_stats(curve)
        se = math.sqrt(ours_se**2 + theirs_se**2)
        out[name] = {"purplerl_second_half_mean": ours, "other_second_half_mean": theirs,
                     "difference": ours - theirs, "difference_se": se,
                     "purplerl_not_below_beyond_noise": ours - theirs >= -2 * se}
    return out


def write_report(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result["systems"], out.with_suffix(".png"), f"GRPO toxicity per step ({result['host']}, {result['date']})")
    peaks, machine = result["peaks_gflops"], result["machine"]
    where = machine["gpu"] or f"{machine['cpu']}, {machine['torch_threads']} threads"
    print(f"GRPO step on {where}; matmul peak "
          f"fp32 {peaks['fp32']['gflops']} GFLOP/s, bf16 {peaks['bf16']['gflops']} GFLOP/s")
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
    work, sets = Work(steps=args.steps, model=args.model), args.purplerl_set
    if args.child:
        run_child_process(args.child, work, sets, args.child_out)
        return
    systems = checked_systems(args)
    try:
        model_path = resolve_model_path(work.model)  # builds the embedded model's cache once, before any child
    except UserError as err:
        raise SystemExit(f"--model: {err}") from None
    from transformers import AutoConfig

    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_path))
    before = measure_peaks()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        for system in systems:
            print(f"running {system}: {work.steps} steps in a child process", flush=True)
            results[system] = run_child(system, work, sets, Path(tmp))
    peaks = best_peaks(before, measure_peaks())
    for result in results.values():
        add_flops(result["steps"], shape, work.lora_rank)
        result["summary"] = summarize(result["steps"], peaks)
    ratios = {f"{name} / purplerl median s/step": results[name]["summary"]["step_s"]["median"]
              / results["purplerl"]["summary"]["step_s"]["median"] for name in results
              if name != "purplerl" and "purplerl" in results}
    host, today = platform.node() or "unknown", datetime.date.today().isoformat()
    work_info = {**asdict(work), "model_path": model_path, "shape": asdict(shape),
                 "matmul_params_per_token": matmul_params(shape), "lora_params": lora_params(shape, work.lora_rank),
                 "purplerl_overrides": sets, "overrides_changing_work": unfair_sets(sets)}
    write_report({"benchmark": "grpo-step", "date": today, "host": host, "machine": machine_info(),
                  "peaks_gflops": peaks, "work": work_info, "flops_convention": grpo_flops.__doc__,
                  "systems": results, "ratios": ratios,
                  "learning": learning_comparison({n: [s["toxicity"] for s in r["steps"]] for n, r in results.items()})
                  if "purplerl" in results else {}}, args.out or RESULTS / f"grpo-{today}-{host}.json")


if __name__ == "__main__":
    main()
