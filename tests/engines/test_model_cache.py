"""Cached models are sealed with a manifest and checked when loaded: a truncated or zeroed weights file is one
error, the damaged entry is removed and rebuilt on the next use, an intact entry is hashed once per process, and a
process that waits for another's build says so."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from purplerl.engines import loading, model_cache
from purplerl.engines.loading import load_causal_lm, register_derived_model, resolve_model_path
from purplerl.engines.model_cache import MANIFEST, build_lock, seal_entry
from purplerl.errors import ExperimentError

NAME = "tiny-cached"
WEIGHTS = "model.safetensors"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "_VERIFIED", set())
    return tmp_path / "cache"


@pytest.fixture
def builds(cache: Path, tiny_model_dir: Path, monkeypatch) -> list[Path]:
    """A derived model `embedded:tiny-cached` whose builder copies the tiny model into its cache entry, sealed as
    the real builders seal theirs; the list holds one item per build."""
    built: list[Path] = []
    monkeypatch.setattr(loading, "DERIVED_MODELS", {})

    def build() -> Path:
        target = loading.cache_dir() / "models" / NAME
        if (target / "config.json").is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=NAME + ".", suffix=".tmp", dir=target.parent))
        shutil.copytree(tiny_model_dir, tmp, dirs_exist_ok=True)
        seal_entry(tmp, target)
        built.append(target)
        return target

    register_derived_model(NAME, build)
    return built


def new_process(monkeypatch) -> None:
    """What a fresh process starts with: nothing checked yet."""
    monkeypatch.setattr(model_cache, "_VERIFIED", set())


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def zero_tail(path: Path) -> None:
    """Overwrite the last 4 KiB (random weights, no zero run) with zeros: same size, other bytes."""
    before = path.read_bytes()
    with open(path, "r+b") as f:
        f.seek(len(before) - 4096)
        f.write(bytes(4096))
    assert path.stat().st_size == len(before) and path.read_bytes() != before


def test_the_manifest_lists_every_file_and_is_written_before_the_move(builds, monkeypatch) -> None:
    seen: list[bool] = []
    real_replace = model_cache.replace_dir_durably
    monkeypatch.setattr(model_cache, "replace_dir_durably",
                        lambda tmp, target: seen.append((tmp / MANIFEST).is_file()) or real_replace(tmp, target))
    entry = Path(resolve_model_path(f"embedded:{NAME}"))
    assert seen == [True]
    files = json.loads((entry / MANIFEST).read_text())["files"]
    assert set(files) == {p.name for p in entry.iterdir()} - {MANIFEST}
    assert files[WEIGHTS]["size"] == (entry / WEIGHTS).stat().st_size
    assert files[WEIGHTS]["sha256"] == model_cache.file_sha256(entry / WEIGHTS)


def test_an_intact_entry_loads_and_is_hashed_once_per_process(builds, monkeypatch) -> None:
    resolve_model_path(f"embedded:{NAME}")
    new_process(monkeypatch)
    hashed: list[str] = []
    real_sha = model_cache.file_sha256
    monkeypatch.setattr(model_cache, "file_sha256", lambda p: hashed.append(p.name) or real_sha(p))
    entry = Path(resolve_model_path(f"embedded:{NAME}"))
    assert sorted(hashed) == sorted(p.name for p in entry.iterdir() if p.name != MANIFEST)
    hashed.clear()
    model = load_causal_lm(f"embedded:{NAME}", None, "float32", "cpu")
    assert hashed == [] and len(builds) == 1
    assert model.config.hidden_size == 32


@pytest.mark.parametrize("damage", [truncate, zero_tail], ids=["truncated", "zeroed"])
def test_a_damaged_weights_file_is_one_error_and_rebuilt_on_next_use(builds, monkeypatch, damage) -> None:
    entry = Path(resolve_model_path(f"embedded:{NAME}"))
    damage(entry / WEIGHTS)
    new_process(monkeypatch)
    with pytest.raises(ExperimentError) as err:
        load_causal_lm(f"embedded:{NAME}", None, "float32", "cpu")
    message = str(err.value)
    assert "\n" not in message and f"'embedded:{NAME}'" in message and WEIGHTS in message
    assert "removed it; the next use rebuilds it" in message
    assert not entry.exists() and not list(entry.parent.glob("*.tmp"))
    model = load_causal_lm(f"embedded:{NAME}", None, "float32", "cpu")
    assert len(builds) == 2 and model.config.hidden_size == 32


def test_a_missing_file_and_a_broken_manifest_are_damage(builds, monkeypatch) -> None:
    entry = Path(resolve_model_path(f"embedded:{NAME}"))
    (entry / "config.json").unlink()
    assert model_cache.manifest_problem(entry) == "config.json is missing"
    (entry / MANIFEST).write_text("{not json")
    assert model_cache.manifest_problem(entry) == f"{MANIFEST} is unreadable"


def test_an_entry_without_a_manifest_is_recorded_once_with_a_notice(cache, tiny_model_dir) -> None:
    entry = shutil.copytree(tiny_model_dir, cache / "models" / "old")
    notices: list[str] = []
    model_cache.verify_entry(entry, "embedded:old", notices.append)
    assert len(notices) == 1 and "had no manifest" in notices[0] and (entry / MANIFEST).is_file()
    assert model_cache.manifest_problem(entry) is None


def test_an_entry_without_a_manifest_and_a_truncated_file_is_damage(cache, tiny_model_dir) -> None:
    entry = shutil.copytree(tiny_model_dir, cache / "models" / "old")
    truncate(entry / WEIGHTS)
    with pytest.raises(ExperimentError, match=r"model.safetensors has \d+ bytes, its header says \d+"):
        model_cache.verify_entry(entry, "embedded:old", print)
    assert not entry.exists()


def test_a_process_that_waits_for_a_build_says_so_once(tmp_path: Path) -> None:
    lock_path = tmp_path / "build.lock"
    notices: list[str] = []
    entered = threading.Event()

    def second_builder() -> None:
        with build_lock(lock_path, "embedded:tiny", notices.append):
            entered.set()

    with open(lock_path, "w") as held:  # the first build (a separate open file: flock conflicts within a process too)
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=second_builder)
        waiter.start()
        assert not entered.wait(0.5)
    waiter.join(10)
    assert entered.is_set() and len(notices) == 1
    assert notices[0] == f"waiting for another process that is building embedded:tiny (lock {lock_path})"


@pytest.mark.process
def test_the_cli_reports_a_damaged_cached_model_in_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    from purplerl.experiments.align import SAFE_MODEL, align_key

    cache = tmp_path / "cache"
    entry = cache / "models" / f"{SAFE_MODEL}-{align_key()}"
    tmp = cache / "models" / "building.tmp"
    shutil.copytree(tiny_model_dir, tmp)
    seal_entry(tmp, entry)
    zero_tail(entry / WEIGHTS)
    env = {**os.environ, "PURPLERL_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", "purplerl", "sample", "--model", f"embedded:{SAFE_MODEL}",
                           "--prompt", "hi"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: cached model 'embedded:{SAFE_MODEL}' at {entry} was damaged (model.safetensors does not match its "
        "SHA-256 in the manifest): removed it; the next use rebuilds it"]
    assert not entry.exists()
