"""tamper-test's utility numbers measure each side on its own model: the base alone, then the base with the defended
adapter (the trained adapter of tests/conftest.py, which answers every prompt with ADAPTER_WORD; the base does not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import purplerl.experiments.tamper as tamper
from purplerl.runs.policy import resolve_policy
from purplerl.types import PromptRecord, SamplingParams
from tests.experiments.test_tamper_threats import _config


def test_each_side_s_utility_is_measured_on_that_side_s_model(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                                adapter_word_id: int, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "tamper"
    config = _config(tiny_model_dir, trained_adapter_dir, out, "adapter,sft")
    defended = resolve_policy(trained_adapter_dir, config.model, config.data)
    seen: list[tuple[str, float]] = []  # (what measured it, the share of ADAPTER_WORD in its engine's greedy answer)

    def word_share(policy: Any, engine: Any) -> float:
        prompt = policy.render(engine.tokenizer, [PromptRecord(messages=({"role": "user", "content": "2 + 3?"},),
                                                               uid="q")])[0]
        tokens = engine.sample([prompt], 1, SamplingParams(max_new_tokens=6, temperature=0.0))[0][0].tokens
        return sum(t == adapter_word_id for t in tokens) / len(tokens)

    def utility(policy: Any, utility: Any, engine: Any) -> dict[str, float]:
        seen.append(("utility", word_share(policy, engine)))
        return {"point": 0.5, "low": 0.25, "high": 0.75}

    def refusal(policy: Any, engine: Any, count: int, max_new_tokens: int) -> dict[str, float]:
        seen.append(("benign_refusal", word_share(policy, engine)))
        return {"point": 0.0, "low": 0.0, "high": 0.0, "n": count}

    monkeypatch.setattr(tamper, "utility_result", utility)
    monkeypatch.setattr(tamper, "benign_refusal", refusal)
    out.mkdir()
    found = tamper.utility_numbers(out, config, defended)
    # the base side first, without the adapter's word; then the defended side, which answers with nothing else
    assert seen == [("utility", 0.0), ("benign_refusal", 0.0), ("utility", 1.0), ("benign_refusal", 1.0)]
    assert found["adapter"] == str(trained_adapter_dir) and found["kept"]
