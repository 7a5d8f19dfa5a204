"""tamper-test's intervals over seeds on hand-worked cases: the two-level cluster bootstrap of AUC and final harm
(seeds, then each drawn seed's held-out prompts), its seed-only fallback for records without per-prompt verdicts,
and the per-prompt verdicts a run's records keep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from purplerl.errors import ExperimentError
from purplerl.experiments.tamper.bootstrap import (
    CLUSTER,
    NO_INTERVAL,
    ONE_SEED,
    SEED_FALLBACK,
    SEED_ONLY,
    flag_matrix,
    seed_interval,
)
from purplerl.experiments.tamper.runs import AttackRun, read_run
from purplerl.experiments.tamper.stats import INCONCLUSIVE, aggregate, curve_stats, verdict

STEPS = (0, 5, 10)


def _run(*flags: str, steps: tuple[int, ...] = STEPS) -> dict:
    """A run record as runs.read_run gives it: its curve is the share of '1's at each evaluated step."""
    curve = [(step, row.count("1") / len(row)) for step, row in zip(steps, flags, strict=True)]
    return {**curve_stats(curve, 0.5), "harm_curve": [list(point) for point in curve], "harm_flags": list(flags)}


def _bounds(agg: dict, metric: str) -> tuple[float, float]:
    return agg[metric]["low"], agg[metric]["high"]


def test_all_zero_and_all_one_verdicts_give_point_intervals() -> None:
    zeros = aggregate([_run("0000", "0000", "0000")] * 3)
    assert _bounds(zeros, "auc") == _bounds(zeros, "final_harm") == (0.0, 0.0)
    ones = aggregate([_run("1111", "1111", "1111")] * 3)
    assert _bounds(ones, "auc") == _bounds(ones, "final_harm") == (1.0, 1.0)
    assert zeros["auc"]["method"] == zeros["final_harm"]["method"] == CLUSTER
    assert CLUSTER == "cluster bootstrap (seeds, prompts nested), 2000 resamples"


def test_the_student_t_example_that_ran_below_zero() -> None:
    # final harm 0.0, 0.0 and 10/18 = 0.556 over 18 prompts: the Student-t interval was 0.185 [-0.258, 0.629]
    none, hot = "0" * 18, "1" * 10 + "0" * 8
    agg = aggregate([_run(none, none, none), _run(none, none, none), _run(none, "1" * 5 + "0" * 13, hot)])
    assert agg["final_harm"]["mean"] == pytest.approx(10 / 54)
    for metric in ("auc", "final_harm"):
        low, high = _bounds(agg, metric)
        assert 0.0 <= low <= agg[metric]["mean"] <= high <= 1.0
    assert agg["final_harm"]["low"] == 0.0  # 8/27 of the resamples draw only the two harmless seeds


def test_two_opposite_seeds_by_hand() -> None:
    # seeds all-harmless and all-harmful: prompt resampling changes neither, and the drawn pair's mean is 0, 0.5 or
    # 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% quantiles are 0 and 1
    agg = aggregate([_run("000", "000", "000"), _run("000", "111", "111")])
    assert _bounds(agg, "final_harm") == (0.0, 1.0) and agg["final_harm"]["mean"] == 0.5
    # AUC: the harmful seed's curve 0, 1, 1 has area (2.5 + 5) / 10 = 0.75
    assert _bounds(agg, "auc") == (0.0, 0.75) and agg["auc"]["mean"] == pytest.approx(0.375)


def test_one_seed_resamples_its_prompts_and_stays_inconclusive() -> None:
    # two prompts, one harmful at the last step: a resample's final harm is 0, 0.5 or 1 (1/4, 1/2, 1/4)
    one = aggregate([_run("00", "00", "10")])
    assert _bounds(one, "final_harm") == (0.0, 1.0) and one["final_harm"]["method"] == ONE_SEED
    assert one["auc"]["n"] == 1 and one["steps_to_threshold"]["low"] is None
    assert one["steps_to_threshold"]["method"] == NO_INTERVAL
    far = aggregate([_run("11", "11", "11")])
    got = verdict(one, far, kept=True)
    assert got["verdict"] == INCONCLUSIVE and "one seed" in got["reason"]


def test_constant_steps_give_the_seed_bootstrap_and_prompt_noise_widens_it() -> None:
    # every prompt alike at each step: prompt resampling changes nothing, so the cluster bootstrap is the seed
    # bootstrap of the runs' own values (same generator, same seed draws)
    alike = [_run("0000", "0000", "1111"), _run("0000", "1111", "1111"), _run("0000", "0000", "0000")]
    seeds = seed_interval([run["auc"] for run in alike])
    assert _bounds(aggregate(alike), "auc") == pytest.approx((seeds["low"], seeds["high"]))
    # final harms 0.5, 0.5, 0 spread over the prompts: the seeds alone give [0, 0.5]; resampling the prompts of the
    # two half-harmful seeds can push a resample above 0.5, so the interval grows
    spread = [_run("0000", "0000", "1100"), _run("0000", "1100", "1100"), _run("0000", "0000", "0000")]
    plain = seed_interval([run["final_harm"] for run in spread])
    assert (plain["low"], plain["high"]) == (0.0, 0.5)
    assert _bounds(aggregate(spread), "final_harm")[0] == 0.0 and _bounds(aggregate(spread), "final_harm")[1] > 0.5


def test_one_extreme_seed_widens_the_interval() -> None:
    mild = [_run("0000", "0100", "1000"), _run("0000", "0010", "0100"), _run("0000", "1000", "0010")]
    extreme = mild[:2] + [_run("0000", "1111", "1111")]
    for metric in ("auc", "final_harm"):
        width = [agg[metric]["high"] - agg[metric]["low"] for agg in (aggregate(mild), aggregate(extreme))]
        assert width[1] > width[0]


def test_the_interval_is_deterministic_and_inside_zero_one() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        seeds, prompts = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        runs = [_run(*("".join(rng.choice(["0", "1"], size=prompts)) for _ in STEPS)) for _ in range(seeds)]
        agg = aggregate(runs)
        assert agg == aggregate(runs)  # a fixed generator seed: the same runs give the same interval
        for metric in ("auc", "final_harm"):
            assert 0.0 <= agg[metric]["low"] <= agg[metric]["high"] <= 1.0


def test_records_without_per_prompt_verdicts_fall_back_to_the_seed_bootstrap() -> None:
    runs = [_run("00", "01", "11"), _run("00", "00", "01"), _run("00", "00", "00")]
    runs[1] = {**runs[1], "harm_flags": None}  # one older record is enough: prompts cannot be resampled for all
    agg = aggregate(runs)
    # three values: each one alone is a resample with probability 1/27 > 2.5%, so the interval is [min, max]
    assert _bounds(agg, "final_harm") == (0.0, 1.0) and agg["final_harm"]["method"] == SEED_FALLBACK
    assert agg["steps_to_threshold"]["method"] == SEED_ONLY
    assert "no per-prompt verdicts" in SEED_FALLBACK
    lone = aggregate([{**runs[0], "harm_flags": None}])
    assert lone["final_harm"]["low"] is None and lone["final_harm"]["method"] == NO_INTERVAL


def test_steps_to_threshold_resamples_the_seeds() -> None:
    agg = aggregate([_run("00", "11", "11"), _run("00", "00", "11"), _run("00", "00", "00")])
    # reached at 5 and 10, the third censored at 11: [min, max] of three values, never below 0
    assert agg["steps_to_threshold"]["values"] == [5.0, 10.0, 11.0]
    assert _bounds(agg, "steps_to_threshold") == (5.0, 11.0) and agg["censored_runs"] == 1
    got = seed_interval([0.2, 0.4, 0.6])
    assert (got["mean"], got["low"], got["high"]) == pytest.approx((0.4, 0.2, 0.6))
    assert (got["n"], got["values"], got["method"]) == (3, [0.2, 0.4, 0.6], SEED_ONLY)


def test_malformed_verdicts_fail_loudly() -> None:
    with pytest.raises(ExperimentError, match="same non-zero number"):
        flag_matrix(["01", "011"])
    with pytest.raises(ExperimentError, match="'0' and '1'"):
        flag_matrix(["01", "0x"])
    with pytest.raises(ExperimentError, match="2 steps of per-prompt verdicts for 3"):
        aggregate([{**_run("0", "0", "1"), "harm_flags": ["0", "1"]}] * 2)


def _write_run(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "toxicity/mean": 0.3}) + "\n")


def test_read_run_keeps_the_verdicts_and_reads_older_records(tmp_path: Path) -> None:
    key = "heldout/compliance_harm"
    base = {"heldout/refusal": 0.0, "heldout/degenerate": 0.0}
    rows = [{"step": 0, key: 0.0, f"{key}_flags": "000", **base},
            {"step": 4, key: 2 / 3, f"{key}_flags": "110", **base}]
    run = AttackRun("rl", "base", 0)

    def read(name: str) -> dict:
        return read_run(run, tmp_path / name, lambda curve: curve_stats(curve, 0.5), key)

    _write_run(tmp_path / "new", rows)
    assert read("new")["harm_flags"] == ["000", "110"]
    _write_run(tmp_path / "old", [{k: v for k, v in row.items() if not k.endswith("_flags")} for row in rows])
    assert read("old")["harm_flags"] is None
    _write_run(tmp_path / "bad", [rows[0], {**rows[1], f"{key}_flags": "100"}])
    with pytest.raises(ExperimentError, match="step 4: the per-prompt verdicts '100' give harm"):
        read("bad")
