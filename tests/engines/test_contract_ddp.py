"""The engine contract (tests/engines/test_engine_contract.py) on the data-parallel local engine: 2 real torchrun
processes with gloo on 127.0.0.1, each running the contract's cases against the same global gradients."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

CONTRACT = Path(__file__).with_name("test_engine_contract.py")


def test_the_data_parallel_engine_passes_the_engine_contract(tmp_path: Path) -> None:
    env = {**os.environ, "PURPLERL_CONTRACT_DDP": "1", "OMP_NUM_THREADS": "1"}
    # each rank writes its own report: the two pytest sessions must not share one output stream
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--redirects", "3", "--log-dir", str(tmp_path / "logs"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
           str(CONTRACT)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    reports = sorted((tmp_path / "logs").rglob("stdout.log"))
    texts = [r.read_text() for r in reports]
    assert proc.returncode == 0, (proc.stderr[-3000:], [t[-3000:] for t in texts])
    assert len(texts) == 2
    for text in texts:  # every case ran on both ranks, none skipped but the full-parameter-only one
        passed = re.search(r"(\d+) passed", text)
        assert passed and int(passed.group(1)) >= 6, text[-2000:]
        assert "failed" not in text and "error" not in text.lower().split("passed")[-1], text[-2000:]
