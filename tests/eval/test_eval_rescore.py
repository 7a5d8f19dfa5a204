"""`purplerl eval --rewards`: named rewards and registered terms score fresh answers and a run's logged samples,
each part of a combined reward with a CI (purplerl.eval.rescore), by hand; then in a real eval on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purplerl.config import EVAL, load_command_config
from purplerl.errors import UserError
from purplerl.eval.rescore import check_ground_truths, load_rewards, per_sample, rescore, rescore_logged
from purplerl.types import PromptRecord

# sentence lengths 5 and 4 (share 1/2), one "happy"; 7 words and six "happy" (share 0, bonus capped at 5)
ROWS = [{"prompt": "p", "completion": "The cat sat on mats. I am happy now!"},
        {"prompt": "p", "completion": "Happy happy happy happy happy happy day."}]


def test_a_combination_is_taken_apart_by_hand() -> None:
    rewards = load_rewards(["sentence_length_5_with_happy", "happy_count"])
    values = per_sample(ROWS, rewards)
    assert values == {
        "sentence_length_5_with_happy": pytest.approx([0.5 + 0.1, 0.0 + 0.5]),  # 1 x share + 0.1 x bonus
        "sentence_length_5_with_happy/sentence_length_5": [0.5, 0.0],
        "sentence_length_5_with_happy/happy_bonus": [1.0, 5.0],
        "sentence_length_5_with_happy/happy_any": [1.0, 1.0],
        "sentence_length_5_with_happy/rh_rate": [1.0, 1.0],
        "happy_count": [1.0, 6.0],  # uncapped
    }
    out = rescore(ROWS, rewards)
    assert out["n"] == 2
    ci = out["metrics"]["happy_count"]
    assert ci["point"] == 3.5 and 1.0 <= ci["low"] <= ci["point"] <= ci["high"] <= 6.0


def _run(tmp_path: Path, save_every: int = 2) -> Path:
    run = tmp_path / "attack_run"
    (run / "checkpoints" / "step_000004").mkdir(parents=True)
    (run / "config.yaml").write_text(f"recipe: attack\nrun: {{save_every: {save_every}}}\n")
    rows = [{"step": step, "prompt": "p", "completion": text}
            for step, text in [(1, "One two three four five."), (2, "no sentence end"), (3, "happy"),
                               (3, "Five words are here now."), (4, "happy happy"), (5, "happy")]]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run / "checkpoints" / "step_000004"


def test_a_checkpoints_logged_samples_of_its_save_interval(tmp_path: Path) -> None:
    out = rescore_logged(_run(tmp_path), load_rewards(["happy_count", "sentence_length_5"]))
    assert out["steps"] == [3, 4] and out["n"] == 3  # steps 3 and 4; step 5 came after the checkpoint
    assert out["metrics"]["happy_count"]["point"] == pytest.approx((1 + 0 + 2) / 3)
    assert out["metrics"]["sentence_length_5"]["point"] == pytest.approx(1 / 3)
    # "no sentence end" is one sentence of 3 words; step 3's mean is over its two rows
    assert out["by_step"] == {"1": {"happy_count": 0.0, "sentence_length_5": 1.0},
                              "2": {"happy_count": 0.0, "sentence_length_5": 0.0},
                              "3": {"happy_count": 0.5, "sentence_length_5": 0.5},
                              "4": {"happy_count": 2.0, "sentence_length_5": 0.0}}
    assert rescore_logged(tmp_path / "elsewhere" / "step_000004", load_rewards(["happy_count"])) is None


def test_terms_that_need_more_than_saved_text_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="eval.rewards: 'response_entropy' term 'response_entropy' reads the policy's "
                                        "per-token entropies"):
        load_rewards(["response_entropy"])
    with pytest.raises(UserError, match="unknown reward 'nope'"):
        load_rewards(["nope"])
    gsm8k = load_rewards(["gsm8k"])
    with pytest.raises(UserError, match="eval.rewards: 'gsm8k' reads each data row's ground_truth .* and 1 of the 2 "
                                        "prompts of data.source x have none"):
        check_ground_truths(gsm8k, [PromptRecord(({"role": "user", "content": "q"},), ground_truth="4"),
                                    PromptRecord(({"role": "user", "content": "q"},))], "data.source x")
    rows = [{"prompt": "q", "completion": "#### 4", "ground_truth": "4"}]
    assert rescore(rows, gsm8k)["metrics"]["gsm8k"]["point"] == 1.0


def test_eval_settings_take_a_comma_list_once_each() -> None:
    cfg = load_command_config(EVAL, None, ["--rewards", "happy_count,sentence_length_5"])
    assert cfg.eval.rewards == ["happy_count", "sentence_length_5"] and cfg.eval.rewards_file is None
    with pytest.raises(UserError, match="repeats a reward"):
        load_command_config(EVAL, None, ["--rewards", "happy_count,happy_count"])
    with pytest.raises(UserError, match="rewards_file is read only when eval.rewards is set"):
        load_command_config(EVAL, None, ["--rewards_file", "x.yaml"])


def test_eval_reports_each_named_reward_for_every_target(tiny_model_dir: Path, tmp_path: Path) -> None:
    from purplerl.eval.run import eval_table, run_eval

    cfg = load_command_config(EVAL, None, [
        "--model", str(tiny_model_dir), "--device", "cpu", "--limit", "3", "--n", "2", "--max-new-tokens", "6",
        "--suite", "diversity", "--rewards", "sentence_length_5_with_happy,happy_count", "--out", str(tmp_path)])
    result = run_eval(cfg, announce=lambda line: None)
    found = result["targets"]["base"]["rewards"]
    assert found["n"] == 6
    assert set(found["metrics"]) == {"sentence_length_5_with_happy", "sentence_length_5_with_happy/sentence_length_5",
                                     "sentence_length_5_with_happy/happy_bonus",
                                     "sentence_length_5_with_happy/happy_any",
                                     "sentence_length_5_with_happy/rh_rate", "happy_count"}
    texts = [s["completion"] for s in result["samples"]]
    assert found["metrics"]["happy_count"]["point"] == pytest.approx(
        sum(per_sample([{"prompt": "", "completion": t}], load_rewards(["happy_count"]))["happy_count"][0]
            for t in texts) / len(texts))
    assert "happy_count" in eval_table(result)
    assert result["config"]["eval"]["rewards"] == ["sentence_length_5_with_happy", "happy_count"]
    assert result["config"]["rewards"]["happy_count"] == {"happy_count": {
        "fn": "keyword_count", "weight": 1.0, "hack_at": None,
        "params": {"words": ["happy"], "whole_word": True, "case_sensitive": False, "max_count": None}}}
