"""Run directories: naming, the saved config, and resuming from the latest checkpoint."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from purplerl.config import Config, build_config, commented_yaml, read_config_file
from purplerl.data import PromptSampler, load_prompts
from purplerl.devices import resolve_device
from purplerl.engines import EngineSettings, make_engine
from purplerl.engines.base import Engine
from purplerl.engines.distributed import join_world, world_of
from purplerl.engines.loading import RUN_CONFIG_FILE
from purplerl.errors import UserError
from purplerl.files import read_jsonl
from purplerl.prompting import render_prompt
from purplerl.train.checkpoint import (
    CHECKPOINTS,
    checkpoint_candidates,
    describe_skipped,
    discard_checkpoint,
    newest_intact,
    read_state,
    remove_stale,
    write_bytes_durably,
)
from purplerl.train.loop import EVALS_FILE, EarlyStop, Evaluation, LoopParts, RecipeHooks, StepFn, rl_step, run_steps
from purplerl.train.sinks import last_logged_step, truncate_after_step
from purplerl.train.trackers import check_trackers, open_trackers

CONFIG_FILE = RUN_CONFIG_FILE
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
HISTORY_FILE = "config_history.jsonl"  # the resolved config of every segment of a run, with its first step
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


def flat_config(config: Config) -> dict[str, Any]:
    """Every leaf field by dotted name: {'training.lr': 0.0001, ...}."""
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and key != "filters":
                walk(value, f"{prefix}{key}.")
            else:
                out[prefix + key] = value

    walk(config.model_dump(mode="json"), "")
    return out


def resume_changes(saved: Config, new: Config) -> dict[str, list[Any]]:
    """{field: [old, new]} for the settings a resume changes; UserError for one that would make the
    continued run a different experiment from the one its checkpoints and logs hold."""
    old_flat, new_flat = flat_config(saved), flat_config(new)
    changed = {k: [old_flat.get(k), v] for k, v in new_flat.items() if old_flat.get(k) != v}
    fixed = [k for k in changed if k in FIXED_ON_RESUME]
    if fixed:
        old, value = changed[fixed[0]]
        raise UserError(f"--{fixed[0]} cannot change when resuming ({old!r} -> {value!r}): the checkpoints and "
                        f"logs were made with {old!r}; start a new run for {value!r} instead (--name NEW)")
    return changed


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


def resume_point(run_dir: Path, restart: bool, save_every: int,
                 notify: Callable[[str], None] = _warn) -> Path | None:
    """The checkpoint a resume continues from (None: from step 1), checked before anything is touched."""
    checkpoint, skipped = newest_intact(run_dir)
    if checkpoint is not None:
        if restart:
            raise UserError(f"--restart would throw away the intact checkpoint {checkpoint}: resume without "
                            f"--restart, or start a new run with --name NEW")
        if skipped:
            notify(f"warning: skipped damaged checkpoints ({describe_skipped(skipped)}); "
                   f"resuming from {checkpoint.name}")
        return checkpoint
    if restart:
        return None
    if skipped:
        raise UserError(f"no intact checkpoint in {run_dir / CHECKPOINTS} ({describe_skipped(skipped)}); "
                        f"start the run again from step 1 with --resume {run_dir} --restart")
    logged = last_logged_step(run_dir / METRICS_FILE)
    if logged and logged <= save_every:
        # the loop logs no step past the first checkpoint before that checkpoint is in place: nothing was lost
        notify(f"warning: {run_dir} stopped at step {logged}, before its first checkpoint (step {save_every}) "
               f"was complete; starting it again from step 1")
        return None
    if logged:
        raise UserError(f"{run_dir} has logs up to step {logged} but no checkpoint to continue from; start it "
                        f"again from step 1 with --resume {run_dir} --restart (its logs are then replaced)")
    return None  # killed before its first step was logged: nothing to lose


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write_bytes_durably(tmp, text.encode())
    os.replace(tmp, path)


def _history(run_dir: Path) -> list[dict[str, Any]]:
    """The config history rows (a torn last line, from a kill mid-write of an older purplerl, is dropped)."""
    path = run_dir / HISTORY_FILE
    return read_jsonl(path, cut_tail=True) if path.is_file() else []


def record_config(run_dir: Path, config: Config, from_step: int, changed: dict[str, list[Any]] | None,
                  restarted: bool = False) -> None:
    """Add the resolved config in force from `from_step` to the history and rewrite config.yaml, whose header
    lists every resume that changed a setting: config.yaml always describes what ran. Both files are replaced
    in one rename each, so a kill leaves the old version or the new one."""
    row: dict[str, Any] = {"from_step": from_step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if changed is not None:
        row["changed"] = changed
    if restarted:
        row["restarted"] = True
    history = (_history(run_dir) if changed is not None or restarted else []) + [
        {**row, "config": config.model_dump(mode="json")}]
    header = []
    for past in history:
        if past.get("restarted"):
            header = [f"# restarted from step 1 at {past['time']}"]
        for key, (old, value) in (past.get("changed") or {}).items():
            header.append(f"# from step {past['from_step']} (resumed): {key} {json.dumps(old)} -> {json.dumps(value)}")
    if header:
        header.insert(0, f"# the settings below are in force from the last resume on; every segment's full config "
                         f"is in {HISTORY_FILE}")
    _write_atomically(run_dir / CONFIG_FILE, "".join(line + "\n" for line in header) + commented_yaml(config))
    _write_atomically(run_dir / HISTORY_FILE, "".join(json.dumps(r) + "\n" for r in history))


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
        changed = resume_changes(build_config(read_config_file(run_dir / CONFIG_FILE)), config)
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
        _write_atomically(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1))
    return summary
