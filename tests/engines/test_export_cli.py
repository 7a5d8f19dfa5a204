"""`purplerl export --merge`: a standard model dir whose logits are the adapter-on model's."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner


def _export(*args: str | Path):
    from purplerl.cli import app

    return CliRunner().invoke(app, ["export", *map(str, args)])


def test_export_merge_writes_a_model_dir_with_the_adapter_on_models_logits(
        tiny_model_dir: Path, trained_adapter_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "exported"
    result = _export("--merge", trained_adapter_dir, "--out", out)
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    assert not (out / "adapter_config.json").exists()
    info = json.loads((out / "purplerl_export.json").read_text())
    assert info["base_model"] == str(tiny_model_dir) and info["prompt"]["template"] == "chat"
    assert AutoTokenizer.from_pretrained(out).encode("hello world") == \
        AutoTokenizer.from_pretrained(tiny_model_dir).encode("hello world")
    ids = torch.tensor([[3, 11, 42, 7, 99, 250, 8]])
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                        str(trained_adapter_dir)).eval()
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
        want = adapted(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert float((want - plain).abs().max()) > 0.1  # the adapter matters, so the match is not trivial


def test_export_refuses_a_used_out_dir_and_a_missing_adapter_in_one_line(
        trained_adapter_dir: Path, tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    result = _export("--merge", trained_adapter_dir, "--out", used)
    assert result.exit_code != 0 and "already exists and is not an empty dir" in result.output
    assert (used / "keep.txt").read_text() == "mine"
    missing = _export("--merge", tmp_path / "nope", "--out", tmp_path / "x")
    assert missing.exit_code != 0 and "Traceback" not in missing.output
    assert not (tmp_path / "x").exists()
