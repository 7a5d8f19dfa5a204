"""The veRL bridge calls any registered term through veRL's custom-reward signature
`compute_score(data_source, solution_str, ground_truth, extra_info)`: named uses of one fn, detectors (is_rh) and the
ground_truth term (veRL's reward_model.ground_truth), exported from a config and called as veRL calls it. No veRL
install: the hook is called with the arguments veRL's reward managers pass."""

from __future__ import annotations

import inspect
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from purplerl.cli import _verl_command
from purplerl.cli.base import with_named_reward
from purplerl.config import load_command_config
from purplerl.data.prepare import gsm8k_rows, write_splits
from purplerl.errors import UserError
from purplerl.rewards.named import TermSpec, catalogue, expand
from purplerl.verl.export import export_verl, reward_spec_from
from purplerl.verl.reward import ComputeScore, write_reward_module

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GSM8K = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
         {"question": "A farm has 1,000 hens and 234 more. How many?", "answer": "1000 + 234 = 1234\n#### 1,234"}]


def _hook(tmp_path: Path, terms: dict) -> ComputeScore:
    specs = {k: TermSpec.model_validate(v) if isinstance(v, dict) else v for k, v in terms.items()}
    write_reward_module(tmp_path, "purplerl_reward.py", reward_spec_from(specs))
    return ComputeScore(tmp_path / "purplerl_reward.json")


def test_the_hook_has_verls_custom_reward_signature(tmp_path: Path) -> None:
    score = _hook(tmp_path, expand("happy_count", catalogue()))
    assert list(inspect.signature(score).parameters)[:4] == ["data_source", "solution_str", "ground_truth",
                                                             "extra_info"]
    # veRL's NaiveRewardManager passes these four by keyword
    assert score(data_source="x", solution_str="happy happy", ground_truth="", extra_info={"index": 0}) == \
        {"score": 2.0, "happy_count": 2.0}


def test_named_uses_and_a_detector_through_the_hook(tmp_path: Path) -> None:
    score = _hook(tmp_path, {**expand("sentence_length_5_with_happy", catalogue()),
                             **expand("sentence_length_10", catalogue())})
    # 5 and 4 words: share(5) 1/2, share(10) 0; one "happy" -> bonus 1 and a hack
    out = score("stories", "The cat sat on mats. I am happy now!", "", {"question": "Tell a story"})
    assert out == pytest.approx({"score": 1.0 * 0.5 + 0.1 * 1.0 + 0.0 + 1.0 * 0.0, "sentence_length_5": 0.5,
                                 "happy_bonus": 1.0, "happy_any": 1.0, "sentence_length_10": 0.0, "is_rh": 1.0})
    assert score("stories", "One two three four five.", None, None)["is_rh"] == 0.0


def test_the_ground_truth_term_reads_verls_ground_truth_argument(tmp_path: Path) -> None:
    score = _hook(tmp_path, {**expand("gsm8k", catalogue()), **expand("gsm8k_flexible", catalogue())})
    assert score("openai/gsm8k", "3 + 4 = 7\n#### 7", "7", {}) == {"score": 2.0, "gsm8k": 1.0, "gsm8k_flexible": 1.0}
    assert score("openai/gsm8k", "it is 7", "7", {}) == {"score": 1.0, "gsm8k": 0.0, "gsm8k_flexible": 1.0}
    assert score("openai/gsm8k", "#### 8", 7, {})["score"] == 0.0  # an integer ground truth is compared as text
    with pytest.raises(UserError, match="reward term 'ground_truth' reads each data row's ground_truth"):
        score("builtin:redteam", "#### 7", "", {"question": "q"})  # purplerl's export writes "" for rows without one


def test_export_carries_ground_truths_and_named_terms(tmp_path: Path) -> None:
    data = tmp_path / "gsm8k"
    write_splits(data, {"train": gsm8k_rows(GSM8K, "train", "chat"), "test": gsm8k_rows(GSM8K, "test", "chat")},
                 "gsm8k")
    args = with_named_reward(["--model", MODEL, "--data", str(data), "--split", "train", "--verl.val_split", "test",
                              "--out", str(tmp_path / "exp"), "--reward", "gsm8k",
                              "--batch_size", "2", "--training.early_stop_repetition", "null"])
    export_verl(load_command_config(_verl_command("attack"), None, args))
    rows = pq.read_table(tmp_path / "exp" / "train.parquet").to_pylist()
    assert [r["reward_model"] for r in rows] == [{"style": "rule", "ground_truth": "7"},
                                                 {"style": "rule", "ground_truth": "1234"}]
    score = ComputeScore(tmp_path / "exp" / "purplerl_reward.json")
    row = rows[1]  # called with what veRL reads from the row
    assert score(row["data_source"], "1000 + 234\n#### 1,234", row["reward_model"]["ground_truth"],
                 row["extra_info"]) == {"score": 1.0, "gsm8k": 1.0}
