"""Run directories: naming, the saved config, and resuming from the latest checkpoint."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from purplerl.config import Config, build_config, read_config_file
from purplerl.data import PromptSampler, load_prompts
from purplerl.devices import resolve_device
from purplerl.engines import EngineSettings, make_engine
from purplerl.engines.base import Engine
from purplerl.engines.distributed import join_world, world_of
from purplerl.errors import UserError
from purplerl.files import write_durably
from purplerl.prompting import render_prompt
from purplerl.runs.checkpoints import checkpoint_candidates, read_state
from purplerl.runs.layout import CONFIG_FILE, EVALS_FILE, METRICS_FILE, SAMPLES_FILE, SUMMARY_FILE
from purplerl.runs.logs import truncate_after_step
from purplerl.runs.resume import record_config, resume_changes, resume_point
from purplerl.train.checkpoint import discard_checkpoint, remove_stale
from purplerl.train.loop import EarlyStop, Evaluation, LoopParts, RecipeHooks, StepFn, rl_step, run_steps
from purplerl.train.trackers import check_trackers, open_trackers

# Settings a resume may not change: the checkpoints, data order and logs of the run were made with them, so a
# run continued with other values would be neither the old experiment nor a new one.
FIXED_ON_RESUME = frozenset({
    "recipe", "engine.kind", "model.name", "model.revision", "model.finetune", "model.lora_rank", "model.lora_alpha",
    "model.lora_targets", "model.init_adapter", "sampling.group_size", "training.batch_size", "training.seed",
    "data.source", "data.split", "data.prompt_field", "data.hf_config", "data.filters", "data.limit", "data.shuffle",
    "run.output_dir", "run.name",
})


def engine_settings(config: Config) -> EngineSettings:
    t = config.training
    return EngineSettings(micro_batch_size=t.micro_batch_size, micro_batch_tokens=t.micro_batch_tokens)


def run_dir_name(config: Config) -> str:
    """recipe_model_hyperparameters_sSEED, so a run is findable by what it varied."""
    model = re.sub(r"[^A-Za-z0-9.-]+", "-", config.model.name.split(":")[-1].rstrip("/").split("/")[-1])
    t, r = config.training, config.reward
    if config.recipe == "sft":
        params = "full" if config.model.finetune == "full" else f"r{config.model.lora_rank}"
        return f"sft_{model}_lr{t.lr:g}_{params}_B{t.batch_size}_s{t.seed}"
    return (f"{config.recipe}_{model}_lr{t.lr:g}_kl{r.kl_beta:g}_rep{r.repetition_penalty:g}"
            f"_G{config.sampling.group_size}_B{t.batch_size}_s{t.seed}")


def new_run_dir(config: Config) -> Path:
    """The dir of a new run, refused if it already holds a run. `execute_run` creates it once setup succeeded."""
    run_dir = Path(config.run.output_dir) / (config.run.name or run_dir_name(config))
    if (run_dir / CONFIG_FILE).exists():
        raise UserError(f"run dir {run_dir} already exists: resume it with --resume {run_dir}, or set --name")
    return run_dir


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


Bind = Callable[[Engine], tuple[StepFn, EarlyStop]]  # the engine -> the recipe's step function and early stop


def rl_recipe(build: Callable[[Config], RecipeHooks]) -> Callable[[Config], Bind]:
    """`prepare` for an RL recipe: its prompts and hooks are made (and checked) before the engine exists."""

    def prepare(config: Config) -> Bind:
        records = load_prompts(config.data)
        sampler = PromptSampler(records, config.training.batch_size, config.training.seed,
                                shuffle=config.data.shuffle)
        hooks = build(config)  # before the engine: a bad scorer fails in seconds, not minutes

        def bind(engine: Engine) -> tuple[StepFn, EarlyStop]:
            d = config.data
            render = partial(render_prompt, engine.tokenizer, template=d.template, system_prompt=d.system_prompt,
                             max_prompt_tokens=d.max_prompt_tokens)
            parts = LoopParts(engine, sampler, render, hooks, world_of(engine))
            return partial(rl_step, config=config, parts=parts), hooks.early_stop

        return bind

    return prepare


def _open_run_dir(config: Config, run_dir: Path, resume: bool, restart: bool, start_step: int,
                  changed: dict[str, list[Any]] | None) -> None:
    """A new run's dir and config; or a resumed run's config recorded and its logs cut back to its checkpoint."""
    if resume:
        remove_stale(run_dir, config.run.keep_last)
        if restart:
            for damaged in checkpoint_candidates(run_dir):
                discard_checkpoint(damaged)
        record_config(run_dir, config, start_step, changed, restarted=restart)
        for name in (METRICS_FILE, SAMPLES_FILE):
            truncate_after_step(run_dir / name, start_step - 1)
        # a run started again from step 1 evaluates its step 0 again: drop that row too
        truncate_after_step(run_dir / EVALS_FILE, start_step - 1 if start_step > 1 else -1)
    else:
        # written only now: a run that failed to start (bad model, missing data) must not claim its name
        run_dir.mkdir(parents=True, exist_ok=True)
        record_config(run_dir, config, 1, None)


def execute_run(config: Config, run_dir: Path, resume: bool, prepare: Callable[[Config], Bind],
                restart: bool = False, notify: Callable[[str], None] = _warn,
                evaluation: Evaluation | None = None) -> dict[str, Any]:
    """Prepare the recipe, load the engine, restore the latest intact checkpoint when resuming, run the steps.

    `prepare(config)` loads and checks what the recipe needs before the engine loads (data, scorers) and
    returns a function binding it to the engine. Everything a resume needs is checked first (settings,
    checkpoint, data, reward scorer, that the engine loads the checkpoint); only then are stale temporaries
    removed, the config recorded and the logs cut back to the checkpoint's step, so a resume that fails leaves
    the run dir exactly as it was. `evaluation`, when given, is run by the loop with the live engine and logged to
    evals.jsonl, which a resume cuts back with the other logs. Under torchrun every process runs this; only rank
    0 writes into the run dir, and every rank loads the same checkpoint."""
    start_step, checkpoint, changed = 1, None, None
    check_trackers(config.logging.trackers)  # a missing package fails now, not after the model loaded
    if resume:
        changed = resume_changes(build_config(read_config_file(run_dir / CONFIG_FILE)), config, FIXED_ON_RESUME)
        checkpoint = resume_point(run_dir, restart, config.run.save_every, notify)
        if checkpoint is not None:
            state = read_state(checkpoint)
            if state.get("stop_reason") or state["step"] >= config.training.steps:
                remove_stale(run_dir, config.run.keep_last)  # e.g. a rotation the kill interrupted
                return {"last_step": state["step"], "stop_reason": state.get("stop_reason") or "completed all steps",
                        "run_dir": str(run_dir), "resumed_from": str(checkpoint), "nothing_to_do": True}
            start_step = state["step"] + 1

    bind = prepare(config)
    world = join_world(config.engine.procs, resolve_device(config.model.device))
    if world.size != config.engine.procs:  # started by torchrun itself: config.yaml says how many processes ran
        config = config.model_copy(update={"engine": config.engine.model_copy(update={"procs": world.size})})
    if config.training.batch_size % world.size:
        raise UserError(f"training.batch_size={config.training.batch_size} does not divide by the {world.size} "
                        f"data-parallel processes")
    engine = make_engine(config.model, engine=config.engine, seed=config.training.seed,
                         settings=engine_settings(config), world=world)
    if checkpoint is not None:
        engine.load(checkpoint)
    step_fn, early_stop = bind(engine)

    if world.is_writer:
        _open_run_dir(config, run_dir, resume, restart, start_step, changed)
    # rank 0 alone feeds the trackers, as it alone writes the logs they mirror
    with open_trackers(config.logging.trackers if world.is_writer else [], run_dir, config.model_dump(mode="json"),
                       start_step, notify) as trackers:
        summary = run_steps(config, step_fn, early_stop, engine, run_dir, start_step, evaluation, trackers)
    summary.update(run_dir=str(run_dir), resumed_from=str(checkpoint) if checkpoint else None)
    if world.is_writer:
        write_durably(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1))
    return summary
