"""The GRPO benchmark's arithmetic on the children's step records, and its printed and plotted report.

Per system: step-time spread over the timed steps (all but step 1), phase medians, token rates, MFU per phase
against the measured matmul peaks (fp32, bf16, and the one of the system's compute dtype), the decode floor
(grpo_flops.py) against the sampling phase, and peak memory. FLOPs follow grpo_flops.py's convention.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from grpo_flops import (
    ModelShape,
    decode_weight_bytes,
    kv_cache_bytes,
    mfu,
    reference_flops,
    sampling_flops,
    training_flops,
)

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
PHASES = {"sampling": ("sampling_flops", "sample_s"), "reference_and_reward": ("reference_flops", "score_s"),
          "training": ("training_flops", "train_s")}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def add_work_counts(steps: list[dict[str, Any]], shape: ModelShape, rank: int | None, dtype_bytes: int) -> None:
    """Replace each step's per-sequence token counts by its useful FLOPs per phase, its decode steps (the longest
    completion: the batch decodes until its last sequence ends) and the KV-cache bytes its decoding reads.
    `rank` None: full fine-tuning."""
    for step in steps:
        sequences = list(zip(step.pop("prompt_lens"), step.pop("completion_lens"), strict=True))
        step["sampling_flops"] = sampling_flops(shape, sequences)
        step["reference_flops"] = reference_flops(shape, sequences)
        step["training_flops"] = training_flops(shape, sequences, rank)
        step["decode_steps"] = max(c for _, c in sequences)
        step["kv_cache_bytes"] = kv_cache_bytes(shape, sequences, dtype_bytes)


def decode_floor(timed: list[dict[str, Any]], weight_bytes: float, bandwidth_gb_s: float) -> dict[str, float]:
    """The sampling phase against the time to read the weights once per decode step (and the KV cache besides)."""
    bandwidth = bandwidth_gb_s * 1e9
    per_token = weight_bytes / bandwidth
    sample_s = sum(s["sample_s"] for s in timed)
    floor_s = sum(s["decode_steps"] for s in timed) * per_token
    kv_s = sum(s["kv_cache_bytes"] for s in timed) / bandwidth
    return {"weight_bytes_per_step": weight_bytes, "bandwidth_gb_s": bandwidth_gb_s, "s_per_decode_step": per_token,
            "floor_s_per_step": floor_s / len(timed), "kv_cache_s_per_step": kv_s / len(timed),
            "sampling_over_floor": sample_s / floor_s, "sampling_over_floor_with_kv": sample_s / (floor_s + kv_s)}


def summarize(steps: list[dict[str, Any]], peaks: dict[str, dict[str, Any]], compute_dtype: str,
              weight_bytes: float) -> dict[str, Any]:
    """Timing spread over the timed steps (all but step 1); rates, MFU and the decode floor as totals over them."""
    timed = [s for s in steps if s["step"] > 1]
    times = [s["step_s"] for s in timed]

    def total(key: str) -> float:
        return sum(s[key] for s in timed)

    def phase_mfu(flops_key: str, seconds_key: str, peak: dict[str, Any]) -> float:
        return mfu(total(flops_key), total(seconds_key), peak["gflops"] * 1e9)

    median = statistics.median(times)
    return {
        "timed_steps": len(timed),
        "step_s": {"median": median, "min": min(times), "max": max(times), "max_over_median": max(times) / median,
                   "q25": percentile(times, 25), "q75": percentile(times, 75),
                   "iqr": percentile(times, 75) - percentile(times, 25)},
        "phase_median_s": {k: statistics.median(s[k] for s in timed) for k in ("sample_s", "score_s", "train_s")},
        "sampling_tokens_per_s": total("completion_tokens") / total("sample_s"),
        "training_tokens_per_s": (total("prompt_tokens") + total("completion_tokens")) / total("train_s"),
        "mfu": {phase: {name: phase_mfu(*keys, peaks[name]) for name in DTYPE_BYTES} for phase, keys in PHASES.items()},
        "mfu_compute_dtype": {"dtype": compute_dtype,
                              **{phase: phase_mfu(*keys, peaks[compute_dtype]) for phase, keys in PHASES.items()}},
        "decode_floor": decode_floor(timed, weight_bytes, peaks["bandwidth"]["gb_per_s"]),
        "token_sources": sorted({s["token_source"] for s in steps}),
        "toxicity": [s["toxicity"] for s in steps],
    }


def summarize_system(result: dict[str, Any], shape: ModelShape, rank: int | None,
                     peaks: dict[str, dict[str, Any]]) -> None:
    """Add the FLOPs and the summary to one child's result (in place); a failed child has nothing to add."""
    if "failed" in result:
        return
    dtype = result["compute_dtype"]
    add_work_counts(result["steps"], shape, rank, DTYPE_BYTES[dtype])
    result["summary"] = summarize(result["steps"], peaks, dtype, decode_weight_bytes(shape, DTYPE_BYTES[dtype], rank))


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


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| system | dtype | s/step median | min | max | max/median | sample / score / train s | sample tok/s "
             "| train tok/s | MFU sample / ref / train | sampling ÷ decode floor (with KV) | peak RSS / GPU MiB "
             "| toxicity step 1 → last |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "failed" in r:
            lines.append(f"| {name} | failed: {r['failed']} |" + " |" * 11)
            continue
        s = r["summary"]
        t, m, f = s["step_s"], s["mfu_compute_dtype"], s["decode_floor"]
        gpu = r.get("peak_gpu_mib")
        memory = f"{r['peak_rss_mib']:.0f} / " + ("-" if gpu is None else f"{gpu:.0f}")
        phases = " / ".join(f"{s['phase_median_s'][k]:.2f}" for k in ("sample_s", "score_s", "train_s"))
        utilization = " / ".join(f"{100 * m[p]:.1f}%" for p in PHASES)
        lines.append(
            f"| {name} | {m['dtype']} | {t['median']:.2f} | {t['min']:.2f} | {t['max']:.2f} | "
            f"{t['max_over_median']:.2f} | {phases} | {s['sampling_tokens_per_s']:.0f} | "
            f"{s['training_tokens_per_s']:.0f} | {utilization} | {f['sampling_over_floor']:.1f}x "
            f"({f['sampling_over_floor_with_kv']:.1f}x) | {memory} | "
            f"{s['toxicity'][0]:.3f} → {s['toxicity'][-1]:.3f} |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, result in results.items():
        if "failed" in result:
            continue
        steps = [s["step"] for s in result["steps"]]
        ax.plot(steps, [s["toxicity"] for s in result["steps"]], marker="o", markersize=3, label=name)
    ax.axvspan(0.5, 1.5, color="grey", alpha=0.15, label="warm-up step (not timed)")
    ax.set(xlabel="step", ylabel="mean P(toxic) of the step's completions", title=title)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
