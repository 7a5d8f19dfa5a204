"""purplerl's rewards behind veRL's custom-reward hook: `compute_score(data_source, solution_str, ground_truth,
extra_info)` returns {"score": total, <term>: value, ...} (veRL logs the extra keys as reward_extra_info).

The export writes the reward as JSON settings beside a three-line module (`write_reward_module`), so the
module describes itself and imports purplerl (installed on the cluster) instead of copying it:

    {"recipe": "attack", "terms": [{"name": "toxicity", "weight": 1.0, "settings": {...}}, ...]}

A term's "name" is how it is logged; "fn" (default: the name) is the registered term it computes, so named uses
(sentence_length_5 and sentence_length_10, both fn sentence_length) work as in training, and "hack_at" makes it a
reward-hacking detector: the result then holds "is_rh" (1.0 where any detector's value >= its hack_at, else 0.0).

total = sum of weight x score over the terms, composed by the Reward every training run uses. A term is any
registered reward term that reads only the response text (and its prompt: extra_info["question"]), or the
response and the row's ground truth (the `ground_truth` term: veRL's reward_model.ground_truth, the hook's
`ground_truth` argument), built through the registry exactly as a training run builds it. A term that reads the
policy's per-token entropies is refused, because veRL 0.9 hands the reward function the decoded response, not the
policy's distributions, and the KL term is veRL's own (algorithm.use_kl_in_reward / actor.use_kl_loss).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.compose import Reward
from purplerl.rewards.registry import ScoringInput, get_term
from purplerl.runs import process_reward as _process_reward  # noqa: F401 -- registers the prm term
from purplerl.runs import reward_model as _reward_model  # noqa: F401 -- registers the reward_model term

SETTINGS_FILE = "purplerl_reward.json"
TOTAL_KEY = "score"  # the key veRL's reward managers read the reward from
RH_KEY = "is_rh"  # 1.0 where a detector labels the response a reward hack (logged by veRL as reward_extra_info)
# why veRL's reward hook cannot compute a term of each kind that reads more than the text
NOT_IN_VERL = {"tokens": "needs the policy's per-token entropies, which veRL's reward function does not receive",
               "kl": "is applied by veRL itself (algorithm.use_kl_in_reward or actor_rollout_ref.actor.use_kl_loss), "
                     "not by the reward function"}


def check_term(name: str) -> None:
    """UserError unless `name` is a registered reward term the veRL hook can compute (a "text" or "ground_truth"
    term)."""
    term = get_term(name)  # an unknown name is a UserError listing the registered terms
    if term.needs not in ("text", "ground_truth"):
        raise UserError(f"reward term '{name}' ({term.description}) {NOT_IN_VERL[term.needs]}")


def load_terms(path: Path) -> Reward:
    """The reward described by a settings file written by `purplerl verl export`: the one composition a training
    run uses (purplerl.rewards.compose.Reward), each term built through the reward-term registry."""
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read reward settings {path}: {err}") from None
    terms: dict[str, dict[str, Any]] = {}
    for term in spec.get("terms", []):
        fn = term.get("fn", term["name"])
        check_term(fn)
        terms[term["name"]] = {"fn": fn, "weight": term["weight"], "params": term.get("settings") or {},
                               "hack_at": term.get("hack_at")}
    if not terms:
        raise UserError(f"reward settings {path} name no reward terms")
    return Reward(terms)


def score_response(reward: Reward, text: str, prompt: str | None, ground_truth: Any = None) -> dict[str, float]:
    """{"score": weighted total, <term>: unweighted score, "is_rh": 0/1 when a term is a detector} of one
    response. veRL's rows without a reference answer carry "" (purplerl's export writes that): a ground_truth term
    refuses them."""
    truth = None if ground_truth is None or ground_truth == "" else str(ground_truth)
    batch = ScoringInput(texts=[text], prompts=None if prompt is None else [prompt], ground_truths=[truth])
    out = reward(batch)
    scores = {name: float(out.components[name][0]) for name in reward.terms}
    result = {TOTAL_KEY: float(out.total_N[0]), **scores}
    if out.is_rh_N is not None:
        result[RH_KEY] = float(out.is_rh_N[0])
    return result


class ComputeScore:
    """veRL's `compute_score`, its scorers built on the first call (in each reward worker, not at import)."""

    def __init__(self, settings: Path) -> None:
        self.settings = Path(settings)
        self._terms: Reward | None = None
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
            return score_response(self._terms, solution_str, question if isinstance(question, str) else None,
                                  ground_truth)


def write_reward_module(out_dir: Path, module_name: str, spec: dict[str, Any]) -> Path:
    """Write `spec` as SETTINGS_FILE and the module veRL imports through custom_reward_function.path."""
    for term in spec["terms"]:
        check_term(term.get("fn", term["name"]))
    (out_dir / SETTINGS_FILE).write_text(json.dumps(spec, indent=1) + "\n")
    module = out_dir / module_name
    module.write_text(
        '"""purplerl\'s reward for veRL, written by `purplerl verl export`; its terms are in '
        f'{SETTINGS_FILE} beside it."""\n\n'
        "from pathlib import Path\n\n"
        "from purplerl.verl.reward import SETTINGS_FILE, ComputeScore\n\n"
        "compute_score = ComputeScore(Path(__file__).with_name(SETTINGS_FILE))\n")
    return module
