"""Multiple-choice utility: loaders for each row shape, option log-likelihood scoring checked by hand, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_eval_run import finish, start

from purplerl.errors import UserError
from purplerl.eval.choice import choice_answer, choice_question, load_choice_set, option_logprobs, score_choices


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_builtin_set_is_well_formed() -> None:
    items = load_choice_set("builtin:choice")
    assert len(items) >= 20
    for item in items:
        assert len(item["choices"]) == 4 and 0 <= item["answer"] < 4 and item["source"] == "builtin:choice"
    assert [item["uid"] for item in load_choice_set("builtin:choice", limit=3)] == [i["uid"] for i in items[:3]]


def test_mmlu_pro_shape_with_letter_or_index(tmp_path: Path) -> None:
    rows = [{"question_id": 70, "question": "2+2?", "options": ["3", "4", "5"], "answer": "B", "answer_index": 1},
            {"question_id": 71, "question": "Sky?", "options": ["blue", "red"], "answer": "A"}]
    items = load_choice_set(str(write_jsonl(tmp_path / "mmlu.jsonl", rows)))
    assert [(i["uid"], i["choices"], i["answer"]) for i in items] == [("70", ["3", "4", "5"], 1),
                                                                      ("71", ["blue", "red"], 0)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mmlu.parquet")
    assert load_choice_set(str(tmp_path / "mmlu.parquet")) == [{**i, "source": "mmlu.parquet"} for i in items]


def test_wmdp_shape(tmp_path: Path) -> None:
    rows = [{"question": "Q one?", "choices": ["a", "b", "c", "d"], "answer": 3},
            {"question": "Q two?", "choices": ["e", "f", "g", "h"], "answer": 0}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "wmdp.parquet")
    items = load_choice_set(str(tmp_path / "wmdp.parquet"))
    assert [(i["uid"], i["question"], i["answer"]) for i in items] == [("0", "Q one?", 3), ("1", "Q two?", 0)]
    assert items[1]["choices"] == ["e", "f", "g", "h"]


def test_prepared_wmdp_dir(tmp_path: Path) -> None:
    from purplerl.data.prepare import wmdp_rows

    raw = [{"question": f"Question {i}?", "choices": ["w", "x", "y", "z"], "answer": i % 4} for i in range(10)]
    splits = wmdp_rows(raw, "bio", "chat", seed=1)
    (tmp_path / "wmdp-bio").mkdir()
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "wmdp-bio" / f"{split}.parquet")
    items = load_choice_set(str(tmp_path / "wmdp-bio"))
    test = splits["test"]
    assert len(items) == len(test)
    for item, row in zip(items, test, strict=True):
        assert item["question"] == row["extra_info"]["question"] and item["choices"] == ["w", "x", "y", "z"]
        assert item["answer"] == row["extra_info"]["answer_index"] and item["source"] == "cais/wmdp:wmdp-bio"
    assert len(load_choice_set(str(tmp_path / "wmdp-bio"), split="train")) == len(splits["train"])


@pytest.mark.parametrize(("row", "needle"), [
    ({"question": "q", "choices": ["a", "b"], "answer": 2}, "not a letter or an index"),
    ({"question": "q", "options": ["a", "b"], "answer": "Z"}, "not a letter or an index"),
    ({"question": "q", "choices": ["a"], "answer": 0}, "list of 2 to"),
    ({"question": "", "choices": ["a", "b"], "answer": 0}, "no question text"),
])
def test_bad_rows_are_user_errors(tmp_path: Path, row: dict, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        load_choice_set(str(write_jsonl(tmp_path / "bad.jsonl", [row])))


def test_unknown_sources_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown built-in choice set"):
        load_choice_set("builtin:nope")
    with pytest.raises(UserError, match="not found"):
        load_choice_set(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="limit"):
        load_choice_set("builtin:choice", limit=0)


ITEMS = [{"uid": "a", "question": "What is 2 + 2?", "choices": ["4", "five", "three and a half", "22"], "answer": 0,
          "source": "t"},
         {"uid": "b", "question": "Pick the cat.", "choices": ["dog", "cat"], "answer": 1, "source": "t"}]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine

    return LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", dtype="float32"))


def test_scores_equal_a_forward_pass_by_hand(engine, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32).eval()
    tok = engine.tokenizer
    scores = option_logprobs(engine, ITEMS, batch_size=3)  # 6 sequences: micro-batches cut across items
    for item, options in zip(ITEMS, scores, strict=True):
        text = tok.apply_chat_template([{"role": "user", "content": choice_question(item)}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = tok.encode(text, add_special_tokens=False)
        for k, (total, length) in enumerate(options):
            answer = tok.encode(f"{'ABCD'[k]}. {item['choices'][k]}", add_special_tokens=False)
            ids = torch.tensor([prompt + answer])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            expected = sum(float(logp[len(prompt) + j - 1, t]) for j, t in enumerate(answer))
            assert length == len(answer)
            assert abs(total - expected) <= 1e-5, (item["uid"], k, total, expected)
    result = score_choices(engine, ITEMS, batch_size=4)
    for row, options in zip(result["items"], scores, strict=True):
        assert row["sum"] == pytest.approx([s for s, _ in options], abs=1e-5)
        assert row["mean"] == pytest.approx([s / n for s, n in options], abs=1e-5)
        assert row["predicted"] == max(range(len(options)), key=lambda k: options[k][0] / options[k][1])
        # the two batchings above (3 and 4 sequences) differ by ~1e-6; a clear winner keeps that from flipping it
        means = sorted((total / length for total, length in options), reverse=True)
        assert means[0] - means[1] > 1e-3
    assert result["n"] == 2 and result["accuracy"] in (0.0, 0.5, 1.0)


class RiggedEngine:
    """Logprob 0 for the token 'Z', -1 for every other token: options made of Z's are the likely ones."""

    def __init__(self, tokenizer, z_token: str = "Z") -> None:
        self.tokenizer = tokenizer
        (self.z_id,) = tokenizer.encode(z_token, add_special_tokens=False)

    def logprobs(self, input_ids_NT: torch.Tensor, attention_mask_NT: torch.Tensor, **_) -> torch.Tensor:
        lp = torch.where(input_ids_NT == self.z_id, 0.0, -1.0)
        lp[:, 0] = 0.0
        return lp * attention_mask_NT


