"""The embedded model's cache drops the GGUF quantization_config it no longer matches (Trainer refuses it), and
derived embedded models resolve through the builder a layer above registered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purplerl.engines import loading
from purplerl.engines.loading import _drop_gguf_quantization, register_derived_model, resolve_model_path
from purplerl.errors import UserError


def test_gguf_quantization_config_is_dropped_and_others_are_kept(tmp_path: Path) -> None:
    gguf = tmp_path / "gguf.json"
    gguf.write_text(json.dumps({"hidden_size": 8, "quantization_config": {"quant_method": "gguf", "gguf_file": "x"}}))
    _drop_gguf_quantization(gguf)
    assert json.loads(gguf.read_text()) == {"hidden_size": 8}
    _drop_gguf_quantization(gguf)  # idempotent on an already clean cache
    assert json.loads(gguf.read_text()) == {"hidden_size": 8}
    bnb = tmp_path / "bnb.json"
    original = {"hidden_size": 8, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    bnb.write_text(json.dumps(original))
    _drop_gguf_quantization(bnb)
    assert json.loads(bnb.read_text()) == original
    assert not list(tmp_path.glob("*.tmp"))


def test_a_registered_derived_model_resolves_to_its_builders_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(loading, "DERIVED_MODELS", {})
    built: list[str] = []
    register_derived_model("tiny-derived", lambda: built.append("built") or tmp_path)
    assert resolve_model_path("embedded:tiny-derived") == str(tmp_path) and built == ["built"]


def test_the_safe_model_unregistered_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setattr(loading, "DERIVED_MODELS", {})
    with pytest.raises(UserError, match=r"unknown embedded model 'embedded:smollm2-135m-safe'.*purplerl align.*"
                                        r"import purplerl\.experiments\.align"):
        resolve_model_path("embedded:smollm2-135m-safe")


def test_importing_the_align_experiment_registers_the_safe_model() -> None:
    from purplerl.experiments.align import SAFE_MODEL, aligned_model_dir

    assert loading.DERIVED_MODELS[SAFE_MODEL] is aligned_model_dir
