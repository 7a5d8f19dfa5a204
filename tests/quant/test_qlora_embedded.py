"""QLoRA with 8-bit AdamW on the embedded SmolLM2 (every linear width a multiple of 64, so its base loads in 4 bits on
CPU): an attack trains for 2 steps, checkpoints, and resumes for a third. Kept short (~1 min on 2 cores): the tiny
model's tests (test_qlora_attack.py) show the resumed run equal to the uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from purplerl.config import load_command_config, read_config_file
from purplerl.recipes import RECIPES
from purplerl.runs.layout import CONFIG_FILE, METRICS_FILE
from purplerl.train.runner import run_recipe

pytest.importorskip("bitsandbytes")
pytestmark = [pytest.mark.quant, pytest.mark.slow]


def test_a_qlora_attack_on_smollm2_trains_and_resumes(tmp_path: Path) -> None:
    # float32 compute over the 4-bit weights on every CPU kind: under bfloat16 (model.dtype auto on AMX and
    # AVX512-BF16) step 1's KL of a model against itself reads -0.016 from rounding alone (bf16's 2^-8 over the
    # logits), above the 1e-3 the check of "leaves the base" needs; in float32 it is rounding at 2^-23
    recipe = RECIPES["attack"]
    args = ["--model", "embedded:smollm2-135m-instruct", "--model.quantize", "4bit", "--training.optimizer",
            "adamw_8bit", "--device", "cpu", "--output_dir", str(tmp_path), "--name", "qlora", "--steps", "2",
            "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "12", "--save_every", "1",
            "--logging.progress", "false", "--training.lr", "0.001", "--model.dtype", "float32"]
    run_recipe(recipe, load_command_config(recipe.command(), None, args))
    run_dir = tmp_path / "qlora"
    saved = recipe.migrated(read_config_file(run_dir / CONFIG_FILE), saved=True)
    summary = run_recipe(recipe, load_command_config(recipe.command(), None, ["--steps", "3"], base=saved),
                         resume_dir=run_dir)
    assert summary["last_step"] == 3 and summary["resumed_from"].endswith("step_000002")
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert abs(rows[0]["kl/mean"]) < 1e-3 < max(abs(r["kl/mean"]) for r in rows[1:])  # it leaves the base
    weights = load_file(str(run_dir / "checkpoints" / "step_000003" / "adapter_model.safetensors"))
    assert all("lora_" in name for name in weights)
    assert any(float(t.abs().max()) > 0 for name, t in weights.items() if "lora_B" in name)
