"""Adapter dirs given to sample, eval and --init_adapter: every malformed one is a one-line UserError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from purplerl.engines.loading import load_peft_adapter, read_adapter_config
from purplerl.errors import UserError

DROP = object()  # a change that removes the field


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from purplerl.config import ModelConfig
    from purplerl.engines.local import LocalEngine

    path = tmp_path_factory.mktemp("adapter") / "step_000001"
    LocalEngine(ModelConfig(name=str(tiny_model_dir), device="cpu", lora_rank=4)).save(path)
    return path


def _variant(adapter: Path, root: Path, change: dict | None = None, text: bytes | None = None) -> Path:
    target = root / "variant"
    shutil.copytree(adapter, target)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config = {k: v for k, v in {**config, **(change or {})}.items() if v is not DROP}
    data = text if text is not None else json.dumps(config).encode()
    (target / "adapter_config.json").write_bytes(data)
    return target


def _base(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize(("change", "message"), [
    ({"peft_type": DROP}, "has no peft_type"),
    ({"peft_type": "IA3"}, 'purplerl loads LoRA adapters (peft_type "LORA"), this one has peft_type "IA3"'),
    ({"r": "8"}, "field 'r' must be a positive integer, got \"8\""),
    ({"r": 0}, "field 'r' must be a positive integer, got 0"),
    ({"r": 2.5}, "field 'r' must be a positive integer, got 2.5"),
    ({"r": True}, "field 'r' must be a positive integer, got true"),
    ({"lora_alpha": "x"}, "field 'lora_alpha' must be a positive number"),
    ({"lora_dropout": 1.5}, "field 'lora_dropout' must be a number in [0, 1)"),
    ({"target_modules": 5}, "field 'target_modules' must be a module name, a list of them or null"),
    ({"target_modules": ["q_proj", 3]}, "field 'target_modules'"),
    ({"task_type": "SEQ_CLS"}, "field 'task_type' must be 'CAUSAL_LM'"),
    ({"bias": "sometimes"}, "field 'bias' must be one of none, all, lora_only"),
    ({"base_model_name_or_path": 5}, "field 'base_model_name_or_path'"),
    ({"rank_pattern": []}, "field 'rank_pattern' must be an object"),
])
def test_malformed_fields_are_named(adapter: Path, tmp_path: Path, change: dict, message: str):
    bad = _variant(adapter, tmp_path, change)
    with pytest.raises(UserError) as info:
        read_adapter_config(bad)
    assert str(info.value).startswith(f"{bad / 'adapter_config.json'}: ") and message in str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    (b"{not json", "adapter_config.json:1: invalid JSON"),
    (b"[1, 2]", "adapter_config.json: expected a JSON object, got an array"),
    (b'"x"', "adapter_config.json: expected a JSON object, got a string"),
    (b'{"peft_type": "LORA", "r": "\xff"}', "adapter_config.json:1: line 1 is not UTF-8"),
])
def test_unreadable_configs_are_one_line(adapter: Path, tmp_path: Path, text: bytes, message: str):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_adapter_config(_variant(adapter, tmp_path, text=text))


def test_missing_config_or_weights(adapter: Path, tmp_path: Path):
    with pytest.raises(UserError, match="is not a PEFT adapter dir \\(no adapter_config.json\\)"):
        read_adapter_config(tmp_path, "init_adapter")
    bad = _variant(adapter, tmp_path)
    (bad / "adapter_model.safetensors").unlink()
    with pytest.raises(UserError, match="has no adapter weights"):
        read_adapter_config(bad)


def test_peft_and_torch_failures_become_one_line(adapter: Path, tiny_model_dir: Path, tmp_path: Path):
    model = load_peft_adapter(_base(tiny_model_dir), adapter)
    assert any("lora_A" in name for name, _ in model.named_parameters())
    # a well-formed config whose rank does not match its weights: torch's size mismatch, named
    wrong_rank = _variant(adapter, tmp_path, {"r": 8})
    with pytest.raises(UserError, match=r"its weights do not fit this model \(size mismatch for .*lora_"):
        load_peft_adapter(_base(tiny_model_dir), wrong_rank)
    shutil.rmtree(wrong_rank)
    no_module = _variant(adapter, tmp_path, {"target_modules": ["no_such_proj"]})
    with pytest.raises(UserError, match="cannot load adapter .*no_such_proj"):
        load_peft_adapter(_base(tiny_model_dir), no_module)
    shutil.rmtree(no_module)
    corrupt = _variant(adapter, tmp_path)
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(UserError) as info:
        load_peft_adapter(_base(tiny_model_dir), corrupt)
    assert str(info.value).startswith(f"cannot load adapter {corrupt}: ") and "\n" not in str(info.value)
