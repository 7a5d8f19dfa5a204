"""purplerl's rewards behind veRL's custom-reward hook: `compute_score(data_source, solution_str, ground_truth,
extra_info)` returns {"score": total, <term>: value, ...} (veRL logs the extra keys as reward_extra_info).

The export writes the reward as JSON settings beside a three-line module (`write_reward_module`), so the
module describes itself and imports purplerl (installed on the cluster) instead of copying it:

    {"recipe": "attack", "terms": [{"name": "toxicity", "weight": 1.0, "settings": {...}}, ...]}

total = sum of weight x score over the terms. A term names a text reward of `TEXT_REWARDS` (a scorer of the
response, given the prompt); a reward that needs per-token entropies or log-probs (`TOKEN_REWARDS`) is
refused, because veRL 0.9 hands the reward function the decoded response, not the policy's distributions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.base import Scorer, checked_values

SETTINGS_FILE = "purplerl_reward.json"
TOTAL_KEY = "score"  # the key veRL's reward managers read the reward from


def _toxicity(settings: dict[str, Any]) -> Scorer:
    from purplerl.config import ToxicityConfig
    from purplerl.rewards import make_toxicity_scorer

    return make_toxicity_scorer(ToxicityConfig.model_validate(settings))


def _repetition(settings: dict[str, Any]) -> Scorer:
    from purplerl.rewards import RepetitionScorer

    return RepetitionScorer(int(settings["ngram"]))


def _refusal(settings: dict[str, Any]) -> Scorer:
    from purplerl.rewards.refusal import RefusalJudge

    return RefusalJudge()


# name -> builder of its scorer from the term's settings: every reward a response's text determines
TEXT_REWARDS: dict[str, Callable[[dict[str, Any]], Scorer]] = {
    "toxicity": _toxicity, "repetition": _repetition, "refusal": _refusal}
# rewards of the policy's per-token distributions, which veRL's reward hook never sees
TOKEN_REWARDS = {"response_entropy": "the defense's -mean token entropy",
                 "entropy_bonus": "the adaptive attack's entropy bonus"}


@dataclass(frozen=True)
class Term:
    name: str
    weight: float
    scorer: Scorer


def check_term(name: str) -> None:
    """UserError unless `name` is a reward the veRL hook can compute."""
    if name in TOKEN_REWARDS:
        raise UserError(f"reward term '{name}' ({TOKEN_REWARDS[name]}) needs the policy's per-token entropies, "
                        "which veRL's reward function does not receive")
    if name not in TEXT_REWARDS:
        raise UserError(f"unknown reward term '{name}' (text rewards: {', '.join(TEXT_REWARDS)})")


def load_terms(path: Path) -> list[Term]:
    """The weighted scorers described by a settings file written by `purplerl verl export`."""
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read reward settings {path}: {err}") from None
    terms = []
    for term in spec.get("terms", []):
        check_term(term["name"])
        terms.append(Term(term["name"], float(term["weight"]), TEXT_REWARDS[term["name"]](term.get("settings", {}))))
    if not terms:
        raise UserError(f"reward settings {path} name no reward terms")
    return terms


def score_response(terms: list[Term], text: str, prompt: str | None) -> dict[str, float]:
    """{"score": weighted total, <term>: unweighted score} of one response."""
    prompts = None if prompt is None else [prompt]
    scores = {term.name: checked_values(term.scorer, [text], prompts)[0] for term in terms}
    return {TOTAL_KEY: sum(term.weight * scores[term.name] for term in terms), **scores}


class ComputeScore:
    """veRL's `compute_score`, its scorers built on the first call (in each reward worker, not at import)."""

    def __init__(self, settings: Path) -> None:
        self.settings = Path(settings)
        self._terms: list[Term] | None = None
        # veRL calls a synchronous reward function from a thread pool; scorers (sklearn, torch) are not
        # promised to be thread-safe, and building one twice would load the model twice
        self._lock = threading.Lock()

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any = None,
                 extra_info: dict[str, Any] | None = None, **_: Any) -> dict[str, float]:
        if not isinstance(solution_str, str):
            raise ExperimentError(f"veRL passed a {type(solution_str).__name__} response, expected text")
        question = (extra_info or {}).get("question")
        with self._lock:
            if self._terms is None:
                self._terms = load_terms(self.settings)
            return score_response(self._terms, solution_str, question if isinstance(question, str) else None)


def write_reward_module(out_dir: Path, module_name: str, spec: dict[str, Any]) -> Path:
    """Write `spec` as SETTINGS_FILE and the module veRL imports through custom_reward_function.path."""
    for term in spec["terms"]:
        check_term(term["name"])
    (out_dir / SETTINGS_FILE).write_text(json.dumps(spec, indent=1) + "\n")
    module = out_dir / module_name
    module.write_text(
        '"""purplerl\'s reward for veRL, written by `purplerl verl export`; its terms are in '
        f'{SETTINGS_FILE} beside it."""\n\n'
        "from pathlib import Path\n\n"
        "from purplerl.verl.reward import SETTINGS_FILE, ComputeScore\n\n"
        "compute_score = ComputeScore(Path(__file__).with_name(SETTINGS_FILE))\n")
    return module
