"""`purplerl sft`: supervised fine-tuning of a LoRA adapter (or, with `--model.finetune full`, of every weight) on
chat data (train/supervised.py), with the RL runs' run dir, atomic checkpoints, resume, metrics and report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from purplerl.config import SFTRunConfig
from purplerl.recipes.summary import summarize_run
from purplerl.train.runner import execute_run, new_run_dir
from purplerl.train.supervised import sft_prepare

SFT_DEFAULTS: dict[str, Any] = {
    "recipe": "sft",
    "training": {"steps": 100, "batch_size": 8, "lr": 2e-4, "early_stop_toxicity": None,
                 "early_stop_repetition": None},
}


def run_sft(config: SFTRunConfig, resume_dir: Path | None = None, restart: bool = False) -> dict[str, Any]:
    """Start a new SFT run, or continue `resume_dir` from its latest intact checkpoint."""
    run_dir = Path(resume_dir) if resume_dir is not None else new_run_dir(config)
    return execute_run(config, run_dir, resume=resume_dir is not None, prepare=sft_prepare, restart=restart)


def summarize_sft(run_dir: Path, summary: dict[str, Any]) -> str:
    return summarize_run(run_dir, summary, {"train/nll": "training NLL per token", "eval/loss": "held-out NLL"})
