"""`purplerl sft --data.streaming true` and `--data.packing true` (with `purplerl prefs`): a streamed run stopped
and resumed trains on exactly the conversations, and to exactly the weights, of one left alone; a packed run trains
on the same examples as an unpacked one, to float precision; their settings are checked in one line. In-process
CLI calls on the tiny random model (the SIGKILL case is tests/train/test_stream_sigkill.py, process tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
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


def test_a_streamed_run_holds_out_conversations_by_their_uid(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = conversations(tmp_path / "chats.jsonl", 16)
    result = sft(tiny_model_dir, data, tmp_path, "held", 2, "--data.streaming", "true", "--sft.eval_fraction",
                 "0.25", "--sft.eval_every", "2")
    assert result.returncode == 0, result.stderr
    rows = metrics(tmp_path / "held")
    assert "eval/loss" in rows[-1] and rows[-1]["data/consumed"] == 8 and rows[-1]["data/step_skipped_too_long"] == 0


def _first_step_bound(model: Path, run: Path, key: str) -> float:
    """fp32's bound on a loss of logprobs computed along two paths, packed rows and one row each: the first step's,
    before any update, and its tokens' logprobs each within logprob_atol of the other path's."""
    from transformers import AutoConfig

    from tests.tolerances import logprob_atol

    row = metrics(run)[0]
    return logprob_atol(torch.float32, AutoConfig.from_pretrained(model), int(row["tokens/padded"]), abs(row[key]) + 12)


def test_a_packed_sft_run_trains_on_the_same_tokens_with_less_padding(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = conversations(tmp_path / "chats.jsonl")
    for name, extra in (("padded", ()), ("packed", ("--data.packing", "true", "--sft.max_tokens", "128"))):
        result = sft(tiny_model_dir, data, tmp_path, name, 3, "--dtype", "float32", *extra)
        assert result.returncode == 0, result.stderr
    padded, packed = metrics(tmp_path / "padded"), metrics(tmp_path / "packed")
    assert [r["tokens/trained"] for r in packed] == [r["tokens/trained"] for r in padded]
    assert all(p["tokens/padded"] <= q["tokens/padded"] for p, q in zip(packed, padded, strict=True))
    bound = _first_step_bound(tiny_model_dir, tmp_path / "padded", "train/nll")
    assert abs(packed[0]["train/nll"] - padded[0]["train/nll"]) <= bound


@pytest.mark.parametrize("loss", ["dpo", "kto"])
def test_a_packed_prefs_run_gives_the_loss_of_the_unpacked_one(tiny_model_dir: Path, tmp_path: Path,
                                                               loss: str) -> None:
    rows = [{"prompt": f"question {i} " + "and more " * (i % 4), "chosen": "thanks " * (1 + i % 3), "rejected": "no"}
            for i in range(8)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, extra in (("padded", ()), ("packed", ("--data.packing", "true"))):
        result = invoke_cli("prefs", "--model", tiny_model_dir, "--data", data, "--batch_size", "4", "--steps", "2",
                            "--prefs.loss", loss, "--prefs.eval_fraction", "0", "--dtype", "float32",
                            "--data.max_prompt_tokens", "32", "--data.max_answer_tokens", "16",
                            "--logging.progress", "false", "--output_dir", tmp_path, "--name", name, *extra)
        assert result.returncode == 0, result.stderr
    padded, packed = metrics(tmp_path / "padded"), metrics(tmp_path / "packed")
    assert [r["tokens/trained"] for r in packed] == [r["tokens/trained"] for r in padded]
    from transformers import AutoConfig

    from tests.tolerances import logprob_atol

    # the loss reads sums of up to 16 answer logprobs: each within fp32's bound of the other path's
    bound = 16 * logprob_atol(torch.float32, AutoConfig.from_pretrained(tiny_model_dir), 48, 12.0)
    assert abs(packed[0]["train/loss"] - padded[0]["train/loss"]) <= bound


@pytest.mark.parametrize(("args", "message"), [
    (["--data.shuffle_buffer", "3"], "shuffle_buffer is read only when data.streaming is true"),
    (["--data.streaming", "true", "--data.shuffle_buffer", "0"], "shuffle_buffer"),
    (["--data.streaming", "true", "--data", "hf:org/chats"], "data.streaming reads a built-in set, a .jsonl or "
                                                             ".parquet file or a dir of <split>.parquet files, not "
                                                             "hf:org/chats"),
    (["--data.packing", "maybe"], "packing"),
    (["--data.packing", "true", "--engine", "tinker"], "recipe sft needs packed rows"),
])
def test_bad_packing_and_streaming_settings_are_one_line(tiny_model_dir: Path, tmp_path: Path, args: list[str],
                                                         message: str) -> None:
    result = invoke_cli("sft", "--model", tiny_model_dir, "--output_dir", tmp_path, *args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not list(tmp_path.glob("sft_*"))
