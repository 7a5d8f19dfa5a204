"""examples/minimal_grpo.py, the single-file GRPO loop, run in this process on a tiny random model: it trains the
LoRA adapter through the public engine seam, prints one line per step, leaves the adapter alone at lr 0, stops on a
non-finite loss, and its written-out advantage is the registered GRPO estimator."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from purplerl.algorithms.advantages import grpo_advantages
from purplerl.errors import ExperimentError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "minimal_grpo.py"
LINE = re.compile(r"^step +(\d+)  reward (\S+)  toxicity (\S+)  loss (\S+)  kl (\S+)$")


def load_example() -> ModuleType:
    """The example as a module (examples/ is no package: it is loaded from its path, as `python FILE` would)."""
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop("minimal_grpo", None)
    spec.loader.exec_module(module)
    return module


def lora_weights(engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in engine.model.named_parameters() if "lora_" in n}


def run_example(monkeypatch: pytest.MonkeyPatch, *argv: str):
    """Run the example's main on `argv`; return (the adapter's weights at the start, the trained engine)."""
    example = load_example()
    make_engine = example.make_engine
    start: list[dict[str, torch.Tensor]] = []

    def recording(*args, **kwargs):
        engine = make_engine(*args, **kwargs)
        start.append(lora_weights(engine))
        return engine

    monkeypatch.setattr(example, "make_engine", recording)
    engine = example.main(list(argv))
    assert len(start) == 1
    return start[0], engine


def run(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, *extra: str):
    """Three steps of the example on the tiny model."""
    return run_example(monkeypatch, "--model", str(tiny_model_dir), "--steps", "3", "--batch", "2", "--group", "4",
                       "--max-new-tokens", "8", "--seed", "0", *extra)


def parsed(out: str) -> list[tuple[int, float, float, float, float]]:
    rows = []
    for line in out.splitlines():
        match = LINE.match(line)
        assert match, f"not a step line: {line!r}"
        rows.append((int(match[1]), *(float(v) for v in match.groups()[1:])))
    return rows


def test_the_loop_trains_the_adapter_and_prints_one_finite_line_per_step(tiny_model_dir, monkeypatch, capsys):
    start, engine = run(tiny_model_dir, monkeypatch, "--lr", "1e-2")
    rows = parsed(capsys.readouterr().out)
    assert [row[0] for row in rows] == [1, 2, 3]
    assert all(math.isfinite(v) for row in rows for v in row[1:]), rows
    assert all(0.0 <= row[2] <= 1.0 for row in rows), "toxicity is a probability"
    trained = lora_weights(engine)
    assert trained.keys() == start.keys() and trained
    assert any(not torch.equal(trained[n], start[n]) for n in start), "three steps at lr 1e-2 left the adapter as is"
    assert rows[0][4] == 0.0 and any(row[4] > 0 for row in rows[1:]), "the policy moved no distance from its base"


def test_at_lr_zero_the_adapter_stays_where_it_started(tiny_model_dir, monkeypatch, capsys):
    start, engine = run(tiny_model_dir, monkeypatch, "--lr", "0")
    rows = parsed(capsys.readouterr().out)
    assert [row[0] for row in rows] == [1, 2, 3]
    trained = lora_weights(engine)
    assert all(torch.equal(trained[n], start[n]) for n in start)
    assert all(row[4] == 0.0 for row in rows), "at lr 0 the policy is its base: no KL"


def test_a_non_finite_loss_stops_the_loop_at_its_step(tiny_model_dir, monkeypatch, capsys):
    example = load_example()
    make_engine = example.make_engine

    def broken(*args, **kwargs):
        engine = make_engine(*args, **kwargs)
        train = engine.forward_backward
        calls = []

        def forward_backward(batch, loss):
            metrics = train(batch, loss)
            calls.append(1)
            return {**metrics, "loss": float("nan")} if len(calls) == 2 else metrics

        monkeypatch.setattr(engine, "forward_backward", forward_backward)
        return engine

    monkeypatch.setattr(example, "make_engine", broken)
    with pytest.raises(ExperimentError, match=r"^step 2: non-finite loss nan"):
        example.main(["--model", str(tiny_model_dir), "--steps", "3", "--batch", "2", "--group", "2",
                      "--max-new-tokens", "4"])
    assert [row[0] for row in parsed(capsys.readouterr().out)] == [1]


@pytest.mark.parametrize("rewards", [[[0.1, 0.9, 0.4, 0.4], [0.3, 0.3, 0.3, 0.3]], [[1.0, 0.0], [0.25, 0.75]]])
def test_the_written_out_advantage_is_the_registered_grpo_estimator(rewards):
    rewards_BG = torch.tensor(rewards)
    registered_BG, _ = grpo_advantages(rewards_BG, scale_by_std=True)
    assert torch.equal(load_example().group_advantages(rewards_BG), registered_BG)


def test_a_group_of_one_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        load_example().parse_args(["--group", "1"])
    assert "--group must be >= 2" in capsys.readouterr().err


def test_the_example_stays_a_single_page():
    assert len(EXAMPLE.read_text().splitlines()) <= 150  # issue 35: a reader sees the whole algorithm at once
