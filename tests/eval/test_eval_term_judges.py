"""Any registered text reward term judges the harm suite's answers (`--judges.terms`), reported with a 95% CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_eval_judged import FAST, run_eval_cli

from purplerl.config import load_command_config
from purplerl.config.commands import EVAL
from purplerl.errors import UserError
from purplerl.eval.metrics import summarize
from purplerl.eval.run import validate
from purplerl.rewards.repetition import repetition_ratio


def test_a_reward_term_judges_every_answer(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_eval_cli("--model", tiny_model_dir, "--judges.terms", "{repetition: {ngram: 2}, refusal: {}}",
                        "--out", out, *FAST, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "eval.json").read_text())
    harm = result["targets"]["base"]["harm"]
    rows = [json.loads(line) for line in (out / "generations" / "base.jsonl").read_text().splitlines()]
    # the saved answers judged again with the term's own function give the reported mean
    assert "term/repetition" in harm["metrics"] and "term/refusal" in harm["metrics"]
    expected = sum(repetition_ratio(r["completion"], 2) for r in rows) / len(rows)
    assert harm["metrics"]["term/repetition"]["point"] == pytest.approx(expected)
    low, high = harm["metrics"]["term/repetition"]["low"], harm["metrics"]["term/repetition"]["high"]
    assert low <= expected <= high


def test_term_judges_are_checked_before_any_model_loads() -> None:
    def check(*args: str) -> str:
        with pytest.raises(UserError) as err:
            validate(load_command_config(EVAL, None, ["--model", "m", *args]), announce=lambda _: None)
        return str(err.value)

    assert "unknown reward term 'nope'" in check("--judges.terms", "{nope: {}}")
    assert "response_entropy" in check("--judges.terms", "{response_entropy: {}}")
    assert "ngram" in check("--judges.terms", "{repetition: {ngram: 0}}")
    with pytest.raises(UserError, match="add harm to eval.suites"):
        load_command_config(EVAL, None, ["--judges.terms", "{refusal: {}}", "--suite", "utility"])


def test_term_columns_are_summarized_with_the_rest() -> None:
    rows = [{"refused": 0.0, "term/repetition": v} for v in (0.0, 0.5, 1.0)]
    metrics = summarize(rows)["metrics"]
    assert metrics["term/repetition"]["point"] == pytest.approx(0.5) and "refusal_rate" in metrics
