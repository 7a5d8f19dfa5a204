"""The evaluation suites of `purplerl eval`, each a function of one target's generations.

- harm: every harm judge scores each (prompt, completion) sample; metrics.summarize turns the scores into
  rates with 95% bootstrap CIs, overall and per prompt category.
- utility: greedy exact-match accuracy on a math set (purplerl.eval.utility), with a bootstrap CI, and
  (choice_suite) multiple-choice accuracy by option log-likelihood (purplerl.eval.choice) as `choice_accuracy`, and
  (math_suite) chain-of-thought exact match of boxed answers on MATH-style problems (purplerl.eval.math_problems)
  as `math_exact_match`.
- diversity: purplerl.eval.diversity over all completions of the target.

A sample row is a dict {"uid", "prompt_index", "sample", "category", "prompt", "completion"}; judging adds
one key per judge ("toxicity", "refused", "harm", "guard_unsafe", "strongreject"), the keys
metrics.summarize reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from purplerl.config.evaluation import SUITE_NAMES
from purplerl.errors import ExperimentError, UserError
from purplerl.eval.metrics import TERM_PREFIX
from purplerl.runs import process_reward as _process_reward  # noqa: F401 -- registers the prm term
from purplerl.runs import reward_model as _reward_model  # noqa: F401 -- registers the reward_model term
from purplerl.types import PromptRecord

if TYPE_CHECKING:
    from purplerl.config import JudgesConfig, Template, UtilityConfig

SUITES = SUITE_NAMES  # the names `eval.suites` takes (purplerl.config); each run by eval.run.SUITE_RUNS

# Generates one completion per prompt for the utility suite: (records, max_new_tokens) -> texts, greedy.
GreedyGenerate = Callable[[list[PromptRecord], int], list[str]]


def check_judge_term(name: str) -> None:
    """UserError unless `name` is a registered term that judges from the answer's text (and its prompt) alone."""
    from purplerl.rewards.registry import get_term, text_terms

    get_term(name)  # an unknown name: the known terms, in one line
    if name not in text_terms():
        raise UserError(f"judges.terms: '{name}' reads more than the answer's text (needs "
                        f"{get_term(name).needs}), so it cannot judge saved answers; text terms: "
                        f"{', '.join(text_terms())}")


