"""Reasoning utility: MATH-style problems solved with chain of thought, scored by exact match of the last
`\\boxed{}` answer after the MATH normalisation (purplerl.eval.math_answers).

The arithmetic set checks a final number; this task checks multi-step reasoning whose answer may be a
fraction, a root or an expression, the way MATH (Hendrycks et al. 2021) and its 500-problem subset
MATH-500 (Lightman et al. 2023, "Let's Verify Step by Step") are scored. Items are plain dicts
`{"uid", "question", "answer", "subject", "level", "source"}`. Sources:

- 'builtin:math': short problems written for this project, grade-school arithmetic to early algebra, in
  MATH-500's fields, small enough for the embedded model on a laptop;
- a .jsonl/.parquet file, or a directory holding `<split>.parquet` / `<split>.jsonl`, in MATH-500's fields
  (`problem`, `solution`, `answer`, `subject`, `level`, `unique_id`); a row without `answer` is scored
  against the last boxed answer of its `solution`, and its `type` is its subject, as in the original MATH files;
- 'hf:ORG/NAME' or 'hf:ORG/NAME:CONFIG', e.g. 'hf:HuggingFaceH4/MATH-500' (split test).

A completion without a closed `\\boxed{}` has no answer and is wrong: the prompt asks for the box.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from purplerl.config.base import Template
from purplerl.errors import ExperimentError, UserError
from purplerl.eval.math_answers import answers_match, last_boxed, normalize_answer
from purplerl.eval.utility import checked_items, read_eval_rows, read_hf_rows
from purplerl.types import PromptRecord

BUILTIN_SETS = ("math",)
# The chain-of-thought instruction of the MATH evaluations of open reasoning models (Qwen2.5-Math, DeepSeek).
MATH_COT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def load_math_set(source: str = "builtin:math", limit: int | None = None,
                  split: str = "test") -> list[dict[str, Any]]:
    """The problems of `source` (see the module doc), the first `limit` in source order."""
    if limit is not None and limit < 1:
        raise UserError(f"math set limit must be >= 1, got {limit}")
    rows, where, name = _read_rows(source, split)
    items = [_to_item(row, i, f"{where} row {i}", name) for i, row in enumerate(rows)]
    return checked_items(items, where, kind="math", limit=limit)


def math_prompt(problem: str, template: Template = "chat") -> str:
    """The user turn: the problem, then the chain-of-thought instruction (chat); a 'Problem: ... Solution:'
    text that a base model continues, the box asked for in it (base)."""
    if template == "base":
        return f"Problem: {problem}\nSolve it step by step and write the final answer as \\boxed{{answer}}.\nSolution:"
    return f"{problem}\n\n{MATH_COT_INSTRUCTION}"


def math_prompts(items: Sequence[dict[str, Any]], template: Template = "chat") -> list[PromptRecord]:
    """One single-message prompt per item."""
    return [PromptRecord(messages=({"role": "user", "content": math_prompt(item["question"], template)},),
                         category="utility", source=item["source"], uid=item["uid"]) for item in items]


def score_math(completions: Sequence[str], items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Exact match of each completion's last boxed answer against its item's answer, after normalisation.

    Returns accuracy (fraction correct), n, `by_subject` ({subject: {"n", "accuracy"}}) and per item its uid,
    subject, level, reference `answer`, `predicted` (the boxed text, None without a closed box), `correct`
    and the completion, so a report can show where the reasoning went wrong.
    """
    if len(completions) != len(items):
        raise ExperimentError(f"{len(completions)} completions for {len(items)} math items")
    if not items:
        raise ExperimentError("no math items to score")
    rows = []
    for text, item in zip(completions, items, strict=True):
        predicted = last_boxed(text)
        rows.append({"uid": item["uid"], "subject": item["subject"], "level": item["level"],
                     "answer": item["answer"], "predicted": predicted,
                     "correct": answers_match(predicted, item["answer"]), "completion": text})
    by_subject: dict[str, dict[str, Any]] = {}
    for subject in dict.fromkeys(str(row["subject"]) for row in rows):
        correct = [row["correct"] for row in rows if str(row["subject"]) == subject]
        by_subject[subject] = {"n": len(correct), "accuracy": sum(correct) / len(correct)}
    return {"n": len(rows), "accuracy": sum(row["correct"] for row in rows) / len(rows),
            "by_subject": by_subject, "items": rows}


def _read_rows(source: str, split: str) -> tuple[list[dict[str, Any]], str, str]:
    if source.startswith("hf:"):
        return read_hf_rows(source.removeprefix("hf:"), split), source, source.removeprefix("hf:")
    return read_eval_rows(source, split, kind="math", builtin_sets=BUILTIN_SETS,
                          usage="'builtin:math', a .jsonl/.parquet file or directory in MATH-500's fields "
                                "(problem, answer...) or 'hf:ORG/NAME[:CONFIG]'")


def _to_item(row: dict[str, Any], index: int, where: str, name: str) -> dict[str, Any]:
    problem, answer, solution = row.get("problem"), row.get("answer"), row.get("solution")
    if not isinstance(problem, str) or not problem.strip():
        raise UserError(f"{where}: no problem text (fields: {', '.join(row)})")
    if answer is None and isinstance(solution, str):
        answer = last_boxed(solution)  # the original MATH layout: the answer is the solution's last box
        if answer is None:
            raise UserError(f"{where}: no answer field and its solution has no closed \\boxed{{}}")
    if not isinstance(answer, str | int | float) or isinstance(answer, bool):
        raise UserError(f"{where}: answer should be a string or a number, got {type(answer).__name__}")
    if not normalize_answer(str(answer)):
        raise UserError(f"{where}: answer {str(answer)[:60]!r} is empty once normalised")
    level = row.get("level")
    return {"uid": str(row.get("unique_id", row.get("uid", index))), "question": problem, "answer": str(answer),
            "subject": str(row.get("subject") or row.get("type") or "unknown"),  # the original MATH says `type`
            "level": level if isinstance(level, int | str) and not isinstance(level, bool) else None,
            "source": name}
