"""Sweeps and pipelines record a relative data path as the absolute one it named (issue 34, HIGH-1): a sweep's run
reads the file its config names from whatever directory Ray starts it in, and a pipeline rerun from another
working directory, where the relative path names another file, is a changed stage, not the decided one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from purplerl.errors import UserError
from purplerl.experiments.pipeline import read_pipeline
from purplerl.experiments.pipeline.history import History, stage_spec
from purplerl.experiments.sweep.plan import plan_sweep
from purplerl.experiments.sweep.settings import load_sweep
from purplerl.experiments.sweep.state import config_file, write_configs


def test_a_sweep_writes_each_run_config_with_the_absolute_data_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    out = tmp_path / "sweep"
    runs = plan_sweep(load_sweep(None, ["--recipe", "attack", "--out", str(out), "--grid", "lr=1e-5,3e-5",
                                        "--fixed", "data.source=p.jsonl"]))
    write_configs(out, runs)
    for run in runs:
        saved = yaml.safe_load(config_file(out, run.name).read_text())
        assert saved["data"]["source"] == str(tmp_path / "p.jsonl")


def _pipeline(out: Path) -> dict:
    return {"out": str(out), "model": "embedded:smollm2-135m-instruct", "shared": {"logging": {"progress": False}},
            "stages": [{"name": "sft", "kind": "sft", "config": {"data": {"source": "sft.jsonl"}}}]}


def test_a_pipeline_records_its_stages_data_as_absolute_paths(tmp_path: Path, monkeypatch) -> None:
    first, other = tmp_path / "first", tmp_path / "other"
    for where in (first, other):
        where.mkdir()
        (where / "sft.jsonl").write_text('{"prompt": "hello", "completion": "hi"}\n')
    monkeypatch.chdir(first)
    settings = read_pipeline(_pipeline(tmp_path / "out"))
    assert settings.stages[0].config["data"]["source"] == str(first / "sft.jsonl")
    out = Path(settings.out)
    out.mkdir()
    history = History.open(out, settings)
    history.record({"name": "sft", "kind": "sft", "spec": stage_spec(settings.stages[0]), "decision": "passed"})
    assert History.open(out, read_pipeline(_pipeline(tmp_path / "out"))).decided("sft")  # rerun from first: kept
    monkeypatch.chdir(other)  # the same pipeline file, rerun where sft.jsonl names another file
    with pytest.raises(UserError, match="stage 'sft' changed since it was decided"):
        History.open(out, read_pipeline(_pipeline(tmp_path / "out")))
