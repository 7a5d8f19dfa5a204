"""A streamed SFT run (`--data.streaming true`) SIGKILLed mid-way and resumed with `purplerl sft --resume` trains on
exactly the conversations of the same run left alone, step by step, and ends with bit-identical weights: the stream's
position kept in each checkpoint puts the resumed run at the exact next conversation (the attack's resume test,
tests/test_resume.py, for a stream)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.test_resume import cli_env, kill_mid_run, read_jsonl

pytestmark = pytest.mark.process

STEPS = 12
FINAL = f"step_{STEPS:06d}"


def sft_cmd(model_dir: Path, data: Path, output_dir: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "purplerl.cli", "sft", "--model", str(model_dir), "--data", str(data),
            "--data.streaming", "true", "--data.shuffle_buffer", "4", "--batch_size", "2", "--steps", str(STEPS),
            "--save_every", "2", "--sft.eval_fraction", "0", "--lr", "0.01", "--seed", "3", "--output_dir",
            str(output_dir), "--name", name, "--logging.progress", "false"]


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Run A uninterrupted; run B killed after a checkpoint, then resumed. Both start together."""
    env = cli_env(tmp_path_factory.mktemp("purplerl_cache"))
    out = tmp_path_factory.mktemp("stream_runs")
    data = out / "chats.jsonl"  # 10 conversations: 24 steps of 2 run over them 2.4 times, in a new order each epoch
    data.write_text("".join(json.dumps({"id": f"c{i}", "messages": [
        {"role": "user", "content": "say " + "more " * (i % 4) + str(i)},
        {"role": "assistant", "content": "ok " * (1 + i % 3) + str(i)}]}) + "\n" for i in range(10)))
    run_a, run_b = out / "a", out / "b"
    proc_a = subprocess.Popen(sft_cmd(tiny_model_dir, data, out, "a"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    proc_b = subprocess.Popen(sft_cmd(tiny_model_dir, data, out, "b"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        kill_mid_run(proc_b, run_b)
        killed_at = sorted(p.name for p in (run_b / "checkpoints").iterdir())
        resumed = subprocess.run([sys.executable, "-m", "purplerl.cli", "sft", "--resume", str(run_b)], env=env,
                                 capture_output=True, text=True, timeout=300)
        _, err_a = proc_a.communicate(timeout=300)
    finally:
        for proc in (proc_a, proc_b):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc_a.returncode == 0, err_a
    assert resumed.returncode == 0, resumed.stderr
    return {"a": run_a, "b": run_b, "killed_at": killed_at}


def test_the_kill_left_work_to_do(runs) -> None:
    assert FINAL not in runs["killed_at"]
    summary = json.loads((runs["b"] / "summary.json").read_text())
    assert summary["resumed_from"] and summary["last_step"] == STEPS


def test_the_resumed_run_saw_the_same_conversations_step_by_step(runs) -> None:
    """Each step's position and loss, bit for bit: the loss of a step is a function of the conversations it took."""
    def rows(run: Path) -> list[dict]:
        logged = read_jsonl(run / "metrics.jsonl")
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in logged]

    whole, resumed = rows(runs["a"]), rows(runs["b"])
    assert [r["data/consumed"] for r in whole] == [2.0 * step for step in range(1, STEPS + 1)]
    assert resumed == whole


def test_the_resumed_weights_are_bit_identical(runs) -> None:
    final = Path("checkpoints") / FINAL
    a, b = (load_file(str(runs[r] / final / "adapter_model.safetensors")) for r in ("a", "b"))
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[name], b[name]) for name in a)
    states = [json.loads((runs[r] / final / "loop_state.json").read_text()) for r in ("a", "b")]
    assert states[0]["data"] == states[1]["data"] == {"consumed": 2 * STEPS}
