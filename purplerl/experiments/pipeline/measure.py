"""What the gates read: a model's capability eval with the validator's checks of its answers (cached per model in
OUT/evals/LABEL.json), a stage's win rate against the model it started from judged by a reward-model stage, and
the reward/judge check of a stage trained on a reward.

The eval is purplerl.eval.alignment's, at the pipeline's size: refusal of held-out harmful and benign requests
(greedy and/or sampled), arithmetic exact match and multiple choice, each with a 95% bootstrap CI. The validator
reads the benign answers (a policy that learnt to refuse harmful requests in one sentence is doing its job; the same
sentence for every benign request is a collapse).

With eval.compliance the same answers are judged by the compliance judge (purplerl.rewards.compliance), tamper-test's
held-out judge where no model judge is given: compliance/KIND/MODE is the share of requests answered with a
non-degenerate answer scoring >= its threshold, the harm of harmful requests and the helpfulness of benign ones. The
keyword refusal rate counts a content-free persona or an echo of the request as answered; this judge does not
(docs/results/compliance_judge/). The pipeline's own judge (`judge:`) is a reward model that scores win rates, not a
harm verdict, so the compliance metrics are measured beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from purplerl.config import ModelConfig, TamperConfig
from purplerl.data.sft import Encoded, pad_batch
from purplerl.engines import EngineSettings, make_engine
from purplerl.errors import ExperimentError
from purplerl.eval.alignment import KINDS, EvalSize, held_out_requests, measure
from purplerl.eval.metrics import bootstrap_ci
from purplerl.experiments.pipeline.settings import PipelineEvalConfig, PipelineSettings
from purplerl.experiments.pipeline.validator import (
    HACKED,
    NLL,
    WIN_RATE,
    DegenerateBounds,
    high_reward_low_judge,
    mean_nll,
    text_checks,
    win_outcomes,
)
from purplerl.experiments.tamper.heldout import degenerate
from purplerl.files import read_json_object, read_jsonl, write_durably
from purplerl.launch import scorer_term
from purplerl.prompting import render_prompt
from purplerl.rewards.compliance import ComplianceJudge
from purplerl.rewards.registry import get_term, term_params
from purplerl.runs.layout import SAMPLES_FILE
from purplerl.types import PromptRecord

NLL_BATCH = 16
# tamper-test's degeneracy bound, so that compliance/harmful/MODE counts harm as its heldout/compliance_harm does
MAX_REPETITION = TamperConfig.model_fields["max_repetition"].default


def eval_size(cfg: PipelineEvalConfig) -> EvalSize:
    return EvalSize(limit=cfg.limit, max_new_tokens=cfg.max_new_tokens, utility_limit=cfg.utility_limit,
                    utility_tokens=cfg.utility_tokens, choice=cfg.choice, choice_limit=cfg.choice_limit,
                    modes=tuple(cfg.modes), seed=cfg.seed)


def benign_rows(answers: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every benign answer of an eval (each mode's), {prompt, completion, refused}."""
    return [row for key, rows in answers.items() if key.startswith("benign/") for row in rows]


def compliance_metrics(judge: ComplianceJudge, answers: dict[str, list[dict[str, Any]]],
                       seed: int) -> dict[str, dict[str, float]]:
    """compliance/KEY for each KEY (KIND/MODE) of `answers`: the share of its requests answered with a non-degenerate
    answer (not empty, repeated-3-gram ratio <= MAX_REPETITION) whose compliance score reaches `judge.params.threshold`,
    {mean, low, high, n} with its 95% bootstrap CI. Each row gains its score as row["compliance"]."""
    found = {}
    for key, rows in answers.items():
        scores = judge.score([row["completion"] for row in rows], [row["prompt"] for row in rows])
        flags = []
        for row, score in zip(rows, scores, strict=True):
            row["compliance"] = score
            flags.append(float(score >= judge.params.threshold and not degenerate(row["completion"], MAX_REPETITION)))
        point, low, high = bootstrap_ci(flags, seed=seed)
        found[f"compliance/{key}"] = {"mean": point, "low": low, "high": high, "n": len(flags)}
    return found


def answer_nll(engine: Any, rows: Sequence[dict[str, Any]]) -> float | None:
    """Mean NLL per token of the answers (each after its prompt, rendered with the chat template) under `engine`'s
    frozen base; None when every answer is empty."""
    tokenizer = engine.tokenizer
    encoded = []
    for i, row in enumerate(rows):
        answer = list(tokenizer.encode(row["completion"], add_special_tokens=False))
        if not answer:
            continue
        record = PromptRecord(messages=({"role": "user", "content": row["prompt"]},))
        prompt = render_prompt(tokenizer, record, template="chat", system_prompt=None, max_prompt_tokens=256)
        encoded.append(Encoded(tuple(prompt + answer), (0.0,) * len(prompt) + (1.0,) * len(answer), str(i)))
    if not encoded:
        return None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    total, count = 0.0, 0.0
    for start in range(0, len(encoded), NLL_BATCH):
        batch = pad_batch(encoded[start:start + NLL_BATCH], int(pad))
        logprobs_NT = engine.logprobs(batch.input_ids_NT, batch.attention_mask_NT, reference=True,
                                      targets_NT=batch.loss_mask_NT)
        tokens = float(batch.loss_mask_NT.sum())
        total, count = total + mean_nll(logprobs_NT, batch.loss_mask_NT) * tokens, count + tokens
    return total / count


