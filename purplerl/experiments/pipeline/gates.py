"""Capability gates: bounds on named metrics of a stage's eval, and the decision they make.

A metric is {"mean": value} with, where it has one, its 95% interval ("low", "high") and count ("n"). A bound is a
number or a reference to another model's metric: `previous.low` is the low end of the interval of the model the
stage started from (the last passing one), `start.mean` the start model's value. `within_ci_of: previous` is
min previous.low, max previous.high: the stage must stay inside the interval the model before it had (as `purplerl
align` checks its utility against the base's). A metric or reference that was not measured (a win rate without a
judge, the reward/judge check of a stage trained on no reward) skips its gate, recorded with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Metric = Mapping[str, float]  # {"mean": ..., "low": ..., "high": ..., "n": ...}
Metrics = Mapping[str, Metric]


@dataclass(frozen=True)
class Bound:
    """`metric`'s mean must lie within [lower, upper]: each a number, a reference like 'previous.low', or None
    (unbounded on that side)."""

    metric: str
    lower: float | str | None = None
    upper: float | str | None = None

    def describe(self) -> str:
        sides = [f"{name} {value:g}" if isinstance(value, float | int) else f"{name} {value}"
                 for name, value in (("min", self.lower), ("max", self.upper)) if value is not None]
        return ", ".join(sides)


def resolve(bound: float | str | None, metric: str, references: Mapping[str, Metrics]) -> tuple[float | None, str]:
    """(the bound as a number, '') or (None, why it cannot be resolved). A reference's low/high falls back to its
    mean for a metric without an interval."""
    if bound is None or isinstance(bound, int | float):
        return bound, ""
    label, _, side = bound.partition(".")
    measured = references.get(label, {}).get(metric)
    if measured is None:
        return None, f"{label} has no {metric}"
    return float(measured.get(side, measured["mean"])), ""


def check(bound: Bound, metrics: Metrics, references: Mapping[str, Metrics]) -> dict[str, Any]:
    """One gate's result: the value, the resolved bounds and passed (True, False, or None when skipped, with the
    reason)."""
    result: dict[str, Any] = {"metric": bound.metric, "bound": bound.describe(), "value": None, "lower": None,
                              "upper": None, "passed": None, "reason": ""}
    measured = metrics.get(bound.metric)
    if measured is None:
        return {**result, "reason": "not measured"}
    value = float(measured["mean"])
    (lower, why_low), (upper, why_high) = (resolve(b, bound.metric, references) for b in (bound.lower, bound.upper))
    if why_low or why_high:
        return {**result, "value": value, "reason": why_low or why_high}
    passed = (lower is None or value >= lower) and (upper is None or value <= upper)
    return {**result, "value": value, "lower": lower, "upper": upper, "passed": passed,
            "reason": "" if passed else failure_line(bound.metric, value, lower, upper, bound.describe())}


def failure_line(metric: str, value: float, lower: float | None, upper: float | None, written: str) -> str:
    """'utility/arithmetic 0.100 < 0.300 (min previous.low)': which side failed, the numbers and the gate."""
    if lower is not None and value < lower:
        return f"{metric} {value:.3f} < {lower:.3f} ({written})"
    return f"{metric} {value:.3f} > {upper:.3f} ({written})"


def check_all(bounds: Sequence[Bound], metrics: Metrics, references: Mapping[str, Metrics]) -> list[dict[str, Any]]:
    return [check(bound, metrics, references) for bound in bounds]


def failures(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The failure line of every gate that failed (skipped gates do not fail)."""
    return [str(result["reason"]) for result in results if result["passed"] is False]
