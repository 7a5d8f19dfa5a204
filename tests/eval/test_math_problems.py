"""The math task of the utility suite: the built-in set, MATH-500-shaped files, dirs and hub sources, the
chain-of-thought prompt, scoring by hand, and `purplerl eval --math-source` on the tiny random model."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purplerl.errors import ExperimentError, UserError
from purplerl.eval.math_answers import last_boxed
from purplerl.eval.math_problems import load_math_set, math_prompt, math_prompts, score_math
from purplerl.eval.metrics import bootstrap_ci
from purplerl.eval.suites import math_suite
from purplerl.eval.utility import BUILTIN_DIR
from purplerl.files import read_jsonl
from tests.conftest import invoke_cli

MATH_SUBJECTS = {"Prealgebra", "Algebra", "Number Theory", "Counting & Probability", "Geometry",
                 "Intermediate Algebra", "Precalculus"}
# Rows in MATH-500's fields (HuggingFaceH4/MATH-500), written for these tests.
ROWS = [{"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "It is $\\boxed{\\frac{3}{4}}$.",
         "answer": "\\frac{3}{4}", "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
        {"problem": "Solve $2x = 10$.", "solution": "$x = \\boxed{5}$", "answer": "5", "subject": "Algebra",
         "level": 2, "unique_id": "test/algebra/7.json"}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_builtin_set_is_well_formed_and_its_own_solutions_score_full_marks() -> None:
    rows = read_jsonl(BUILTIN_DIR / "math.jsonl")
    items = load_math_set("builtin:math")
    assert 20 <= len(items) == len(rows) <= 40
    assert len({item["uid"] for item in items}) == len(items)
    assert len({item["question"] for item in items}) == len(items)
    for row, item in zip(rows, items, strict=True):
        assert set(row) == {"problem", "solution", "answer", "subject", "level", "unique_id"}, row
        assert last_boxed(row["solution"]) == row["answer"], row["unique_id"]  # the worked answer is the answer
        assert item["subject"] in MATH_SUBJECTS and item["level"] in (1, 2, 3) and item["source"] == "builtin:math"
    assert len({item["subject"] for item in items}) >= 4
    assert any("\\frac" in item["answer"] for item in items) and any(item["answer"].startswith("-") for item in items)
    assert score_math([row["solution"] for row in rows], items)["accuracy"] == 1.0
    assert [item["uid"] for item in load_math_set("builtin:math", limit=2)] == ["builtin/math/01", "builtin/math/02"]


def test_math500_fields_from_jsonl_parquet_and_a_split_dir(tmp_path: Path) -> None:
    items = load_math_set(str(write_jsonl(tmp_path / "math500.jsonl", ROWS)))
    assert items == [{"uid": "test/prealgebra/1.json", "question": ROWS[0]["problem"], "answer": "\\frac{3}{4}",
                      "subject": "Prealgebra", "level": 1, "source": "math500.jsonl"},
                     {"uid": "test/algebra/7.json", "question": "Solve $2x = 10$.", "answer": "5",
                      "subject": "Algebra", "level": 2, "source": "math500.jsonl"}]
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "math500.parquet")
    assert load_math_set(str(tmp_path / "math500.parquet")) == [{**i, "source": "math500.parquet"} for i in items]
    (tmp_path / "sets").mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:1]), tmp_path / "sets" / "validation.parquet")
    assert [i["uid"] for i in load_math_set(str(tmp_path / "sets"), split="validation")] == ["test/prealgebra/1.json"]


def test_original_math_rows_take_the_answer_from_the_solution(tmp_path: Path) -> None:
    """Hendrycks MATH's own files have no `answer`, a `Level N` string, `type` for the subject and no id: the
    solution's last box, the level as written, the type and the row index stand in."""
    row = {"problem": "What is $3^2$?", "solution": "First \\boxed{6}? No: $3^2 = \\boxed{9}$.", "level": "Level 1",
           "type": "Prealgebra"}
    (item,) = load_math_set(str(write_jsonl(tmp_path / "math.jsonl", [row])))
    assert (item["uid"], item["answer"], item["level"], item["subject"]) == ("0", "9", "Level 1", "Prealgebra")


