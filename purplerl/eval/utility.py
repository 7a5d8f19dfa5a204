"""Utility evaluation: math word problems scored by exact match of the final number.

A tamper-resistance defense is only worth something if the defended model can still do benign work, so
every defense report pairs its harm numbers with this accuracy. The built-in set (`builtin:arithmetic`)
holds short integer-answer problems written for this project, small enough for the embedded model to run
on a laptop; a GSM8K directory prepared by `purplerl data prepare gsm8k` is the full-size alternative.

Items are plain dicts `{"uid", "question", "answer", "source"}` whose answer is a canonical number string.
Prompts ask for the answer after '####' (GSM8K's convention, shared with `purplerl.data.prepare`); the
scorer reads the number after '####', or else the last number, so a model that ignores the format is
still scored on what it computed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from purplerl.data.prepare import Template, math_prompt
from purplerl.data.sources import read_parquet_rows
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.files import read_jsonl
from purplerl.types import PromptRecord

BUILTIN_DIR = Path(__file__).parent / "builtin"
BUILTIN_SETS = ("arithmetic",)

# A number: digits with optional thousands separators ("1,234") and an optional decimal part.
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# A minus sign only counts when it does not follow a word or number, so "pages 10-12" ends on 12, not -12.
_NUMBER = re.compile(rf"(?:(?<![\w.])-)?{_NUM}")
_AFTER_HASHES = re.compile(rf"####\s*\$?\s*(-?{_NUM})")


def canonical_number(text: str) -> str | None:
    """The number in `text` written canonically ("1,200.0" -> "1200", "-0" -> "0"), or None if not a number."""
    try:
        value = Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    # normalize() drops trailing zeros so 12.0 == 12; format "f" undoes the exponent it may introduce (1.2E+3).
    return "0" if value == 0 else format(value.normalize(), "f")


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, canonical, or None when it holds no number.

    GSM8K style: the number after the first '####' that is followed by one; otherwise the last number in
    the text. Thousands separators are dropped and "12.0" reads as "12".
    """
    match = _AFTER_HASHES.search(text)
    if match:
        return canonical_number(match.group(1))
    numbers = _NUMBER.findall(text)
    return canonical_number(numbers[-1]) if numbers else None


def exact_match(prediction_text: str, answer: str) -> bool:
    """Whether the completion's final number equals `answer` (a number, or a GSM8K solution ending '#### n')."""
    gold = extract_answer(answer) if "####" in answer else canonical_number(answer)
    if gold is None:
        raise UserError(f"reference answer {answer!r} is not a number")
    return extract_answer(prediction_text) == gold


def load_utility_set(source: str = "builtin:arithmetic", limit: int | None = None,
                     split: str = "test") -> list[dict[str, str]]:
    """Problems of `source`: 'builtin:arithmetic', a prepared GSM8K dir (its `split`), or a .jsonl/.parquet
    file with `question` and `answer` fields (veRL rows work too). The first `limit` items, in file order."""
    if limit is not None and limit < 1:
        raise UserError(f"utility set limit must be >= 1, got {limit}")
    rows, where, name = _read_rows(source, split)
    items = [_to_item(row, i, f"{where} row {i}", name) for i, row in enumerate(rows)]
    return checked_items(items, where, kind="utility", limit=limit)


def checked_items(items: list[dict[str, Any]], where: str, *, kind: str, limit: int | None) -> list[dict[str, Any]]:
    """The first `limit` items of an evaluation set, refused when it is empty or repeats a uid."""
    if not items:
        raise UserError(f"no items in {kind} set {where}")
    uids = [item["uid"] for item in items]
    if len(set(uids)) != len(uids):
        repeated = sorted({uid for uid in uids if uids.count(uid) > 1})
        raise UserError(f"{kind} set {where} repeats uids: {', '.join(repeated[:5])}")
    return items[:limit] if limit is not None else items


def utility_prompts(items: Sequence[dict[str, str]], template: Template = "chat") -> list[PromptRecord]:
    """One single-message prompt per item.

    chat: "Solve the problem and give the final answer after '####'.\\n\\n{question}";
    base: "Question: {question}\\nAnswer:" (a base model follows the Q/A format instead of an instruction).
    """
    return [PromptRecord(messages=({"role": "user", "content": math_prompt(item["question"], template)},),
                         category="utility", source=item["source"], uid=item["uid"]) for item in items]