class HarmJudges:
    """The judges of the harm suite: embedded toxicity, refusal keywords, and the optional model judges.

    Optional: an HF harm classifier ("harm", 0/1), a Llama-Guard-style causal judge ("guard_unsafe",
    P(unsafe)) and the StrongREJECT rubric through an OpenAI-compatible endpoint ("strongreject").
    "harm" is the classifier's verdict when a classifier is given; with only a guard judge it is the guard's
    verdict, 1.0 when P(unsafe) >= harm_threshold, so harmful score and attack success rate are reported
    from the guard. Built once per eval (the model loads are the slow part) and applied to every target's rows.
    """

    def __init__(self, judges: JudgesConfig, device: str = "cpu") -> None:
        from purplerl.rewards.registry import get_term, term_params

        def judge(term: str, params: dict[str, Any] | None = None) -> Any:
            scorer = get_term(term).scorer  # the judge a reward term of the same name scores with
            assert scorer is not None  # a "text" term
            return scorer(term_params(term, params))

        self.harm_threshold = judges.harm_threshold
        self.judges: dict[str, Any] = {"toxicity": judge("toxicity"), "refused": judge("refusal")}
        if judges.harm_model is not None and judges.harm_label is not None:
            self.judges["harm"] = judge("harm_classifier", {
                "model": judges.harm_model, "label": judges.harm_label, "threshold": judges.harm_threshold,
                "device": device})
        if judges.strongreject_url is not None and judges.strongreject_model is not None:
            self.judges["strongreject"] = judge("strongreject", {
                "url": judges.strongreject_url, "model": judges.strongreject_model,
                "key_env": judges.strongreject_key_env})
        if judges.guard_model is not None:
            self.judges["guard_unsafe"] = judge("guard", {
                "model": judges.guard_model, "unsafe_token": judges.guard_unsafe_token, "device": device})
        for name, params in judges.terms.items():  # any registered text term, reported as term/NAME
            check_judge_term(name)
            self.judges[f"{TERM_PREFIX}{name}"] = judge(name, params)

    def describe(self) -> dict[str, str]:
        return {key: type(judge).__name__ for key, judge in self.judges.items()}

    def score(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows with one score per judge added (new dicts; the inputs are left alone)."""
        texts, prompts = [row["completion"] for row in rows], [row["prompt"] for row in rows]
        scored = [dict(row) for row in rows]
        for key, judge in self.judges.items():
            scores = judge.score(texts, prompts)
            if len(scores) != len(rows):
                raise ExperimentError(f"judge {key} returned {len(scores)} scores for {len(rows)} samples")
            for row, value in zip(scored, scores, strict=True):
                row[key] = float(value)
        if "guard_unsafe" in self.judges and "harm" not in self.judges:
            for row in scored:  # only a guard judge: its verdict is the harm verdict
                row["harm"] = 1.0 if row["guard_unsafe"] >= self.harm_threshold else 0.0
        return scored


def harm_suite(scored_rows: Sequence[dict[str, Any]], harm_threshold: float = 0.5,
               seed: int = 0) -> dict[str, Any]:
    """metrics.summarize over the judged rows: {"n", "metrics", "by_category"}."""
    from purplerl.eval.metrics import summarize

    return summarize(scored_rows, harm_threshold=harm_threshold, seed=seed)


def utility_suite(generate: GreedyGenerate, utility: UtilityConfig, template: Template, seed: int) -> dict[str, Any]:
    """Exact-match accuracy (as a fraction, with a 95% bootstrap CI) of greedy answers on a math set, the
    prompts worded for the model's `template`."""
    from purplerl.eval.metrics import bootstrap_ci
    from purplerl.eval.utility import load_utility_set, score_utility, utility_prompts

    items = load_utility_set(utility.source, limit=utility.limit)
    completions = generate(utility_prompts(items, template), utility.max_new_tokens)
    scored = score_utility(completions, items)
    point, low, high = bootstrap_ci([1.0 if ok else 0.0 for ok in scored["correct"]], seed=seed)
    return {"source": utility.source, "n": scored["n"],
            "metrics": {"exact_match": {"point": point, "low": low, "high": high}},
            "items": [{"uid": item["uid"], "answer": item["answer"], "predicted": pred, "correct": ok}
                      for item, pred, ok in zip(items, scored["predicted"], scored["correct"], strict=True)]}


def choice_suite(engine: Any, source: str, limit: int | None, template: Template, seed: int,
                 batch_size: int) -> dict[str, Any]:
    """Multiple-choice accuracy by option log-likelihood (purplerl.eval.choice, mean logprob per answer
    token), with a 95% bootstrap CI: `choice_accuracy` beside the utility suite's exact match."""
    from purplerl.eval.choice import load_choice_set, score_choices
    from purplerl.eval.metrics import bootstrap_ci

    choice = score_choices(engine, load_choice_set(source, limit=limit), template, batch_size=batch_size)
    point, low, high = bootstrap_ci([1.0 if row["correct"] else 0.0 for row in choice["items"]], seed=seed)
    return {"metrics": {"choice_accuracy": {"point": point, "low": low, "high": high}},
            "choice": {"source": source, **choice}}


def math_suite(generate: GreedyGenerate, source: str, limit: int | None, max_new_tokens: int, template: Template,
               seed: int) -> dict[str, Any]:
    """Exact match of the last boxed answer of greedy chain-of-thought solutions (purplerl.eval.math_problems),
    with a 95% bootstrap CI: `math_exact_match` beside the utility suite's exact match."""
    from purplerl.eval.math_problems import load_math_set, math_prompts, score_math
    from purplerl.eval.metrics import bootstrap_ci

    items = load_math_set(source, limit=limit)
    scored = score_math(generate(math_prompts(items, template), max_new_tokens), items)
    point, low, high = bootstrap_ci([1.0 if row["correct"] else 0.0 for row in scored["items"]], seed=seed)
    return {"metrics": {"math_exact_match": {"point": point, "low": low, "high": high}},
            "math": {"source": source, **scored}}


def diversity_suite(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Diversity and degeneracy of all the target's completions (purplerl.eval.diversity.diversity), and which
    answers are degenerate (purplerl.rewards.degenerate: empty, self-repeating, or holding a phrase recurring across
    answers; a refusal, where the rows are judged for it, is none): `degenerate_share` and the recurring phrases."""
    from purplerl.eval.diversity import diversity
    from purplerl.rewards.degenerate import degenerate_answers

    texts = [row["completion"] for row in rows]
    refused = [float(row["refused"]) >= 0.5 for row in rows] if rows and "refused" in rows[0] else None
    found = degenerate_answers(texts, [row.get("prompt", "") for row in rows], refused)
    return {**diversity(texts), "degenerate_share": found["share"], "recurring_phrases": found["recurring"]}


def table(targets: dict[str, dict[str, Any]]) -> str:
    """A compact text table: one line per target and metric, 'point [low, high]' (diversity: value only)."""
    lines = [f"{'target':24} {'metric':22} {'value':>26}"]
    for label, suites in targets.items():
        for suite, result in suites.items():
            if suite == "diversity":
                for key in ("unique_fraction", "mean_jaccard", "distinct_2", "self_bleu", "degenerate",
                            "degenerate_share"):
                    value = result[key]
                    text = str(value) if isinstance(value, bool) else f"{value:.3f}"
                    lines.append(f"{label[:24]:24} {key:22} {text:>26}")
                continue
            for name, ci in result["metrics"].items():
                text = f"{ci['point']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}]"
                lines.append(f"{label[:24]:24} {name:22} {text:>26}")
    return "\n".join(lines)
