"""A row's ground truth reaches PromptRecord.ground_truth: veRL's reward_model.ground_truth (as `purplerl data prepare
gsm8k` writes it) or a plain ground_truth column; an RL recipe whose reward reads it refuses data without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purplerl.config import DataConfig
from purplerl.data import load_prompts
from purplerl.data.prepare import gsm8k_rows, write_splits
from purplerl.errors import UserError
from purplerl.recipes.attack import ATTACK
from purplerl.train.rl import check_ground_truths

GSM8K = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
         {"question": "A farm has 1,000 hens and 234 more. How many?", "answer": "1000 + 234 = 1234\n#### 1,234"}]


def test_prepared_gsm8k_rows_carry_their_final_number(tmp_path: Path) -> None:
    write_splits(tmp_path, {"train": gsm8k_rows(GSM8K, "train", "chat"), "test": gsm8k_rows(GSM8K, "test", "chat")},
                 "gsm8k")
    records = load_prompts(DataConfig(source=str(tmp_path)))
    assert [r.ground_truth for r in records] == ["7", "1234"]


def test_a_plain_ground_truth_column_text_or_integer(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "2+2?", "ground_truth": 4}, {"prompt": "3+3?", "ground_truth": "6"}, {"prompt": "hi"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r.ground_truth for r in load_prompts(DataConfig(source=str(path)))] == ["4", "6", None]


@pytest.mark.parametrize("bad", [4.5, True, [1, 2], {"a": 1}])
def test_a_ground_truth_of_another_type_is_refused(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "2+2?", "ground_truth": bad}) + "\n")
    with pytest.raises(UserError, match=r"rows.jsonl: row 0: ground_truth must be text or an integer"):
        load_prompts(DataConfig(source=str(path)))


def test_a_reward_reading_ground_truths_refuses_data_without_them(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "2+2?", "ground_truth": "4"}) + "\n" + json.dumps({"prompt": "hi"}) + "\n")
    records = load_prompts(DataConfig(source=str(path)))
    cfg = ATTACK.build({"data": {"source": str(path)}, "reward": {"terms": {"gsm8k": 1.0}}})
    with pytest.raises(UserError) as err:
        check_ground_truths(cfg, records)
    assert str(err.value).startswith("reward term 'gsm8k' reads each data row's ground_truth") and \
        "1 of the 2 prompts of data.source" in str(err.value) and "(first: uid '1')" in str(err.value)
    check_ground_truths(cfg, records[:1])  # every row has one: nothing to refuse
    check_ground_truths(ATTACK.build({}), records)  # the attack's default reward reads none
