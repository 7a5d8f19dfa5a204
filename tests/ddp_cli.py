"""Commands of the data-parallel CLI tests (tests/train/test_ddp_run.py, tests/train/test_ddp_sigkill.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH, GROUP = 2, 2


def cli_env(cache: Path) -> dict[str, str]:
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "PURPLERL_CACHE": str(cache),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def attack_cmd(model_dir: Path, out: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "purplerl", "attack", "--model", str(model_dir), "--steps", str(steps),
            "--batch_size", str(BATCH), "--group_size", str(GROUP), "--max_new_tokens", "8", "--seed", "7",
            "--save_every", "1", "--run.keep_last", "5", "--output_dir", str(out), "--name", name,
            "--logging.progress", "false", *extra]
