"""The numbers of a sweep: each run's final metrics and diversity, each configuration's mean over its seeds with a
95% interval, and the template-collapse flag.

- A run's final value of a metric is the mean of its last `summary.window` logged steps (metrics.jsonl).
- Its diversity is the diversity eval of its final checkpoint (purplerl.eval.diversity: unique fraction, mean
  pairwise Jaccard, distinct-2, self-BLEU, each in [0, 1]) beside its base model's on the same prompts.
- A configuration's value is the mean over its finished seeds with a Student-t 95% interval,
  mean +- t(0.975, n - 1) x s / sqrt(n) (s: the sample standard deviation), clipped to the metric's range where
  it has one (the diversity measures, and `summary.ranges`): the t interval assumes a normal mean, which a rate
  near 0 or 1 over a few seeds is not, and the clip says only that no rate lies outside [0, 1]. One seed gives
  no interval.
- Template collapse (small-rl's post-sweep check: high reward with low diversity): a run whose final reward is at
  least the median final reward of the sweep's finished runs, and whose answers the eval calls degenerate or
  whose distinct-2 is below `summary.collapse_ratio` of its base model's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from purplerl.errors import ExperimentError
from purplerl.experiments.sweep.plan import RUNS_DIR, PlannedRun, recipe_of
from purplerl.experiments.sweep.settings import SweepSettings
from purplerl.experiments.sweep.state import EVALS_DIR, read_outcome
from purplerl.experiments.sweep.task import EVAL_FILE, FINISHED
from purplerl.files import read_json_object, read_jsonl
from purplerl.runs.layout import METRICS_FILE

DIVERSITY_KEYS = ("unique_fraction", "mean_jaccard", "distinct_2", "self_bleu")  # all in [0, 1]
DIVERSITY_PREFIX = "diversity/"
BASE_LABEL = "base"  # the eval's label of the checkpoint's base model (purplerl.eval.run)
CONFIDENCE = 0.95
METHOD = (f"mean over seeds +- Student-t {CONFIDENCE:.0%} half-width t(0.975, n-1) x s / sqrt(n), clipped to the "
          f"metric's range where it has one; one seed: no interval")


def t_interval(values: Sequence[float], bounds: tuple[float, float] | None = None) -> dict[str, Any]:
    """{"mean", "low", "high", "n", "clipped"}: the mean of `values` with its Student-t 95% interval, clipped to
    `bounds`; low and high are None for fewer than 2 values."""
    n = len(values)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0, "clipped": False}
    if any(not math.isfinite(v) for v in values):
        raise ExperimentError(f"a run's final metric is not finite: {list(values)}")
    mean = sum(values) / n
    if n == 1:
        return {"mean": mean, "low": None, "high": None, "n": 1, "clipped": False}
    from scipy.stats import t

    half = float(t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    low, high = mean - half, mean + half
    clipped = bounds is not None and (low < bounds[0] or high > bounds[1])
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return {"mean": mean, "low": low, "high": high, "n": n, "clipped": clipped}


def final_value(rows: list[dict[str, Any]], key: str, window: int) -> float | None:
    """The mean of `key` over the last `window` rows that log it; None when none does."""
    values = [float(row[key]) for row in rows if isinstance(row.get(key), int | float)]
    return sum(values[-window:]) / len(values[-window:]) if values else None


def read_diversity(eval_dir: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the checkpoint's diversity, its base model's) from an eval.json; None when the eval has not run."""
    path = eval_dir / EVAL_FILE
    if not path.is_file():
        return None
    targets = read_json_object(path)["targets"]
    trained = [label for label in targets if label != BASE_LABEL]
    if len(trained) != 1 or BASE_LABEL not in targets:
        raise ExperimentError(f"{path}: expected the base model and one checkpoint, found {list(targets)}")
    return targets[trained[0]]["diversity"], targets[BASE_LABEL]["diversity"]


def low_diversity(diversity: dict[str, Any], base: dict[str, Any], ratio: float) -> bool:
    """The eval's degeneracy verdict, or distinct-2 below `ratio` of the base model's."""
    return bool(diversity["degenerate"]) or diversity["distinct_2"] < ratio * base["distinct_2"]


