"""Two named adapters on SmolLM2 cost at most 10% more resident memory than one (bench/bench_adapters.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_adapters.py"


@pytest.mark.slow
def test_a_second_adapter_costs_at_most_ten_percent_rss(tmp_path: Path) -> None:
    out = tmp_path / "adapters.json"
    subprocess.run([sys.executable, str(BENCH), "--out", str(out)], check=True, timeout=900)
    result = json.loads(out.read_text())
    one, two = result["runs"]
    assert (one["adapters"], two["adapters"]) == (1, 2)
    assert two["rss_mib"] > one["rss_mib"]  # the second adapter and its optimizer state are really there
    assert result["rss_ratio"] <= 1.10, result