def score_utility(completions: Sequence[str], items: Sequence[dict[str, str]]) -> dict[str, Any]:
    """Exact-match accuracy of `completions[i]` against `items[i]["answer"]`.

    Returns accuracy (fraction correct), n, and per item `correct` (bools) and `predicted` (the extracted
    answer, None when the completion had no number) so a report can show what each completion said.
    """
    if len(completions) != len(items):
        raise ExperimentError(f"{len(completions)} completions for {len(items)} utility items")
    if not items:
        raise ExperimentError("no utility items to score")
    predicted = [extract_answer(text) for text in completions]
    correct = [exact_match(text, item["answer"]) for text, item in zip(completions, items, strict=True)]
    return {"accuracy": sum(correct) / len(correct), "n": len(correct), "correct": correct, "predicted": predicted}


def _read_rows(source: str, split: str) -> tuple[list[dict[str, Any]], str, str]:
    return read_eval_rows(source, split, kind="utility", builtin_sets=BUILTIN_SETS,
                          usage="'builtin:arithmetic', a .jsonl/.parquet file or a directory prepared by "
                                "`purplerl data prepare gsm8k`")


def read_eval_rows(source: str, split: str, *, kind: str, builtin_sets: tuple[str, ...],
                   usage: str) -> tuple[list[dict[str, Any]], str, str]:
    """Rows of an evaluation set, where they came from (for messages) and the source name items carry.

    `source` is 'builtin:NAME' (a file in eval/builtin/), a .jsonl/.parquet file, or a directory holding
    `{split}.parquet` or `{split}.jsonl`; `kind` and `usage` only shape the error messages."""
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in builtin_sets:
            raise UserError(f"unknown built-in {kind} set '{source}' (available: "
                            + ", ".join(f"builtin:{n}" for n in builtin_sets) + ")")
        return read_jsonl(BUILTIN_DIR / f"{name}.jsonl"), source, source
    path = Path(source).expanduser()
    if path.is_dir():
        for file in (path / f"{split}.parquet", path / f"{split}.jsonl"):
            if file.is_file():
                return _read_file(file), str(file), path.name
        raise UserError(f"{kind} set directory {path} has no {split}.parquet or {split}.jsonl")
    if path.suffix not in (".jsonl", ".parquet"):
        raise UserError(f"unknown {kind} set '{source}': use {usage}")
    if not path.is_file():
        raise UserError(f"{kind} set file not found: {path}")
    return _read_file(path), str(path), path.name


def read_hf_rows(spec: str, split: str) -> list[dict[str, Any]]:
    """The rows of hub dataset 'ORG/NAME' or 'ORG/NAME:CONFIG' (the `hf:` sources of the evaluation sets), from
    the hub or the HF cache."""
    name, _, config = spec.partition(":")
    import datasets  # deferred: importing datasets is slow and only hub sources need it

    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except (OSError, ValueError) as err:  # not found, no network, unknown split or config
        raise UserError(f"cannot load HF dataset '{name}' (config {config or None}, split '{split}'): "
                        f"{first_line(err)}") from err
    return ds.to_list()


def _read_file(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path) if path.suffix == ".jsonl" else read_parquet_rows(path)


def _to_item(row: dict[str, Any], index: int, where: str, name: str) -> dict[str, str]:
    extra = row.get("extra_info")
    if isinstance(extra, dict) and isinstance(row.get("reward_model"), dict):
        # A veRL row: the raw question sits in extra_info, the scored answer in reward_model.
        question, answer = extra.get("question"), row["reward_model"].get("ground_truth")
        uid, source = row.get("uid", extra.get("index", index)), row.get("data_source") or name
    else:
        question, answer = row.get("question"), row.get("answer")
        uid, source = row.get("uid", index), name
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: no question text (fields: {', '.join(row)})")
    if not isinstance(answer, str | int) or isinstance(answer, bool):
        raise UserError(f"{where}: answer should be a number string, got {type(answer).__name__}")
    answer = str(answer)
    gold = extract_answer(answer) if "####" in answer else canonical_number(answer)
    if gold is None:
        raise UserError(f"{where}: answer {answer[-60:]!r} is not a number nor ends with '#### <number>'")
    return {"uid": str(uid), "question": question, "answer": gold, "source": str(source)}
