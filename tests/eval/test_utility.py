"""The utility suite: answer extraction, exact match, the built-in set, loaders and scoring by hand."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purplerl.errors import ExperimentError, UserError
from purplerl.eval import exact_match, extract_answer, load_utility_set, score_utility, utility_prompts
from purplerl.eval.utility import canonical_number
from purplerl.types import PromptRecord


@pytest.mark.parametrize(("text", "expected"), [
    ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
    ("#### 1,234", "1234"),
    ("first 5, then #### -12 and later 99", "-12"),  # the number after '####' wins over the last one
    ("I will write the answer after ####.\nSo #### 42", "42"),  # a '####' with no number is skipped
    ("#### answer is 5", "5"),  # no number right after '####': the last number
    ("He pays 3 dollars, then 4, so 12 in total.", "12"),
    ("The total is 1,200 dollars.", "1200"),
    ("The temperature is now -7 degrees.", "-7"),
    ("It costs 12.0 dollars.", "12"),
    ("About 2.50 each", "2.5"),
    ("pages 10-12", "12"),  # a hyphen between numbers is not a minus sign
    ("$1,000.50 in total", "1000.5"),
    ("I cannot answer that.", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("12", "12"), ("12.0", "12"), ("-0", "0"), ("1,200", "1200"), ("0.50", "0.5"), ("abc", None), ("nan", None)])
def test_canonical_number(text, expected):
    assert canonical_number(text) == expected


def test_exact_match():
    assert exact_match("so the answer is #### 12", "12")
    assert exact_match("It is 12.0", "12")
    assert exact_match("#### 1,200", "1200")
    assert exact_match("-3 degrees", "-3")
    assert exact_match("#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72")  # a GSM8K solution as reference
    assert not exact_match("#### 13", "12")
    assert not exact_match("no idea", "12")
    assert not exact_match("3", "-3")
    with pytest.raises(UserError, match="reference answer 'twelve' is not a number"):
        exact_match("12", "twelve")


def test_builtin_set():
    items = load_utility_set()
    assert len(items) >= 40
    assert len({item["uid"] for item in items}) == len(items)
    assert len({item["question"] for item in items}) == len(items)
    for item in items:
        assert item["answer"] == str(int(item["answer"])), item
        assert item["source"] == "builtin:arithmetic"
        assert 20 < len(item["question"]) < 200
    assert any(int(item["answer"]) < 0 for item in items)
    assert [item["uid"] for item in load_utility_set("builtin:arithmetic", limit=3)] == ["arith-01", "arith-02",
                                                                                          "arith-03"]


def test_utility_prompts():
    items = [{"uid": "u1", "question": "What is 2 + 3?", "answer": "5", "source": "mine"}]
    assert utility_prompts(items) == [PromptRecord(
        messages=({"role": "user", "content": "Solve the problem and give the final answer after '####'.\n\n"
                                              "What is 2 + 3?"},),
        category="utility", source="mine", uid="u1")]
    assert utility_prompts(items, "base")[0].messages[0]["content"] == "Question: What is 2 + 3?\nAnswer:"


def test_score_utility_by_hand():
    items = [{"uid": str(i), "question": "q", "answer": a, "source": "s"} for i, a in enumerate(["7", "12", "-3", "5"])]
    completions = ["3 + 4 = 7\n#### 7", "I think it is 13.", "The answer is -3.0", "no number here"]
    assert score_utility(completions, items) == {
        "accuracy": 0.5, "n": 4, "correct": [True, False, True, False], "predicted": ["7", "13", "-3", None]}
    with pytest.raises(ExperimentError, match="3 completions for 4 utility items"):
        score_utility(completions[:3], items)
    with pytest.raises(ExperimentError, match="no utility items"):
        score_utility([], [])


def test_load_jsonl_and_prepared_gsm8k_dir(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "q1", "answer": "Half of 20 is 10.\n#### 10"}) + "\n"
                    + json.dumps({"uid": "b", "question": "q2", "answer": 3}) + "\n")
    assert load_utility_set(str(path)) == [{"uid": "0", "question": "q1", "answer": "10", "source": "mine.jsonl"},
                                           {"uid": "b", "question": "q2", "answer": "3", "source": "mine.jsonl"}]
    gsm = tmp_path / "gsm8k"
    gsm.mkdir()
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "formatted"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "1200"},
             "extra_info": {"split": "test", "index": 4, "category": "math", "question": "raw q", "answer": "s"}}]
    pq.write_table(pa.Table.from_pylist(rows), gsm / "test.parquet")
    assert load_utility_set(str(gsm)) == [{"uid": "4", "question": "raw q", "answer": "1200", "source": "openai/gsm8k"}]


def test_prepared_gsm8k_round_trip(tmp_path):
    from purplerl.data.prepare import prepare_gsm8k

    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):
        row = {"question": f"{split} question", "answer": "2 * 3 = 6\n#### 6"}
        (src / f"{split}.jsonl").write_text(json.dumps(row) + "\n")
    prepare_gsm8k(tmp_path / "out", source=src)
    items = load_utility_set(str(tmp_path / "out"))
    assert items == [{"uid": "0", "question": "test question", "answer": "6", "source": "openai/gsm8k"}]
    assert score_utility(["#### 6"], items)["accuracy"] == 1.0


@pytest.mark.parametrize(("content", "message"), [
    ('{"question": "q", "answer": "six"}', "row 0: answer 'six' is not a number"),
    ('{"question": "q"}', "row 0: answer should be a number string, got NoneType"),
    ('{"answer": "6"}', "row 0: no question text"),
    ('{"uid": "a", "question": "q", "answer": "1"}\n{"uid": "a", "question": "r", "answer": "2"}', "repeats uids: a"),
])
def test_bad_utility_rows(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content + "\n")
    with pytest.raises(UserError, match=message):
        load_utility_set(str(path))


def test_bad_utility_sources(tmp_path):
    with pytest.raises(UserError, match="unknown built-in utility set 'builtin:mmlu'"):
        load_utility_set("builtin:mmlu")
    with pytest.raises(UserError, match="utility set file not found"):
        load_utility_set(str(tmp_path / "none.jsonl"))
    with pytest.raises(UserError, match="has no test.parquet or test.jsonl"):
        load_utility_set(str(tmp_path))
    with pytest.raises(UserError, match="unknown utility set 'gsm8k'"):
        load_utility_set("gsm8k")
    with pytest.raises(UserError, match="limit must be >= 1"):
        load_utility_set(limit=0)
