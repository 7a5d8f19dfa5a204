"""A resume checks the data's content, not only the data settings (issue 34, HIGH-1): a data file edited between
two segments, or a relative --data resumed from another working directory holding another file of that name, is
refused in one line naming the file and both hashes and leaves the run alone; unchanged data resumes as before,
exactly. In-process CLI calls on the tiny random model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import invoke_cli

ATTACK = ["--batch_size", "2", "--group_size", "2", "--max_new_tokens", "6", "--seed", "3", "--save_every", "2"]
PREFS = ["--model.lora_targets", "q_proj,v_proj", "--batch_size", "2", "--save_every", "2",
         "--prefs.eval_fraction", "0"]
SFT = ["--batch_size", "2", "--save_every", "2", "--sft.eval_fraction", "0"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def rows(recipe: str, word: str) -> list[dict]:
    """Rows each recipe reads: prompts (attack), conversations (sft), pairs (prefs)."""
    texts = [f"{word} number {i}." for i in range(4)]
    if recipe == "prefs":
        return [{"prompt": t, "chosen": "thanks again", "rejected": "go away"} for t in texts]
    if recipe == "sft":
        return [{"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "ok then"}]}
                for t in texts]
    return [{"prompt": t} for t in texts]


def write(path: Path, recipe: str, word: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(recipe, word)))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def start(recipe: str, model: Path, data: str | Path, out: Path, name: str, steps: int = 2):
    extra = {"attack": ATTACK, "prefs": PREFS, "sft": SFT}[recipe]
    return invoke_cli(recipe, "--model", model, *extra, "--steps", str(steps), "--logging.progress", "false",
                      "--data", data, "--output_dir", out, "--name", name)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("step ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def metrics(run_dir: Path) -> list[dict]:
    """The logged steps without their timings."""
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["attack", "sft", "prefs"])
def test_a_data_file_edited_between_segments_is_refused_in_one_line(recipe: str, tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    data = write(tmp_path / "data.jsonl", recipe, "Insult")
    assert start(recipe, tiny_model_dir, data, tmp_path, "r").returncode == 0
    run, before, old = tmp_path / "r", snapshot(tmp_path / "r"), sha256(data)
    write(data, recipe, "Praise")  # edited in place: every setting is the same
    line = one_error_line(invoke_cli(recipe, "--resume", run, "--steps", "4"))
    assert line == (f"error: {data} changed since the run read it (sha256 {old} -> {sha256(data)}): resuming "
                    "would continue the run on other data; restore it, or start a new run with --name NEW")
    assert snapshot(run) == before
    write(data, recipe, "Insult")  # restored: the same bytes resume
    assert invoke_cli(recipe, "--resume", run, "--steps", "4").returncode == 0
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert [row["data"]["data.source"]["sha256"] for row in history] == [old, old]


def test_a_relative_path_is_the_file_it_named_when_the_run_started(tiny_model_dir: Path, tmp_path: Path,
                                                                    monkeypatch) -> None:
    first, other = tmp_path / "first", tmp_path / "other"
    data = write(first / "prompts.jsonl", "attack", "Insult")
    elsewhere = write(other / "prompts.jsonl", "attack", "Praise")  # another file of the same name
    monkeypatch.chdir(first)
    assert start("attack", tiny_model_dir, "prompts.jsonl", tmp_path, "r").returncode == 0
    run = tmp_path / "r"
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["source"] == str(data)
    before = snapshot(run)
    monkeypatch.chdir(other)
    line = one_error_line(invoke_cli("attack", "--resume", run, "--steps", "4", "--data", "prompts.jsonl"))
    assert line.startswith(f"error: --data.source cannot change when resuming ('{data}' -> '{elsewhere}')")
    assert snapshot(run) == before
    assert invoke_cli("attack", "--resume", run, "--steps", "4").returncode == 0  # reads first/prompts.jsonl
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert {row["data"]["data.source"]["path"] for row in history} == {str(data)}


def test_unchanged_data_resumes_exactly_as_before(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "prompts.jsonl", "attack", "Insult")
    assert start("attack", tiny_model_dir, data, tmp_path, "whole", steps=4).returncode == 0
    assert start("attack", tiny_model_dir, data, tmp_path, "part", steps=2).returncode == 0
    resumed = invoke_cli("attack", "--resume", tmp_path / "part", "--steps", "4")
    assert resumed.returncode == 0 and "note:" not in resumed.stderr, resumed.stderr
    assert metrics(tmp_path / "part") == metrics(tmp_path / "whole")


def test_a_run_of_an_older_purplerl_is_checked_from_its_next_segment_on(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = write(tmp_path / "prompts.jsonl", "attack", "Insult")
    assert start("attack", tiny_model_dir, data, tmp_path, "r").returncode == 0
    history = tmp_path / "r" / "config_history.jsonl"
    old_rows = [{k: v for k, v in json.loads(line).items() if k != "data"} for line in history.read_text().splitlines()]
    history.write_text("".join(json.dumps(row) + "\n" for row in old_rows))  # as an older purplerl wrote it
    resumed = invoke_cli("attack", "--resume", tmp_path / "r", "--steps", "3")
    assert resumed.returncode == 0
    assert [line for line in resumed.stderr.splitlines() if line.startswith("note:")] == [
        f"note: {history} records no data content (an older purplerl): its data cannot be checked now; this "
        "segment records it for later resumes"]
    write(data, "attack", "Praise")
    assert "changed since the run read it" in one_error_line(invoke_cli("attack", "--resume", tmp_path / "r",
                                                                        "--steps", "4"))