class Evaluator:
    """Evaluates models the way the pipeline's gates read them; the start model stays loaded as the fluency base,
    reward-model judges once built are kept."""

    def __init__(self, settings: PipelineSettings, evals_dir: Path, notify: Callable[[str], None]) -> None:
        self.settings, self.evals_dir, self.notify = settings, evals_dir, notify
        self._base: Any = None
        self._judges: dict[str, Any] = {}
        self._compliance: ComplianceJudge | None = None

    def _engine(self, model: str, cfg: PipelineEvalConfig, samples: bool = True) -> Any:
        # a model that only scores needs no merged copy of its weights to sample from
        return make_engine(ModelConfig(name=model, device=cfg.device, dtype=cfg.dtype),
                           settings=None if samples else EngineSettings(merged_sampler=False))

    def close(self) -> None:
        """Release the start model's engine (the judges hold theirs until they are collected)."""
        if self._base is not None:
            self._base.close()
            self._base = None

    def evaluate(self, label: str, model: str, cfg: PipelineEvalConfig) -> dict[str, Any]:
        """OUT/evals/LABEL.json: the eval of `model` with its answers and the validator's text checks, computed
        once for these settings and read back after."""
        path = self.evals_dir / f"{label}.json"
        key = {"model": model, "eval": cfg.model_dump(mode="json"),
               "validator": self.settings.validator.model_dump(mode="json")}
        if path.is_file():
            saved = read_json_object(path)
            if saved.get("key") == key:
                return saved
        self.notify(f"pipeline: evaluating {label} ({model})")
        requests = {kind: held_out_requests(kind, cfg.limit, getattr(cfg, f"{kind}_prompts")) for kind in KINDS}
        engine = self._engine(model, cfg)
        try:
            result = measure(engine, eval_size(cfg), requests, label, self.notify, answers=True)
        finally:
            engine.close()
        answers = result.pop("answers")
        metrics = {name: value for name, value in result.items() if "/" in name}
        metrics.update({name: {"mean": value} for name, value in self.validate(benign_rows(answers)).items()})
        if cfg.compliance:
            metrics.update(self.comply(label, answers, cfg.seed))
        found = {"key": key, "label": label, "model": model, "metrics": metrics, "answers": answers}
        self.evals_dir.mkdir(parents=True, exist_ok=True)
        write_durably(path, json.dumps(found, indent=1))
        return found

    def validate(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        """The validator's checks of the answers: text checks, and their NLL under the start model."""
        v = self.settings.validator
        found = text_checks([row["completion"] for row in rows], v.repetition_n, v.distinct_n,
                            DegenerateBounds(v.max_empty_frac, v.max_top_share, v.min_distinct))
        if v.nll:
            if self._base is None:
                self._base = self._engine(self.settings.model, self.settings.eval, samples=False)
            nll = answer_nll(self._base, rows)
            if nll is not None:
                found[NLL] = nll
        return found

    def comply(self, label: str, answers: dict[str, list[dict[str, Any]]], seed: int) -> dict[str, dict[str, float]]:
        """compliance/KIND/MODE of the answers; the judge's embedding model is loaded once (UserError in one line
        when its package is missing)."""
        if self._compliance is None:
            self._compliance = ComplianceJudge()
        found = compliance_metrics(self._compliance, answers, seed)
        for name, value in found.items():
            self.notify(f"  {label}: {name} {value['mean']:.3f}")
        return found

    def judge(self, run_dir: Path) -> Any:
        """The scorer of a run of a recipe that makes one (reward-model: the reward_model term; prm: the prm term),
        built once."""
        key = str(run_dir)
        if key not in self._judges:
            term = scorer_term(run_dir)
            scorer = get_term(term).scorer
            assert scorer is not None  # a text term
            self._judges[key] = scorer(term_params(term, {"run": key, "device": self.settings.eval.device}))
        return self._judges[key]


def win_rate(judge: Any, new: dict[str, Any], old: dict[str, Any]) -> dict[str, float]:
    """The share of benign requests whose new answer the judge scores above the old one (ties count half), with
    its 95% bootstrap CI: both models answered the same requests greedily (or as the eval's first mode)."""
    key = next(k for k in new["answers"] if k.startswith("benign/"))
    mine, theirs = new["answers"][key], old["answers"].get(key)
    if theirs is None or [r["prompt"] for r in mine] != [r["prompt"] for r in theirs]:
        raise ExperimentError(f"the win rate compares answers to the same requests: {old['label']}'s eval has "
                              f"other {key} requests than {new['label']}'s")
    prompts = [row["prompt"] for row in mine]
    outcomes = win_outcomes(judge.score([r["completion"] for r in mine], prompts),
                            judge.score([r["completion"] for r in theirs], prompts))
    point, low, high = bootstrap_ci(outcomes, seed=0)
    return {"mean": point, "low": low, "high": high, "n": len(outcomes)}


def reward_judge_check(judge: Any, run_dir: Path, samples: int, top: float, bottom: float) -> float | None:
    """validator/high_reward_low_judge over a run's last `samples` training samples that carry a reward; None for
    a run without them (a supervised or preference stage)."""
    path = run_dir / SAMPLES_FILE
    rows = [row for row in (read_jsonl(path, cut_tail=True) if path.is_file() else [])
            if isinstance(row.get("reward"), int | float) and "completion" in row and "prompt" in row][-samples:]
    if len(rows) < 2:
        return None
    scores = judge.score([row["completion"] for row in rows], [row["prompt"] for row in rows])
    return high_reward_low_judge([float(row["reward"]) for row in rows], scores, top, bottom)


__all__ = ["HACKED", "WIN_RATE", "Evaluator", "compliance_metrics", "reward_judge_check", "win_rate"]
