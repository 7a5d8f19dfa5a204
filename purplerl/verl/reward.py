"""purplerl's rewards behind veRL's custom-reward hook: `compute_score(data_source, solution_str, ground_truth,
extra_info)` returns {"score": total, <term>: value, ...} (veRL logs the extra keys as reward_extra_info).

The export writes the reward as JSON settings beside a three-line module (`write_reward_module`), so the
module describes itself and imports purplerl (installed on the cluster) instead of copying it:

    {"recipe": "attack", "terms": [{"name": "toxicity", "weight": 1.0, "settings": {...}}, ...]}

total = sum of weight x score over the terms. A term is any registered reward term that reads only the response
text (and its prompt), built through the registry exactly as a training run builds it; a term that reads the
policy's per-token entropies is refused, because veRL 0.9 hands the reward function the decoded response, not the
policy's distributions, and the KL term is veRL's own (algorithm.use_kl_in_reward / actor.use_kl_loss).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.base import Scorer, checked_values
from purplerl.rewards.registry import get_term, term_params
from purplerl.runs import reward_model as _reward_model  # noqa: F401 -- registers the reward_model term

SETTINGS_FILE = "purplerl_reward.json"
TOTAL_KEY = "score"  # the key veRL's reward managers read the reward from
# why veRL's reward hook cannot compute a term of each kind that reads more than the text
NOT_IN_VERL = {"tokens": "needs the policy's per-token entropies, which veRL's reward function does not receive",
               "kl": "is applied by veRL itself (algorithm.use_kl_in_reward or actor_rollout_ref.actor.use_kl_loss), "
                     "not by the reward function"}


@dataclass(frozen=True)
class Term:
    name: str
    weight: float
    scorer: Scorer


def check_term(name: str) -> None:
    """UserError unless `name` is a registered reward term the veRL hook can compute (a "text" term)."""
    term = get_term(name)  # an unknown name is a UserError listing the registered terms
    if term.needs != "text":
        raise UserError(f"reward term '{name}' ({term.description}) {NOT_IN_VERL[term.needs]}")


def load_terms(path: Path) -> list[Term]:
    """The weighted scorers described by a settings file written by `purplerl verl export`, each built through
    the reward-term registry."""
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read reward settings {path}: {err}") from None
    terms = []
    for term in spec.get("terms", []):
        name = term["name"]
        check_term(name)
        scorer = get_term(name).scorer
        assert scorer is not None  # every "text" term has one
        terms.append(Term(name, float(term["weight"]), scorer(term_params(name, term.get("settings")))))
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
