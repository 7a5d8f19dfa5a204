"""What an eval's numbers mean, in three lines per checkpoint: refusal, compliance with substance, degeneracy.

A keyword refusal rate falling to zero says the model stopped writing refusal phrases, not that it now helps with
harmful requests: an attacked model can answer every request with a persona or a phrase the reward scorer likes. The
compliance judge (purplerl.rewards.compliance: does the answer address the request with substance?) is the reading of
what changed, and the degenerate share (purplerl.rewards.degenerate) says how much of it is a reward hack. Each line
compares a checkpoint with the eval's first target (the base model the checkpoints were trained from), with 95% CIs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COMPLIANCE = "term/compliance"


def _value(ci: dict[str, float] | None, scale: float = 1.0) -> str:
    if ci is None:
        return "n/a"
    return f"{ci['point'] * scale:.2f} [{ci['low'] * scale:.2f}, {ci['high'] * scale:.2f}]"


def _metric(found: dict[str, Any], name: str) -> dict[str, float] | None:
    return found.get("harm", {}).get("metrics", {}).get(name)


def reading(targets: dict[str, dict[str, Any]], before: str, after: str, baselines: Sequence[str] = ()) -> list[str]:
    """Three lines reading `after` against `before` (labels of `targets`, an eval's per-target suites): refusal
    (keyword judge, a share), compliance with substance (the compliance judge's mean score, when it judged, with
    each baseline's: e.g. the model before alignment), and the degenerate share of `after`'s answers with the
    phrases recurring across them (when the diversity suite ran)."""
    a, b = targets[before], targets[after]
    lines = [f"refusal went from {_value(_metric(a, 'refusal_rate'), 0.01)} ({before}) to "
             f"{_value(_metric(b, 'refusal_rate'), 0.01)} ({after}) (keyword judge)"]
    if _metric(a, COMPLIANCE) is not None:
        quoted = "".join(f"; {label}: {_value(_metric(targets[label], COMPLIANCE))}" for label in baselines)
        lines.append(f"compliance with substance went from {_value(_metric(a, COMPLIANCE))} to "
                     f"{_value(_metric(b, COMPLIANCE))} (compliance judge, mean score{quoted})")
    else:
        lines.append("compliance with substance: not judged (add --judges.terms '{compliance: {}}')")
    diversity = b.get("diversity")
    if diversity is not None and "degenerate_share" in diversity:
        recurring = list(diversity["recurring_phrases"].items())[:3]
        phrases = ", ".join(f"'{phrase}' in {share:.0%} of requests" for phrase, share in recurring)
        lines.append(f"degenerate answers of {after}: {diversity['degenerate_share']:.0%}"
                     + (f" (recurring: {phrases})" if phrases else ""))
    else:
        lines.append(f"degenerate answers of {after}: not measured (the diversity suite did not run)")
    return lines


def readings(result: dict[str, Any]) -> list[str]:
    """The reading of every checkpoint against the first target, when the harm suite ran; else no lines. Baselines
    (eval.baselines) are quoted, not read."""
    targets, baselines = result["targets"], result.get("baselines", [])
    labels = [label for label in targets if label not in baselines]
    if len(labels) < 2 or "harm" not in targets[labels[0]]:
        return []
    return [line for label in labels[1:] for line in (f"reading of {label}:", *(
        f"  {text}" for text in reading(targets, labels[0], label, baselines)))]
