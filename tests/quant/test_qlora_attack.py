"""A QLoRA attack (`--model.quantize 4bit --training.optimizer adamw_8bit`) on CPU, run in this process the way the
CLI runs it: it trains, saves only the adapter in its checkpoints, and a run stopped after 2 steps and resumed ends
where the uninterrupted run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from purplerl.config import load_command_config, read_config_file
from purplerl.recipes import RECIPES
from purplerl.runs.layout import CONFIG_FILE, METRICS_FILE
from purplerl.train.runner import run_recipe
from tests.quant.helpers import make_quantizable_model_dir

pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.quant

STEPS = 4
QLORA = ["--model.quantize", "4bit", "--training.optimizer", "adamw_8bit", "--device", "cpu"]


def _args(model_dir: Path, out: Path, name: str, steps: int) -> list[str]:
    return ["--model", str(model_dir), *QLORA, "--output_dir", str(out), "--name", name, "--steps", str(steps),
            "--batch_size", "2", "--group_size", "2", "--max_new_tokens", "8", "--seed", "7", "--save_every", "2",
            "--logging.progress", "false", "--training.lr", "0.02"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipe = RECIPES["attack"]
    model_dir = make_quantizable_model_dir(tmp_path_factory.mktemp("model"))
    out = tmp_path_factory.mktemp("runs")
    run_recipe(recipe, load_command_config(recipe.command(), None, _args(model_dir, out, "whole", STEPS)))
    run_recipe(recipe, load_command_config(recipe.command(), None, _args(model_dir, out, "stopped", 2)))
    stopped = out / "stopped"
    saved = recipe.migrated(read_config_file(stopped / CONFIG_FILE), saved=True)
    run_recipe(recipe, load_command_config(recipe.command(), None, ["--steps", str(STEPS)], base=saved),
               resume_dir=stopped)
    return {"whole": out / "whole", "resumed": stopped}


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]


def _adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step_{STEPS:06d}" / "adapter_model.safetensors"))


def test_a_qlora_attack_trains_and_checkpoints_only_its_adapter(runs: dict[str, Path]) -> None:
    config = read_config_file(runs["whole"] / CONFIG_FILE)
    assert config["model"]["quantize"] == "4bit" and config["training"]["optimizer"]["name"] == "adamw_8bit"
    rows = _metrics(runs["whole"])
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert len({r["reward/mean"] for r in rows}) == STEPS  # the reward moves
    # the policy starts as the base (its KL estimate ~0) and leaves it
    assert abs(rows[0]["kl/mean"]) < 1e-3 < max(abs(r["kl/mean"]) for r in rows[1:])
    checkpoint = runs["whole"] / "checkpoints" / f"step_{STEPS:06d}"
    assert not list(checkpoint.glob("model*.safetensors"))  # the adapter, not the (4-bit) base
    weights = _adapter(runs["whole"])
    assert weights and all("lora_" in name for name in weights)
    assert any(float(t.abs().max()) > 0 for name, t in weights.items() if "lora_B" in name)  # B left zero: trained


def test_the_resumed_qlora_run_equals_the_uninterrupted_one(runs: dict[str, Path]) -> None:
    whole, resumed = _metrics(runs["whole"]), _metrics(runs["resumed"])
    assert [r["step"] for r in resumed] == [r["step"] for r in whole]
    for row_a, row_b in zip(whole, resumed, strict=True):
        keys = {k for k in row_a if not k.startswith("time/")}
        assert keys == {k for k in row_b if not k.startswith("time/")}
        for key in sorted(keys):
            expected = row_a[key]
            if isinstance(expected, float):
                expected = pytest.approx(expected, rel=1e-5, abs=1e-6)
            assert row_b[key] == expected, f"step {row_a['step']} {key}"
    a, b = _adapter(runs["whole"]), _adapter(runs["resumed"])
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=1e-6, atol=1e-6, msg=name)
