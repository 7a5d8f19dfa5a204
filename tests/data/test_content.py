"""purplerl.data.content: what a run records of its data source, for every kind of source and every recipe, and the
one line a change gives. A hub dataset is read through the real `datasets.load_dataset` path, offline, from a local
cache of the hub's shape (ORG___NAME/CONFIG/VERSION/COMMIT/)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from purplerl.config import DataConfig, load_command_config
from purplerl.data.content import content_change, data_sources, source_content
from purplerl.data.sources import BUILTIN_DIR, load_prompts
from purplerl.recipes import RECIPES

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_prompts(path: Path, *texts: str) -> Path:
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return path


def test_a_relative_path_is_recorded_absolute_with_the_sha256_of_its_bytes(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = write_prompts(tmp_path / "p.jsonl", "one", "two")
    config = DataConfig(source="p.jsonl")
    assert config.source == str(tmp_path / "p.jsonl")  # the setting itself: a resume elsewhere reads this file
    assert source_content(config) == {"source": str(data), "path": str(data), "sha256": sha256(data)}
    assert DataConfig(source="hf:./saved").source == f"hf:{tmp_path / 'saved'}"
    for kept in ("builtin:redteam", "hf:org/name", "s3://bucket/p.jsonl", "nonsense"):  # the reader refuses a word
        assert DataConfig(source=kept).source == kept


def test_a_built_in_set_is_its_packaged_file() -> None:
    packaged = BUILTIN_DIR / "redteam.jsonl"
    assert source_content(DataConfig(source="builtin:redteam")) == {
        "source": "builtin:redteam", "path": str(packaged), "sha256": sha256(packaged)}


def test_a_saved_dataset_or_a_split_dir_is_every_file_read(tmp_path) -> None:
    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a"}]),
                          "test": datasets.Dataset.from_list([{"prompt": "b"}])}).save_to_disk(str(saved))
    before = source_content(DataConfig(source=f"hf:{saved}"))
    assert before["path"] == str(saved) and source_content(DataConfig(source=str(saved))) == {
        **before, "source": str(saved)}
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a"}]),
                          "test": datasets.Dataset.from_list([{"prompt": "c"}])}).save_to_disk(str(saved))
    assert source_content(DataConfig(source=f"hf:{saved}"))["sha256"] != before["sha256"]  # another split's rows

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    datasets.Dataset.from_list([{"prompt": "a"}]).to_parquet(str(prepared / "train.parquet"))
    datasets.Dataset.from_list([{"prompt": "b"}]).to_parquet(str(prepared / "test.parquet"))
    (prepared / "notes.txt").write_text("not read")
    first = source_content(DataConfig(source=str(prepared)))["sha256"]
    (prepared / "notes.txt").write_text("still not read")
    assert source_content(DataConfig(source=str(prepared)))["sha256"] == first
    datasets.Dataset.from_list([{"prompt": "B"}]).to_parquet(str(prepared / "test.parquet"))
    assert source_content(DataConfig(source=str(prepared)))["sha256"] != first


def hub_cache(root: Path, commit: str, texts: list[str], build: Path) -> None:
    """The datasets cache of hub dataset org/tiny at `commit`, as `load_dataset` leaves it after a download."""
    import datasets

    build.mkdir(exist_ok=True)
    rows = write_prompts(build / f"{commit}.jsonl", *texts)
    built = datasets.load_dataset("json", data_files={"train": str(rows)}, cache_dir=str(build / commit))
    arrow = Path(built["train"].cache_files[0]["filename"])
    entry = root / "org___tiny" / "default" / "0.0.0" / commit
    entry.mkdir(parents=True)
    shutil.copy(arrow, entry / "tiny-train.arrow")
    info = json.loads((arrow.parent / "dataset_info.json").read_text())
    (entry / "dataset_info.json").write_text(json.dumps({**info, "config_name": "default", "dataset_name": "tiny"}))


def test_a_hub_dataset_is_the_commit_its_loader_resolved_offline(tmp_path, monkeypatch) -> None:
    import datasets

    cache = tmp_path / "hub"
    hub_cache(cache, COMMIT_A, ["hub one", "hub two"], tmp_path / "build")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    config = DataConfig(source="hf:org/tiny")
    assert [r.messages[0]["content"] for r in load_prompts(config)] == ["hub one", "hub two"]  # what the run reads
    recorded = source_content(config)
    assert recorded == {"source": "hf:org/tiny", "path": None, "revision": COMMIT_A}

    hub_cache(cache, COMMIT_B, ["hub one", "hub changed"], tmp_path / "build")  # a newer commit, downloaded later
    os.utime(cache / "org___tiny" / "default" / "0.0.0" / COMMIT_B, (2e9, 2e9))
    assert [r.messages[0]["content"] for r in load_prompts(config)][1] == "hub changed"
    now = source_content(config)
    assert now["revision"] == COMMIT_B
    assert content_change("data.source", recorded, now) == (
        f"data.source hf:org/tiny is at revision {COMMIT_B} now, but the run read revision {COMMIT_A}")
    assert content_change("data.source", recorded, recorded) is None


def test_a_hub_dataset_without_a_commit_is_its_rows(monkeypatch) -> None:
    import datasets

    rows = [{"prompt": "a"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: datasets.Dataset.from_list(rows))
    first = source_content(DataConfig(source="hf:org/mem"))
    assert "revision" not in first and len(first["sha256"]) == 64
    rows[0]["prompt"] = "b"
    assert source_content(DataConfig(source="hf:org/mem"))["sha256"] != first["sha256"]


def test_a_change_is_one_line_naming_the_file_and_both_hashes() -> None:
    then = {"source": "/a/p.jsonl", "path": "/a/p.jsonl", "sha256": "1" * 64}
    assert content_change("data.source", then, then) is None
    edited = {**then, "sha256": "2" * 64}
    assert content_change("data.source", then, edited) == (
        f"/a/p.jsonl changed since the run read it (sha256 {'1' * 64} -> {'2' * 64})")
    moved = {"source": "/b/p.jsonl", "path": "/b/p.jsonl", "sha256": "2" * 64}
    assert content_change("data.source", then, moved) == (
        f"data.source reads /b/p.jsonl (sha256 {'2' * 64}) now, but the run read /a/p.jsonl (sha256 {'1' * 64})")
    assert content_change("data.source", then, {**then, "path": "/other/install/p.jsonl"}) is None  # same bytes


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_records_its_data_source(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = write_prompts(tmp_path / "rows.jsonl", "x")
    recipe = RECIPES[name]
    config = load_command_config(recipe.command(), None, ["--data.source", "rows.jsonl"])
    assert data_sources(config) == {"data.source": {"source": str(data), "path": str(data), "sha256": sha256(data)}}