def test_hub_source_goes_through_load_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    """hf:HuggingFaceH4/MATH-500 is read with datasets.load_dataset (stubbed with a real Dataset: no network)."""
    import datasets

    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    items = load_math_set("hf:HuggingFaceH4/MATH-500", limit=1)
    assert calls == [("HuggingFaceH4/MATH-500", None, "test")]
    assert [(i["uid"], i["answer"], i["source"]) for i in items] == [
        ("test/prealgebra/1.json", "\\frac{3}{4}", "HuggingFaceH4/MATH-500")]
    load_math_set("hf:org/math:algebra", split="train")
    assert calls[-1] == ("org/math", "algebra", "train")

    def unreachable(name, config, split):
        raise OSError("no network")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(UserError, match="cannot load HF dataset 'org/gone'.*no network"):
        load_math_set("hf:org/gone")


@pytest.mark.parametrize(("row", "needle"), [
    ({"answer": "3"}, "row 0: no problem text"),
    ({"problem": "  ", "answer": "3"}, "row 0: no problem text"),
    ({"problem": "p", "solution": "no box here"}, "no answer field and its solution has no closed"),
    ({"problem": "p", "solution": "\\boxed{4"}, "no answer field and its solution has no closed"),
    ({"problem": "p"}, "answer should be a string or a number, got NoneType"),
    ({"problem": "p", "answer": True}, "got bool"),
    ({"problem": "p", "answer": ["3"]}, "got list"),
    ({"problem": "p", "answer": "$ $"}, "is empty once normalised"),
])
def test_bad_rows_are_user_errors(tmp_path: Path, row: dict, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        load_math_set(str(write_jsonl(tmp_path / "bad.jsonl", [row])))


def test_bad_sources_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown built-in math set 'builtin:gsm8k' \\(available: builtin:math\\)"):
        load_math_set("builtin:gsm8k")
    with pytest.raises(UserError, match="math set file not found"):
        load_math_set(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="unknown math set 'problems.txt': use 'builtin:math'"):
        load_math_set("problems.txt")
    with pytest.raises(UserError, match="repeats uids: a"):
        load_math_set(str(write_jsonl(tmp_path / "twice.jsonl", [{**ROWS[0], "unique_id": "a"}] * 2)))
    with pytest.raises(UserError, match="limit must be >= 1"):
        load_math_set("builtin:math", limit=0)


def test_prompts_ask_for_reasoning_and_a_box() -> None:
    assert math_prompt("What is 1 + 1?") == (
        "What is 1 + 1?\n\nPlease reason step by step, and put your final answer within \\boxed{}.")
    assert math_prompt("What is 1 + 1?", "base") == (
        "Problem: What is 1 + 1?\nSolve it step by step and write the final answer as \\boxed{answer}.\nSolution:")
    (record,) = math_prompts(load_math_set(str(BUILTIN_DIR / "math.jsonl"), limit=1))
    assert record.uid == "builtin/math/01" and record.category == "utility" and record.source == "math.jsonl"


def _items(*answers: tuple[str, str]) -> list[dict]:
    return [{"uid": f"u{i}", "question": "q", "answer": answer, "subject": subject, "level": 1, "source": "t"}
            for i, (answer, subject) in enumerate(answers)]


def test_score_math_by_hand() -> None:
    items = _items(("\\frac{1}{2}", "Algebra"), ("5", "Algebra"), ("12", "Geometry"), ("-3", "Geometry"))
    completions = ["Half of one is $\\boxed{\\dfrac12}$.",  # right after normalisation
                   "x = 5, so \\boxed{x = 5}",  # right: `x =` goes
                   "The answer is 12.",  # right number, but no box: no answer
                   "\\boxed{-3} ... wait, \\boxed{3}"]  # the last box counts: wrong
    scored = score_math(completions, items)
    assert [row["correct"] for row in scored["items"]] == [True, True, False, False]
    assert [row["predicted"] for row in scored["items"]] == ["\\dfrac12", "x = 5", None, "3"]
    assert scored["n"] == 4 and scored["accuracy"] == 0.5
    assert scored["by_subject"] == {"Algebra": {"n": 2, "accuracy": 1.0}, "Geometry": {"n": 2, "accuracy": 0.0}}
    assert scored["items"][0]["completion"] == completions[0] and scored["items"][3]["subject"] == "Geometry"
    with pytest.raises(ExperimentError, match="3 completions for 4 math items"):
        score_math(completions[:3], items)
    with pytest.raises(ExperimentError, match="no math items"):
        score_math([], [])


def test_math_suite_scores_greedy_answers_with_a_bootstrap_ci() -> None:
    """The suite asks each problem with the CoT prompt, at its own token budget, and reports exact match with the
    same 95% bootstrap CI as the other utility metrics."""
    asked = []

    def generate(records, max_new_tokens):
        asked.append(max_new_tokens)
        assert all(r.messages[0]["content"].endswith("within \\boxed{}.") for r in records)
        return [f"\\boxed{{{item['answer'] if i % 3 else 'wrong'}}}" for i, item in enumerate(items)]

    items = load_math_set("builtin:math", limit=9)
    found = math_suite(generate, "builtin:math", 9, 64, "chat", seed=3)
    point, low, high = bootstrap_ci([0.0, 1.0, 1.0] * 3, seed=3)
    assert asked == [64]
    assert found["metrics"] == {"math_exact_match": {"point": point, "low": low, "high": high}}
    assert point == pytest.approx(6 / 9) and low < point < high
    assert found["math"]["source"] == "builtin:math" and found["math"]["n"] == 9


def test_none_skips_the_math_task() -> None:
    from purplerl.config import EVAL, EvalCommandConfig, load_command_config

    assert EvalCommandConfig().utility.math_source is None  # chain of thought costs minutes: asked for, not default
    for off in ("none", "None", ""):
        assert load_command_config(EVAL, None, ["--model", "m", "--math-source", off]).utility.math_source is None


def run_eval(*args: str | Path, cache: Path):
    return invoke_cli("eval", *args, env={"PURPLERL_CACHE": str(cache)})


def test_eval_reports_math_exact_match(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_eval("--model", tiny_model_dir, "--suite", "utility", "--utility-limit", "1", "--choice-source", "none",
                    "--math-source", "builtin:math", "--math-limit", "2", "--math-tokens", "16", "--device", "cpu",
                    "--out", out, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    utility = json.loads((out / "eval.json").read_text())["targets"]["base"]["utility"]
    ci = utility["metrics"]["math_exact_match"]
    assert 0.0 <= ci["low"] <= ci["point"] <= ci["high"] <= 1.0
    assert set(utility["metrics"]) == {"exact_match", "math_exact_match"}
    assert utility["math"]["n"] == 2 and utility["math"]["source"] == "builtin:math"
    assert [row["uid"] for row in utility["math"]["items"]] == ["builtin/math/01", "builtin/math/02"]
    assert "math_exact_match" in proc.stdout and "math_exact_match" in (out / "report.html").read_text()


@pytest.mark.parametrize(("args", "needle"), [
    (["--math-source", "builtin:nope"], "unknown built-in math set 'builtin:nope'"),
    (["--math-source", "/nonexistent/math.jsonl"], "math set file not found: /nonexistent/math.jsonl"),
    (["--math-source", "problems.txt"], "unknown math set 'problems.txt'"),
    (["--math-source", "builtin:math", "--math-limit", "0"], "'utility.math_limit': Input should be greater than"),
    (["--math-source", "builtin:math", "--math-tokens", "8"], "'utility.math_max_new_tokens': Input should be"),
    (["--math-limit", "2"], "math_limit is read only when utility.math_source is set"),
])
def test_bad_math_settings_are_one_line_errors_with_exit_2(tiny_model_dir: Path, tmp_path: Path, args: list[str],
                                                           needle: str) -> None:
    out = tmp_path / "out"
    proc = run_eval("--model", tiny_model_dir, "--suite", "utility", "--out", out, *args, cache=tmp_path / "cache")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr
    assert not out.exists()  # found before any model loads or any file is written