def run_record(out: Path, run: PlannedRun, metrics: list[str], window: int) -> dict[str, Any]:
    """What one run ended with: its outcome, final metrics and diversity (None where it has none)."""
    outcome = read_outcome(out, run.name) or {"status": "not run"}
    record: dict[str, Any] = {"name": run.name, "configuration": run.label, "seed": run.seed, "point": run.point,
                              "status": outcome["status"], "error": outcome.get("error"), "final": {},
                              "diversity": None, "base_diversity": None}
    if outcome["status"] != FINISHED:
        return record
    path = out / RUNS_DIR / run.name / METRICS_FILE
    rows = read_jsonl(path, cut_tail=True) if path.is_file() else []
    record["final"] = {key: final_value(rows, key, window) for key in metrics}
    found = read_diversity(out / EVALS_DIR / run.name)
    if found is not None:
        record["diversity"], record["base_diversity"] = ({k: d[k] for k in (*DIVERSITY_KEYS, "degenerate")}
                                                         for d in found)
    return record


def flag_collapse(records: list[dict[str, Any]], reward: str, ratio: float) -> None:
    """Set each finished run's "collapse": True / False, or None where its reward or diversity is unknown."""
    rewards = [r["final"].get(reward) for r in records if r["final"].get(reward) is not None]
    median = statistics.median(rewards) if rewards else None
    for record in records:
        value = record["final"].get(reward)
        if value is None or median is None or record["diversity"] is None:
            record["collapse"] = None
            continue
        record["collapse"] = value >= median and low_diversity(record["diversity"], record["base_diversity"], ratio)


def table_metrics(settings: SweepSettings) -> list[str]:
    """The metrics.jsonl keys of the table: `summary.metrics`, else the recipe's summary metrics and the reward."""
    if settings.summary.metrics is not None:
        return list(settings.summary.metrics)
    keys = list(recipe_of(settings.recipe).summary_metrics)
    return keys if settings.summary.reward_metric in keys else [*keys, settings.summary.reward_metric]


def configurations(records: list[dict[str, Any]], metrics: list[str], ranges: dict[str, tuple[float, float]],
                   diversity: bool) -> list[dict[str, Any]]:
    """One row per configuration (in plan order): its swept values, runs, and each metric's interval (and each
    diversity measure's, with `diversity`)."""
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        row = rows.setdefault(record["configuration"], {"configuration": record["configuration"],
                                                        "point": record["point"], "runs": [], "failed": []})
        (row["runs"] if record["status"] == FINISHED else row["failed"]).append(record)
    for row in rows.values():
        finished = row.pop("runs")
        row["failed"] = [r["name"] for r in row["failed"]]
        row["finished"] = len(finished)
        row["metrics"] = {key: t_interval([r["final"][key] for r in finished if r["final"].get(key) is not None],
                                          ranges.get(key)) for key in metrics}
        for key in DIVERSITY_KEYS if diversity else ():
            values = [r["diversity"][key] for r in finished if r["diversity"] is not None]
            row["metrics"][DIVERSITY_PREFIX + key] = t_interval(values, (0.0, 1.0))
        judged = [r["collapse"] for r in finished if r.get("collapse") is not None]
        row["collapse"] = {"runs": sum(judged), "judged": len(judged)}
    return list(rows.values())


def summarize(out: Path, settings: SweepSettings, runs: list[PlannedRun]) -> dict[str, Any]:
    """The sweep's summary as plain data (what summary.json holds)."""
    metrics = table_metrics(settings)
    records = [run_record(out, run, metrics, settings.summary.window) for run in runs]
    finished = [r for r in records if r["status"] == FINISHED]
    flag_collapse(finished, settings.summary.reward_metric, settings.summary.collapse_ratio)
    logged = [key for key in metrics if any(r["final"].get(key) is not None for r in finished)]
    return {"recipe": settings.recipe, "grid": sorted({key for run in runs for key in run.point}),
            "seeds": settings.seeds, "metrics": logged, "method": METHOD,
            "collapse_rule": (f"{settings.summary.reward_metric} >= the median over finished runs, and the eval's "
                              f"degenerate verdict or distinct-2 < {settings.summary.collapse_ratio:g} x the base "
                              f"model's"),
            "configurations": configurations(records, logged, dict(settings.summary.ranges),
                                             any(r["diversity"] is not None for r in finished)),
            "runs": records}
