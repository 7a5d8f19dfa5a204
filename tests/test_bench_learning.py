"""bench_grpo's learning comparison: second-half toxicity means with a standard-error noise band."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
bench_grpo = importlib.import_module("bench_grpo")


def test_second_half_means_and_the_two_standard_error_verdict() -> None:
    curves = {"purplerl": [0.0, 0.0, 0.0, 0.0, 0.2, 0.4, 0.2, 0.4],
              "level": [0.9, 0.9, 0.9, 0.9, 0.3, 0.3, 0.3, 0.3],
              "better": [0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]}
    result = bench_grpo.learning_comparison(curves)
    se = math.sqrt(0.04 / 3) / 2  # sample std of (0.2, 0.4, 0.2, 0.4) over sqrt(4); the others' spread is 0
    level, better = result["level"], result["better"]
    assert level["purplerl_second_half_mean"] == pytest.approx(0.3)
    assert level["other_second_half_mean"] == pytest.approx(0.3)
    assert level["difference"] == pytest.approx(0.0) and level["difference_se"] == pytest.approx(se)
    assert level["purplerl_not_below_beyond_noise"] is True
    assert better["difference"] == pytest.approx(-0.2)  # -0.2 < -2 x 0.0577
    assert better["purplerl_not_below_beyond_noise"] is False
    assert set(result) == {"level", "better"}


@pytest.mark.process
def test_a_missing_model_is_a_one_line_error(tmp_path: Path) -> None:
    import subprocess

    bench = Path(__file__).parents[1] / "bench" / "bench_grpo.py"
    done = subprocess.run([sys.executable, str(bench), "--systems", "purplerl", "--steps", "2", "--model",
                           str(tmp_path / "absent"), "--out", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == f"--model: cannot load model '{tmp_path / 'absent'}': no such path"
    assert not (tmp_path / "out.json").exists()


def test_random_twin_keeps_config_and_tokenizer_and_redraws_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    random_twin = importlib.import_module("random_twin")
    random_twin.make_twin(tiny_model_dir, tmp_path / "twin", seed=1)
    assert AutoConfig.from_pretrained(tmp_path / "twin").to_dict()["hidden_size"] == 32
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("hello world")["input_ids"]
    assert AutoTokenizer.from_pretrained(tmp_path / "twin")("hello world")["input_ids"] == ids
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    twin = load_file(str(tmp_path / "twin" / "model.safetensors"))
    assert original.keys() == twin.keys()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert original[name].shape == twin[name].shape and not original[name].equal(twin[name])
    with pytest.raises(SystemExit, match="has no config.json"):
        random_twin.make_twin(tmp_path / "empty", tmp_path / "twin2")
