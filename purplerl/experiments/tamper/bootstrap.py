"""Intervals over seeds for tamper-test: a two-level cluster bootstrap of the held-out harm rates.

A run's held-out harm at an evaluated step is the share of its P held-out prompts judged harmful, so two sources
of noise sit in a side's mean over N seeds: which seeds ran, and which prompts each seed's harm was measured on.
Each of `N_RESAMPLES` resamples draws N seeds with replacement, then, within each drawn seed, its P prompts with
replacement (one draw per seed, kept for all of its evaluated steps, so a prompt's whole curve moves together),
recomputes each drawn seed's curve, its AUC and final harm (stats.curve_stats' definitions), and takes their mean
over the drawn seeds. The interval is the 2.5% and 97.5% quantiles of those means (the percentile interval;
Davison & Hinkley 1997, sec. 2.4 and 3.8 for resampling clustered data at both stages). Every resampled
statistic is a mean of shares in [0, 1], so the interval lies in [0, 1]: the Student-t interval over 3 seed
means it replaces ran below 0 (final harm 0.185 [-0.258, 0.629]).

Runs whose records lack the per-prompt verdicts (evaluated before they were stored) get the seed bootstrap of
their statistics instead (`SEED_FALLBACK`), which leaves the prompt noise out; steps to threshold, a step count
and not a rate, always gets the seed bootstrap (`SEED_ONLY`). The generator is seeded (`SEED`), so an interval is
a pure function of the runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from purplerl.errors import ExperimentError
from purplerl.eval.metrics import bootstrap_ci

N_RESAMPLES = 2000
SEED = 0
ALPHA = 0.05
RATES = ("auc", "final_harm")  # the statistics that are means of per-prompt 0/1 verdicts
CLUSTER = f"cluster bootstrap (seeds, prompts nested), {N_RESAMPLES} resamples"
ONE_SEED = f"prompt bootstrap within the one seed, {N_RESAMPLES} resamples (no seed-to-seed variation)"
SEED_ONLY = f"seed bootstrap, {N_RESAMPLES} resamples"
SEED_FALLBACK = f"{SEED_ONLY} (these runs' records have no per-prompt verdicts: prompt noise not resampled)"
NO_INTERVAL = "one seed: no interval"


def _interval(values: Sequence[float], low: float | None, high: float | None, method: str) -> dict[str, Any]:
    return {"mean": sum(values) / len(values), "low": low, "high": high, "n": len(values), "values": list(values),
            "method": method}


def seed_interval(values: Sequence[float], method: str = SEED_ONLY) -> dict[str, Any]:
    """{"mean", "low", "high", "n", "values", "method"}: the mean over seeds with its 95% percentile interval from
    resampling the seeds' values (None for one value: resampling one value shows no variation)."""
    if not values:
        raise ExperimentError("no runs to aggregate")
    if len(values) == 1:
        return _interval(values, None, None, NO_INTERVAL)
    _, low, high = bootstrap_ci(values, n_resamples=N_RESAMPLES, alpha=ALPHA, seed=SEED)
    return _interval(values, low, high, method)


def flag_matrix(flags: Sequence[str]) -> np.ndarray:
    """Per-prompt verdicts, one '0'/'1' string per evaluated step, as a steps x prompts 0/1 array."""
    if not flags or len({len(row) for row in flags}) != 1 or not flags[0]:
        raise ExperimentError(f"per-prompt verdicts need the same non-zero number of prompts at every evaluated "
                              f"step, got {[len(row) for row in flags]}")
    if any(set(row) - {"0", "1"} for row in flags):
        raise ExperimentError("per-prompt verdicts are strings of '0' and '1'")
    return np.array([[char == "1" for char in row] for row in flags], dtype=np.float64)


def _resampled_rates(steps_S: np.ndarray, flags_SP: np.ndarray, draws: int,
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
    """AUC and final harm of `draws` prompt resamples of one run (each draw one index set for all its steps)."""
    prompts = flags_SP.shape[1]
    picks_DP = rng.integers(0, prompts, size=(draws, prompts))
    counts_DP = np.zeros((draws, prompts))  # how often each prompt is drawn: memory draws x prompts, not x steps
    np.add.at(counts_DP, (np.arange(draws)[:, None], picks_DP), 1.0)
    rates_SD = flags_SP @ counts_DP.T / prompts
    area_D = (np.diff(steps_S)[:, None] * (rates_SD[1:] + rates_SD[:-1]) / 2).sum(axis=0)
    return {"auc": area_D / steps_S[-1], "final_harm": rates_SD[-1]}


def cluster_intervals(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """RATES -> interval, from each run's "harm_curve" [(step, harm), ...] and "harm_flags" (one '0'/'1' string
    per evaluated step), by the two-level cluster bootstrap. The point is the mean of the runs' own statistics."""
    if not runs:
        raise ExperimentError("no runs to aggregate")
    rng = np.random.default_rng(SEED)
    picks_BN = rng.integers(0, len(runs), size=(N_RESAMPLES, len(runs)))
    totals = {metric: np.zeros(N_RESAMPLES) for metric in RATES}
    for index, run in enumerate(runs):
        steps_S = np.array([step for step, _ in run["harm_curve"]], dtype=np.float64)
        flags_SP = flag_matrix(run["harm_flags"])
        if len(flags_SP) != len(steps_S):
            raise ExperimentError(f"run {run.get('run')}: {len(flags_SP)} steps of per-prompt verdicts for "
                                  f"{len(steps_S)} evaluated steps")
        rows_D = np.nonzero(picks_BN == index)[0]  # the resample of each draw of this run (twice if drawn twice)
        for metric, values_D in _resampled_rates(steps_S, flags_SP, len(rows_D), rng).items():
            np.add.at(totals[metric], rows_D, values_D)
    method = CLUSTER if len(runs) > 1 else ONE_SEED
    out = {}
    for metric in RATES:
        low, high = np.quantile(totals[metric] / len(runs), [ALPHA / 2, 1 - ALPHA / 2])
        out[metric] = _interval([float(run[metric]) for run in runs], float(low), float(high), method)
    return out


def rate_intervals(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """RATES -> interval: the cluster bootstrap where every run has per-prompt verdicts, else the seed bootstrap."""
    if runs and all(run.get("harm_flags") for run in runs):
        return cluster_intervals(runs)
    return {metric: seed_interval([float(run[metric]) for run in runs], SEED_FALLBACK) for metric in RATES}
