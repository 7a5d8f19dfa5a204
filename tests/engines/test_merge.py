"""engines.merge: a LoRA merged into the base weights computes what the adapter-on model computes."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from purplerl.engines.merge import merge_adapter


def test_merged_logits_equal_the_adapter_on_model(tiny_model_dir: Path, trained_adapter_dir: Path,
                                                  tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    target = merge_adapter(trained_adapter_dir, tmp_path / "merged", str(tiny_model_dir),
                           metadata={"made_from.json": {"adapter": "x"}})
    assert target == tmp_path / "merged" and not list(tmp_path.glob("merged.*.tmp"))
    assert json.loads((target / "made_from.json").read_text()) == {"adapter": "x"}
    assert not (target / "adapter_config.json").exists()  # a plain model: loads without PEFT
    ids = torch.tensor([[5, 17, 42, 9, 3, 100, 250]])
    merged = AutoModelForCausalLM.from_pretrained(target).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                        str(trained_adapter_dir)).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        got, want, plain = merged(ids).logits, adapted(ids).logits, base(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert float((want - plain).abs().max()) > 0.1  # the adapter changes the model: the merge carried it
