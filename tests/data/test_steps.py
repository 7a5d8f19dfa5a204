"""Step-labelled rows (TRL's stepwise-supervision layout): parsing and its one-line refusals, a sampled answer cut into
steps, the tokens a process reward model reads (each step's last token its separator's last) and what is cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purplerl.config import PreferenceDataConfig
from purplerl.data.preference import encode_prompt
from purplerl.data.steps import (
    StepFormat,
    encode_labelled,
    encode_steps,
    load_step_rows,
    split_steps,
    step_batch,
    steps_from_row,
)
from purplerl.errors import UserError
from purplerl.types import StepLabelledCompletion

ROW = {"prompt": "What is 2 + 3 * 4?", "completions": ["3 * 4 = 12", "2 + 12 = 15"], "labels": [True, False]}
FORMAT = StepFormat("chat", None, 256, 256, "\n")


def test_a_row_holds_a_prompt_its_steps_and_a_label_per_step() -> None:
    row = steps_from_row(ROW, "f.jsonl:1")
    assert row == StepLabelledCompletion(({"role": "user", "content": "What is 2 + 3 * 4?"},),
                                         ("3 * 4 = 12", "2 + 12 = 15"), (True, False), "f.jsonl:1")
    chat = steps_from_row({**ROW, "prompt": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Sum?"}]}, "f.jsonl:2")
    assert [m["role"] for m in chat.prompt] == ["system", "user"]


@pytest.mark.parametrize("change, says", [
    ({"labels": [True]}, "2 steps in 'completions' but 1 'labels': give one label per step"),
    ({"labels": [True, False, True]}, "2 steps in 'completions' but 3 'labels'"),
    ({"completions": ["3 * 4 = 12", ""]}, "'completions'[1] is an empty step"),
    ({"completions": ["3 * 4 = 12", " \n"]}, "'completions'[1] is an empty step"),
    ({"completions": [], "labels": []}, "'completions' must be a non-empty list of steps (texts), got list"),
    ({"completions": "3 * 4 = 12\n2 + 12 = 15"}, "'completions' must be a non-empty list of steps (texts), got str"),
    ({"completions": ["3 * 4 = 12", 15]}, "'completions'[1] must be a text, got int"),
    ({"labels": [1, 0]}, "'labels'[0] must be true (a correct step) or false, got int 1"),
    ({"labels": [True, "false"]}, "'labels'[1] must be true (a correct step) or false, got str 'false'"),
    ({"labels": None}, "'labels' is null"),
    ({"labels": "true"}, "'labels' must be a list of booleans, one per step, got str"),
    ({"prompt": ""}, "'prompt' is empty"),
])
def test_a_bad_row_is_one_line_naming_it(change: dict, says: str) -> None:
    with pytest.raises(UserError) as err:
        steps_from_row({**ROW, **change}, "f.jsonl:7")
    assert str(err.value).startswith(f"f.jsonl:7: {says}")
    assert "\n" not in str(err.value)


def test_a_missing_field_names_the_fields_there_are() -> None:
    with pytest.raises(UserError, match=r"^f.jsonl:1: 'labels' is missing \(fields: completions, prompt\)$"):
        steps_from_row({k: v for k, v in ROW.items() if k != "labels"}, "f.jsonl:1")


def test_rows_load_from_a_file_each_bad_one_named_or_left_out(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (ROW, {**ROW, "labels": [True]}, ROW)))
    with pytest.raises(UserError, match=f"^{path}:2: 2 steps in 'completions' but 1 'labels'"):
        load_step_rows(PreferenceDataConfig(source=str(path)))
    loaded = load_step_rows(PreferenceDataConfig(source=str(path)), skip_bad_rows=True)
    assert [row.source_row for row in loaded.items] == [f"{path}:1", f"{path}:3"]
    assert loaded.skipped == (f"{path}:2: 2 steps in 'completions' but 1 'labels': give one label per step",)


@pytest.mark.parametrize("text, steps", [
    ("a\nb\n", ["a", "b"]),  # a trailing separator ends the last step
    ("a\n\n  \nb", ["a", "b"]),  # blank pieces are no steps
    (" a \nb", [" a ", "b"]),  # a step keeps its spaces: it is encoded as written
    ("", [""]),  # an empty answer is one (empty) step, so it gets a score
    ("\n\n", ["\n\n"]),
])
def test_an_answer_is_cut_at_every_separator(text: str, steps: list[str]) -> None:
    assert split_steps(text, "\n") == steps


def test_each_step_is_read_at_its_separators_last_token(tiny_tokenizer) -> None:
    row = steps_from_row(ROW, "r")
    encoded = encode_steps(tiny_tokenizer, row.prompt, row.steps, "r", StepFormat("chat", None, 256, 256, " ||"))
    prompt_ids, _ = encode_prompt(tiny_tokenizer, row.prompt, "r", "chat", None, 256)  # as the policy samples
    prompt = len(prompt_ids)
    assert encoded.ids[:prompt] == tuple(prompt_ids)
    first = tiny_tokenizer.encode("3 * 4 = 12 ||", add_special_tokens=False)
    second = tiny_tokenizer.encode("2 + 12 = 15 ||", add_special_tokens=False)
    assert encoded.ids[prompt:] == tuple(first + second)  # each step with its separator, tokenized on its own
    assert encoded.ends == (prompt + len(first) - 1, prompt + len(first) + len(second) - 1) == encoded.read_at
    assert encoded.ends[-1] == len(encoded.ids) - 1 and encoded.steps == 2 and not encoded.prompt_cut


def test_steps_past_the_answer_limit_are_not_read(tiny_tokenizer) -> None:
    row = steps_from_row(ROW, "r")
    first = len(tiny_tokenizer.encode("3 * 4 = 12\n", add_special_tokens=False))
    fits_one = StepFormat("chat", None, 256, first + 2, "\n")
    (one,), metrics = encode_labelled(tiny_tokenizer, [row], fits_one)
    assert len(one.ends) == 1 and one.labels == (True,) and one.steps == 2
    assert metrics == {"data/answers": 1.0, "data/steps": 1.0, "data/steps_truncated": 1.0,
                       "data/prompts_truncated": 0.0, "data/label_rate": 1.0}
    # not even the first step fits: training has nothing to learn from that row, a scorer reads its last token
    too_short = StepFormat("chat", None, 256, first - 1, "\n")
    scored = encode_steps(tiny_tokenizer, row.prompt, row.steps, "r", too_short)
    assert scored.ends == () and scored.read_at == (len(scored.ids) - 1,)
    with pytest.raises(UserError, match=f"^r: its first step, with the separator, is longer than "
                                        f"data.max_answer_tokens={first - 1} tokens"):
        encode_labelled(tiny_tokenizer, [row], too_short)


def test_a_batch_marks_each_step_and_its_label(tiny_tokenizer) -> None:
    rows = [steps_from_row(ROW, "r0"), steps_from_row({**ROW, "completions": ["15"], "labels": [True]}, "r1")]
    encoded, _ = encode_labelled(tiny_tokenizer, rows, FORMAT)
    batch = step_batch(encoded, pad_id=0)
    assert batch.loss_mask_NT.nonzero().tolist() == [[0, encoded[0].ends[0]], [0, encoded[0].ends[1]],
                                                     [1, encoded[1].ends[0]]]
    assert batch.step_labels_NT.nonzero().tolist() == [[0, encoded[0].ends[0]], [1, encoded[1].ends[0]]]
    assert batch.attention_mask_NT.sum(-1).tolist() == [len(e.ids) for e in encoded]
    scored = encode_steps(tiny_tokenizer, rows[0].prompt, split_steps("12\n15", "\n"), "a", FORMAT)
    unlabelled = step_batch([scored], pad_id=0)
    assert unlabelled.step_labels_NT is None and unlabelled.loss_mask_NT.nonzero()[:, 1].tolist() == list(scored.ends)
