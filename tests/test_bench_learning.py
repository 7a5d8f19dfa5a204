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
