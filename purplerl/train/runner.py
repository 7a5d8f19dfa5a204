"""Run directories: naming, the saved config, and resuming from the latest checkpoint."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from purplerl.config import Config, save_config
from purplerl.data import PromptSampler, load_prompts
from purplerl.engines import make_engine
from purplerl.errors import UserError
from purplerl.prompting import render_prompt
from purplerl.train.checkpoint import latest_checkpoint, read_state
from purplerl.train.loop import LoopParts, RewardFn, run_loop
from purplerl.train.sinks import truncate_after_step

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"


def run_dir_name(config: Config) -> str:
    """recipe_model_hyperparameters_sSEED, so a run is findable by what it varied."""
    model = re.sub(r"[^A-Za-z0-9.-]+", "-", config.model.name.split(":")[-1].rstrip("/").split("/")[-1])
    t, r = config.training, config.reward
    return (f"{config.recipe}_{model}_lr{t.lr:g}_kl{r.kl_beta:g}_rep{r.repetition_penalty:g}"
            f"_G{config.sampling.group_size}_B{t.batch_size}_s{t.seed}")


def new_run_dir(config: Config) -> Path:
    """The dir of a new run, refused if it already holds a run. `execute_run` creates it once setup succeeded."""
    run_dir = Path(config.run.output_dir) / (config.run.name or run_dir_name(config))
    if (run_dir / CONFIG_FILE).exists():
        raise UserError(f"run dir {run_dir} already exists: resume it with --resume {run_dir}, or set --name")
    return run_dir


def execute_run(config: Config, run_dir: Path, resume: bool,
                build: Callable[[Config], tuple[RewardFn, Callable[[dict[str, float]], str | None]]],
                ) -> dict[str, Any]:
    """Load data, engine and recipe parts, restore the latest checkpoint when resuming, and run the loop."""
    start_step = 1
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if checkpoint is not None:
        state = read_state(checkpoint)
        if state.get("stop_reason") or state["step"] >= config.training.steps:
            summary = {"last_step": state["step"], "stop_reason": state.get("stop_reason") or "completed all steps",
                       "run_dir": str(run_dir), "resumed_from": str(checkpoint), "nothing_to_do": True}
            return summary
        start_step = state["step"] + 1
    for name in ("metrics.jsonl", "samples.jsonl"):
        truncate_after_step(run_dir / name, start_step - 1)

    records = load_prompts(config.data)
    sampler = PromptSampler(records, config.training.batch_size, config.training.seed, shuffle=config.data.shuffle)
    reward_fn, early_stop = build(config)  # before the engine: a bad scorer fails in seconds, not minutes
    engine = make_engine(config)
    if checkpoint is not None:
        engine.load(checkpoint)
    d = config.data
    render = partial(render_prompt, engine.tokenizer, template=d.template, system_prompt=d.system_prompt,
                     max_prompt_tokens=d.max_prompt_tokens)
    if not resume:
        # written only now: a run that failed to start (bad model, missing data) must not claim its name
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, run_dir / CONFIG_FILE)
    summary = run_loop(config, LoopParts(engine, sampler, render, reward_fn, early_stop), run_dir, start_step)
    summary.update(run_dir=str(run_dir), resumed_from=str(checkpoint) if checkpoint else None)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    return summary
