"""The recipes' shared helper, and no recipe: what a finished run prints (first vs last steps of the watched metrics,
samples before/after, the run dir). Every recipe folder may import it; it imports none of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from purplerl.runs.checkpoints import latest_checkpoint
from purplerl.runs.layout import METRICS_FILE, SAMPLES_FILE
from purplerl.train.recipe import Recipe
from purplerl.train.sinks import read_jsonl

SHOWN_SCORES = ("toxicity", "refusal", "response_entropy", "entropy_bonus")  # sample-row fields printed when present


def mean_or_nan(values: list[float]) -> float:
    """The mean; nan for no values (a metric the run never logged)."""
    return sum(values) / len(values) if values else float("nan")


def summarize_run(run_dir: Path, summary: dict[str, Any], watched: dict[str, str], window: int = 5,
                  shown: int = 3) -> str:
    """`watched` maps a metrics.jsonl key to its label, e.g. {"toxicity/mean": "mean toxicity"}."""
    metrics = read_jsonl(run_dir / METRICS_FILE)
    samples = read_jsonl(run_dir / SAMPLES_FILE)
    lines = [f"run dir: {run_dir}", f"stopped: {summary['stop_reason']} (last step {summary['last_step']})"]
    if summary.get("nothing_to_do"):
        lines.insert(0, "nothing to resume: the run had already finished")
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        lines.append(f"adapter: {checkpoint}")
    for key, label in watched.items():
        values = [m[key] for m in metrics if key in m]
        if values:
            first, last, k = mean_or_nan(values[:window]), mean_or_nan(values[-window:]), min(window, len(values))
            lines.append(f"{label}, first {k} steps: {first:.3f}   last {k} steps: {last:.3f}   "
                         f"(change {last - first:+.3f})")
    if samples:
        for label, step in (("before", samples[0]["step"]), ("after", samples[-1]["step"])):
            rows = list({s["uid"]: s for s in reversed(samples) if s["step"] == step}.values())[::-1]
            lines.append(f"--- {label} (step {step}) ---")
            for row in rows[:shown]:
                text = " ".join(row["completion"].split())[:200]
                scores = "  ".join(f"{k} {row[k]:.2f}" for k in SHOWN_SCORES if k in row)
                lines.append(f"[{scores}] {row['prompt'][:70]}\n    -> {text}")
    return "\n".join(lines)


def finished_run_summary(recipe: Recipe, summary: dict[str, Any], config: Any) -> str:
    """What a finished run of `recipe` prints: its own `summarize`, else `summarize_run` over its summary metrics."""
    run_dir = Path(summary["run_dir"])
    if recipe.summarize is not None:
        return recipe.summarize(run_dir, summary, config)
    return summarize_run(run_dir, summary, recipe.summary_metrics)
