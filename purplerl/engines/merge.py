"""Merging a LoRA adapter into its base model's weights: a plain model dir that loads without PEFT.

`purplerl align` caches its aligned model this way, and `tamper-test` merges a defense into the base weights so
that an attacker starts from ordinary weights with a fresh LoRA (the realistic threat model for released
weights). The target is written into a temporary sibling dir and renamed, so a kill never leaves half a model.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from purplerl.engines.loading import load_peft_adapter, resolve_model_path
from purplerl.engines.model_cache import seal_entry
from purplerl.files import replace_dir_durably


def merge_adapter(adapter: str | Path, target: str | Path, base_model: str,
                  metadata: dict[str, dict[str, Any]] | None = None, cache_entry: bool = False) -> Path:
    """Base weights + the LoRA update of `adapter`, in float32, saved with the base's tokenizer into `target`.

    `metadata` maps file names to JSON objects written beside the weights (what the model was built from).
    `cache_entry`: `target` is a model cache entry, sealed with its manifest (engines/model_cache.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(target)
    base_dir = resolve_model_path(base_model)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = load_peft_adapter(base, adapter, trainable=False).merge_and_unload()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent))
    try:
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(tmp)
        for name, content in (metadata or {}).items():
            (tmp / name).write_text(json.dumps(content, indent=1))
        (seal_entry if cache_entry else replace_dir_durably)(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
