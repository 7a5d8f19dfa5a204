"""The pipeline's gates and its adversarial validator: pure functions with hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from purplerl.errors import ExperimentError
from purplerl.experiments.pipeline.gates import Bound, check, check_all, failures, resolve
from purplerl.experiments.pipeline.validator import (
    DEGENERATE,
    DISTINCT,
    EMPTY,
    TOP_SHARE,
    DegenerateBounds,
    degeneracy,
    empty_frac,
    high_reward_low_judge,
    mean_nll,
    mean_repetition,
    text_checks,
    top_share,
    win_outcomes,
)

PREVIOUS = {"utility/arithmetic": {"mean": 0.5, "low": 0.3, "high": 0.7, "n": 10}, "validator/nll": {"mean": 2.0}}


def test_a_numeric_bound_passes_inside_and_fails_outside_naming_the_side() -> None:
    gate = Bound("refusal/harmful/greedy", 0.5, None)
    assert check(gate, {"refusal/harmful/greedy": {"mean": 0.6}}, {})["passed"] is True
    failed = check(gate, {"refusal/harmful/greedy": {"mean": 0.4}}, {})
    assert (failed["passed"], failed["value"], failed["lower"], failed["upper"]) == (False, 0.4, 0.5, None)
    assert failed["reason"] == "refusal/harmful/greedy 0.400 < 0.500 (min 0.5)"
    at_bound = check(Bound("x", 0.5, 0.5), {"x": {"mean": 0.5}}, {})
    assert at_bound["passed"] is True  # the bounds are inclusive


def test_within_the_previous_models_interval() -> None:
    gate = Bound("utility/arithmetic", "previous.low", "previous.high")
    refs = {"previous": PREVIOUS}
    assert check(gate, {"utility/arithmetic": {"mean": 0.5}}, refs)["passed"] is True
    below = check(gate, {"utility/arithmetic": {"mean": 0.2}}, refs)
    assert (below["lower"], below["upper"]) == (0.3, 0.7)
    assert below["reason"] == "utility/arithmetic 0.200 < 0.300 (min previous.low, max previous.high)"
    above = check(gate, {"utility/arithmetic": {"mean": 0.8}}, refs)
    assert above["reason"] == "utility/arithmetic 0.800 > 0.700 (min previous.low, max previous.high)"


def test_a_reference_to_a_metric_without_interval_reads_its_mean() -> None:
    assert resolve("previous.high", "validator/nll", {"previous": PREVIOUS}) == (2.0, "")
    assert resolve("start.low", "validator/nll", {"start": {"validator/nll": {"mean": 1.5}}}) == (1.5, "")
    assert resolve(0.25, "anything", {}) == (0.25, "")
    result = check(Bound("validator/nll", None, "previous.mean"), {"validator/nll": {"mean": 2.5}},
                   {"previous": PREVIOUS})
    assert (result["passed"], result["upper"]) == (False, 2.0)


def test_an_unmeasured_metric_or_reference_skips_its_gate() -> None:
    skipped = check(Bound("judge/win_rate", 0.5), {}, {})
    assert (skipped["passed"], skipped["reason"]) == (None, "not measured")
    no_reference = check(Bound("judge/win_rate", "previous.low"), {"judge/win_rate": {"mean": 0.4}}, {"previous": {}})
    assert (no_reference["passed"], no_reference["value"], no_reference["reason"]) == (
        None, 0.4, "previous has no judge/win_rate")
    results = check_all([Bound("a", 1.0), Bound("b", None, 1.0), Bound("c", 0.0)],
                        {"a": {"mean": 0.0}, "b": {"mean": 0.5}}, {})
    assert [r["passed"] for r in results] == [False, True, None]
    assert failures(results) == ["a 0.000 < 1.000 (min 1)"]


def test_mean_nll_is_the_masked_mean_negative_logprob() -> None:
    logprobs_NT = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    mask_NT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert mean_nll(logprobs_NT, mask_NT) == pytest.approx((1 + 2 + 3) / 3)
    with pytest.raises(ExperimentError, match="every answer is empty"):
        mean_nll(logprobs_NT, torch.zeros(2, 3))


def test_empty_and_top_shares_and_repetition() -> None:
    assert empty_frac(["", "  ", "a", "b"]) == 0.5
    assert top_share(["a", "a ", "b", "c"]) == 0.5  # surrounding whitespace does not make another text
    # "a b c a b c": 3-grams (a b c) (b c a) (c a b) (a b c), 3 unique of 4 -> 0.25; "x y z": 0
    assert mean_repetition(["a b c a b c", "x y z"], 3) == pytest.approx(0.125)
    with pytest.raises(ExperimentError, match="no answers"):
        top_share([])


def test_degeneracy_flags_each_bound() -> None:
    bounds = DegenerateBounds(max_empty_frac=0.25, max_top_share=0.5, min_distinct=0.4)
    # one answer for three of four prompts; bigrams (hi there) x3 + (bye now): 2 distinct of 4
    constant = degeneracy(["hi there", "hi there", "hi there", "bye now"], 2, bounds)
    assert constant == {EMPTY: 0.0, TOP_SHARE: 0.75, DISTINCT: 0.5, DEGENERATE: 1.0}
    healthy = degeneracy(["a b", "c d", "e f", "g h"], 2, bounds)
    assert healthy == {EMPTY: 0.0, TOP_SHARE: 0.25, DISTINCT: 1.0, DEGENERATE: 0.0}
    # bigrams (a a) x3 and (a a) (a a) (a b): 2 distinct of 6 = 0.333 < 0.4, while the top share 0.5 is allowed
    assert degeneracy(["a a a a", "a a a b"], 2, bounds)[DEGENERATE] == 1.0
    assert degeneracy(["", "", "x y", "z w"], 2, bounds)[EMPTY] == 0.5  # half empty: > 0.25
    assert degeneracy(["", "", "x y", "z w"], 2, bounds)[DEGENERATE] == 1.0
    checks = text_checks(["a b c a b c", "x y z"], 3, 2, DegenerateBounds())
    assert checks["validator/repetition"] == pytest.approx(0.125) and checks[DEGENERATE] == 0.0


def test_high_reward_with_low_judge_share() -> None:
    # rewards 1..4: the 0.75 quantile is 3.25, so only reward 4 is high; judge 4..1: the 0.25 quantile is 1.75,
    # so only the judge's 1 is low; both are the last answer -> 1 of 4
    assert high_reward_low_judge([1, 2, 3, 4], [4, 3, 2, 1]) == 0.25
    assert high_reward_low_judge([1, 2, 3, 4], [1, 2, 3, 4]) == 0.0  # the judge agrees
    assert high_reward_low_judge([2, 2, 2, 2], [4, 3, 2, 1]) == 0.0  # no reward stands out
    # rewards 1..8: 0.75 quantile 6.25 -> answers 7 and 8 are high; judge [5,6,7,8,4,3,2,1]: 0.25 quantile 2.75
    # -> the last two are low; both high-reward answers are among them -> 2 of 8
    assert high_reward_low_judge(range(1, 9), [5, 6, 7, 8, 4, 3, 2, 1]) == 0.25
    assert high_reward_low_judge(range(1, 9), [5, 6, 7, 8, 4, 3, 2, 1], top=0.125, bottom=0.125) == 0.125
    with pytest.raises(ExperimentError, match="3 rewards but 2 judge scores"):
        high_reward_low_judge([1, 2, 3], [1, 2])
    with pytest.raises(ExperimentError, match="not finite"):
        high_reward_low_judge([1.0, float("nan")], [1.0, 2.0])


def test_win_outcomes_count_ties_half() -> None:
    assert win_outcomes([1.0, 2.0, 3.0], [0.0, 2.0, 4.0]) == [1.0, 0.5, 0.0]
    with pytest.raises(ExperimentError):
        win_outcomes([1.0], [1.0, 2.0])
