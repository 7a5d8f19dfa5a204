"""The embedded model's cache drops the GGUF quantization_config it no longer matches (Trainer refuses it)."""

from __future__ import annotations

import json
from pathlib import Path

from purplerl.engines.loading import _drop_gguf_quantization


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
