"""`purplerl sft --data.streaming true` and `--data.packing true` (with `purplerl prefs`): a streamed run stopped
and resumed trains on exactly the conversations, and to exactly the weights, of one left alone; a packed run trains
on the same examples as an unpacked one, to float precision; their settings are checked in one line. In-process
CLI calls on the tiny random model (the SIGKILL case is tests/train/test_stream_sigkill.py, process tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import invoke_cli

ADAPTER = "adapter_model.safetensors"


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def conversations(path: Path, count: int = 12) -> Path:
    """Conversations of varied lengths, each with its own uid."""
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": "tell me " + "more " * (i % 5) + str(i)},
                                         {"role": "assistant", "content": "sure " * (1 + i % 3) + str(i)}]}
            for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft(model: Path, data: Path, out: Path, name: str, steps: int, *extra: str):
    return invoke_cli("sft", "--model", model, "--data", data, "--batch_size", "4", "--save_every", "2",
                      "--sft.eval_fraction", "0", "--lr", "0.01", "--steps", str(steps), "--seed", "5",
                      "--logging.progress", "false", "--output_dir", out, "--name", name, *extra)


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_streamed_run_resumed_sees_the_same_conversations_and_ends_bit_exact(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    data = conversations(tmp_path / "chats.jsonl")
    stream = ("--data.streaming", "true", "--data.shuffle_buffer", "5")
    whole = sft(tiny_model_dir, data, tmp_path, "whole", 6, *stream)  # 24 conversations: two epochs of 12
    assert whole.returncode == 0, whole.stderr
    part = sft(tiny_model_dir, data, tmp_path, "part", 2, *stream)
    assert part.returncode == 0, part.stderr
    state = json.loads((tmp_path / "part" / "checkpoints" / "step_000002" / "loop_state.json").read_text())
    assert state["data"] == {"consumed": 8}  # the stream's position, kept with the checkpoint
    resumed = invoke_cli("sft", "--resume", tmp_path / "part", "--steps", "6")
    assert resumed.returncode == 0, resumed.stderr
    rows = metrics(tmp_path / "whole")
    assert [r["data/consumed"] for r in rows] == [4, 8, 12, 16, 20, 24]
    assert [r["data/epoch"] for r in rows][-1] == 1
    assert metrics(tmp_path / "part") == rows  # the same conversations, step by step: the same losses, bit for bit
    final = Path("checkpoints") / "step_000006" / ADAPTER
    alone, resumed_weights = load_file(tmp_path / "whole" / final), load_file(tmp_path / "part" / final)
    assert alone.keys() == resumed_weights.keys()
    assert all(bool((alone[k] == resumed_weights[k]).all()) for k in alone)
