"""Early-stop rules shared by recipes: a step metric crossing its threshold ends the run; a collapse of the
model's outputs (empty, constant, or entropy jumping) ends it as a failure."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.config.sections import RLSettings
from purplerl.errors import ExperimentError, UserError
from purplerl.runs.checkpoints import checkpoint_dirs
from purplerl.runs.layout import COLLAPSED_DIR

EarlyStop = Callable[[dict[str, float]], str | None]


class Collapse(str):
    """A stop reason that says the model collapsed: the run failed, its last step is not a result."""


def collapse_error(recipe: str, summary: dict[str, Any]) -> ExperimentError | None:
    """The one-line failure of a run that stopped on a collapse, else None: the command exits non-zero with it."""
    if not isinstance(summary.get("stop_reason"), Collapse):
        return None
    reason = summary["stop_reason"].removeprefix("collapsed: ")
    return ExperimentError(f"{recipe} collapsed at step {summary['last_step']}: {reason}")


def threshold_stop(metric: str, bound: float | None, label: str, why: str | None = None) -> EarlyStop:
    """Stop when the step's `metric` (a metrics.jsonl key a recipe names) exceeds `bound` (None: never)."""

    def early_stop(metrics: dict[str, float]) -> str | None:
        value = metrics.get(metric)
        if bound is None or value is None or not value > bound:
            return None
        return f"{label} {value:.3f} > {bound}" + (f" ({why})" if why else "")

    return early_stop


@dataclass(frozen=True)
class CollapseBounds:
    """When a step's completions count as collapsed (see `collapse_reason`)."""

    max_empty_frac: float = 0.25  # share of completions with no visible text
    max_top_share: float = 0.9  # share of the batch taken by its single most common completion
    # Largest change of mean token entropy (nats) from one step to the next. The scale is log V (10.8 nats on
    # SmolLM2's 49k vocabulary, the entropy of uniform junk). The default defend run on the aligned embedded
    # model moved at most 0.27 nats between steps (batch-to-batch noise of 8 prompts x 4 answers, and the
    # noiser steps); the collapsed run on the instruct model swung between 0.7 and 7 nats. 2 nats is over
    # seven times the healthy variation and a fifth of log V: answers turning to junk (or silence) at once.
    # The same bound holds for a slow climb: mean entropy rising more than this above the mean of the first
    # `start_steps` steps the rule saw. The default defend run stayed within 0.05 nats above its start; with
    # the paper's noise weight it climbed 0.1-0.6 nats a step to 7.8 (step 40), past the bound at step 23.
    # Only a rise: entropy falling far is what the defense asks for, and silence or one text is caught above.
    max_entropy_swing: float = 2.0
    start_steps: int = 5


def collapse_reason(metrics: dict[str, float], previous_entropy: float | None, bounds: CollapseBounds,
                    start_entropy: float | None = None) -> str | None:
    """One line saying how the step's completions collapsed, or None. Reads the loop's `completion/empty_frac`,
    `completion/top_share` and `entropy/mean` (mean token entropy of the sampled completions); `start_entropy`
    is the mean over the run's first `bounds.start_steps` steps (None until there are that many)."""
    empty, top, entropy = (metrics.get(k) for k in ("completion/empty_frac", "completion/top_share", "entropy/mean"))
    if empty is not None and empty > bounds.max_empty_frac:
        return f"{empty:.0%} of the completions are empty (bound {bounds.max_empty_frac:.0%})"
    if top is not None and top > bounds.max_top_share:
        return f"{top:.0%} of the completions are one identical text (bound {bounds.max_top_share:.0%})"
    swing = None if entropy is None or previous_entropy is None else abs(entropy - previous_entropy)
    if swing is not None and swing > bounds.max_entropy_swing:
        return (f"mean token entropy jumped {previous_entropy:.2f} -> {entropy:.2f} nats in one step "
                f"(bound {bounds.max_entropy_swing:g})")
    if entropy is not None and start_entropy is not None and entropy - start_entropy > bounds.max_entropy_swing:
        return (f"mean token entropy rose to {entropy:.2f} nats from {start_entropy:.2f} over the first "
                f"{bounds.start_steps} steps (bound +{bounds.max_entropy_swing:g})")
    return None


def collapse_early_stop(bounds: CollapseBounds) -> EarlyStop:
    """A stateful stop rule: it remembers the entropies it saw to measure swings and the rise above the start
    (after a resume, the start is the first steps after it)."""
    previous: list[float] = []

    def early_stop(metrics: dict[str, float]) -> str | None:
        n = bounds.start_steps
        start = sum(previous[:n]) / n if len(previous) >= n else None
        reason = collapse_reason(metrics, previous[-1] if previous else None, bounds, start)
        if "entropy/mean" in metrics:
            previous.append(metrics["entropy/mean"])
        return Collapse(f"collapsed: {reason}") if reason is not None else None

    return early_stop


def first_stop(*rules: EarlyStop) -> EarlyStop:
    """Every rule sees every step (stateful ones keep their history); the first reason given wins."""

    def early_stop(metrics: dict[str, float]) -> str | None:
        reasons = [rule(metrics) for rule in rules]
        return next((r for r in reasons if r is not None), None)

    return early_stop


def set_aside_collapsed(run_dir: Path, step: int) -> list[Path]:
    """A collapse seen in step `step`'s samples was drawn from the weights saved after step - 1: move such a
    checkpoint out of `checkpoints/` so that the latest one left is the last healthy state."""
    moved = []
    for path in checkpoint_dirs(run_dir):
        if int(path.name.split("_")[1]) >= step - 1:
            target = Path(run_dir) / COLLAPSED_DIR / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            path.rename(target)
            moved.append(target)
    return moved


def rl_stops(config: RLSettings, *rules: EarlyStop) -> EarlyStop:
    """A recipe's own rules, the repetition threshold (on the repetition term, which an RL recipe's reward must
    then name, at any weight), and collapse detection when training.collapse_stop is on."""
    t = config.training
    if t.early_stop_repetition is not None and "repetition" not in config.reward.terms:
        raise UserError(f"training.early_stop_repetition={t.early_stop_repetition} watches the repetition reward "
                        f"term: add it to reward.terms (weight 0 logs it) or set the stop to null")
    rules = (*rules, threshold_stop("repetition/mean", t.early_stop_repetition, "mean repetition ratio",
                                    why="reward hacking by repetition"))
    if t.collapse_stop:
        rules = (collapse_early_stop(CollapseBounds(t.collapse_empty_frac, t.collapse_top_share,
                                                    t.collapse_entropy_swing)), *rules)
    return first_stop(*rules)
