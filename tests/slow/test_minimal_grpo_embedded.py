"""examples/minimal_grpo.py on its default model, the embedded SmolLM2-135M-Instruct (make test-slow): two small
steps at its default learning rate train the adapter and print finite lines."""

from __future__ import annotations

import math

import pytest
import torch
from test_minimal_grpo import lora_weights, parsed, run_example

pytestmark = pytest.mark.slow


def test_minimal_grpo_trains_the_embedded_model(monkeypatch, capsys):
    start, engine = run_example(monkeypatch, "--steps", "2", "--batch", "2", "--group", "2", "--max-new-tokens", "12")
    rows = parsed(capsys.readouterr().out)
    assert [row[0] for row in rows] == [1, 2]
    assert all(math.isfinite(v) for row in rows for v in row[1:]), rows
    assert all(0.0 <= row[2] <= 1.0 for row in rows), "toxicity is a probability"
    trained = lora_weights(engine)
    assert any(not torch.equal(trained[n], start[n]) for n in start), "two steps left the adapter as it started"