def test_argmax_picks_the_rigged_option(tiny_tokenizer) -> None:
    items = [{"uid": "r", "question": "Which?", "choices": ["apple pie", "ZZZZZZ", "none of them", "it is this one"],
              "answer": 1, "source": "t"},
             {"uid": "s", "question": "Which?", "choices": ["ZZZZZZZZ", "a b c d e f", "x"], "answer": 0,
              "source": "t"}]
    result = score_choices(RiggedEngine(tiny_tokenizer), items, batch_size=5)
    assert [row["predicted"] for row in result["items"]] == [1, 0]
    assert result["accuracy"] == 1.0 and result["accuracy_sum"] == 1.0
    # A constant logprob per token: every mean ties (the first option wins), the sum picks the shortest.
    plain = [{"uid": "p", "question": "Which?", "choices": ["a long long answer", "medium one", "x", "two words"],
              "answer": 1, "source": "t"}]
    flat = score_choices(RiggedEngine(tiny_tokenizer, "Q"), plain)
    assert flat["items"][0]["predicted"] == 0 and flat["items"][0]["mean"] == [-1.0] * 4
    assert flat["items"][0]["predicted_sum"] == 2 and flat["accuracy"] == 0.0


def test_answers_render_as_letter_and_text() -> None:
    assert choice_answer(ITEMS[0], 2) == "C. three and a half"
    assert choice_answer(ITEMS[0], 0, "base") == " A. 4"
    assert "A. 4\nB. five" in choice_question(ITEMS[0])


@pytest.mark.process
def test_eval_cli_reports_choice_accuracy(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = finish(start("--model", tiny_model_dir, "--suite", "utility", "--utility-limit", "2", "--choice-limit", "5",
                        "--max-new-tokens", "4", "--device", "cpu", "--out", out, cache=tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    utility = json.loads((out / "eval.json").read_text())["targets"]["base"]["utility"]
    ci = utility["metrics"]["choice_accuracy"]
    assert 0.0 <= ci["low"] <= ci["point"] <= ci["high"] <= 1.0
    assert utility["choice"]["n"] == 5 and utility["choice"]["source"] == "builtin:choice"
    assert len(utility["choice"]["items"]) == 5 and "accuracy_sum" in utility["choice"]
    assert "choice_accuracy" in proc.stdout and "exact_match" in proc.stdout
