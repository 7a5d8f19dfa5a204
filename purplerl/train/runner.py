"""Running a recipe: its run directory (named, created, resumed) and its steps, for any row of the recipe table."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, closing, nullcontext
from pathlib import Path
from typing import Any

from purplerl.config import build, read_config_file
from purplerl.config.sections import RunSettings
from purplerl.data.content import data_sources
from purplerl.devices import resolve_device
from purplerl.engines import EngineSettings, make_engine
from purplerl.engines.distributed import join_world
from purplerl.errors import UserError
from purplerl.files import write_durably
from purplerl.locks import hold_dir
from purplerl.runs.checkpoints import checkpoint_candidates, read_state
from purplerl.runs.layout import CONFIG_FILE, EVALS_FILE, HISTORY_FILE, METRICS_FILE, SAMPLES_FILE, SUMMARY_FILE
from purplerl.runs.logs import truncate_after_step
from purplerl.runs.resume import check_data, last_recorded, record_config, resume_changes, resume_point
from purplerl.train.checkpoint import discard_checkpoint, remove_stale
from purplerl.train.context import check_context
from purplerl.train.position import restore_position
from purplerl.train.recipe import Recipe
from purplerl.train.steps import Evaluation, run_steps
from purplerl.train.trackers import check_trackers, open_trackers


def engine_settings(config: RunSettings) -> EngineSettings:
    """How the engine executes, from the engine section (fields another engine kind does not read keep their
    defaults) and the optimizer's name."""
    e = config.engine
    return EngineSettings(micro_batch_tokens=e.micro_batch_tokens, merged_sampler=e.fast_path("merged_sampler"),
                          cuda_graphs=e.fast_path("cuda_graphs"), fused_lora=e.fast_path("fused_lora"),
                          packed_decode=e.fast_path("packed_decode"),
                          compiled=e.fast_path("compiled"), optimizer=config.training.optimizer.name)


def run_dir_name(recipe: Recipe, config: RunSettings) -> str:
    """recipe_model_<the recipe's run-name parts>_sSEED, so a run is findable by what it varied."""
    model = re.sub(r"[^A-Za-z0-9.-]+", "-", config.model.name.split(":")[-1].rstrip("/").split("/")[-1])
    parts = [part.render(config) for part in recipe.run_name]
    return "_".join([recipe.name, model, *parts, f"s{config.training.seed}"])


def run_dir_of(recipe: Recipe, config: RunSettings) -> Path:
    return Path(config.run.output_dir) / (config.run.name or run_dir_name(recipe, config))


def _refuse_taken(run_dir: Path) -> None:
    """A new run's dir must not hold a run (checked under its lock: two starts of one run cannot both pass)."""
    if (run_dir / CONFIG_FILE).exists():
        raise UserError(f"run dir {run_dir} already exists: resume it with --resume {run_dir}, or set --name")


def run_dir_lock(run_dir: Path, notify: Callable[[str], None]) -> AbstractContextManager[None]:
    """The run dir's lock (purplerl.locks), held by the process that writes it: rank 0 under torchrun, whose other
    ranks only read the checkpoint rank 0 is allowed to resume from."""
    if os.environ.get("RANK", "0") != "0":
        return nullcontext()
    return hold_dir(run_dir, f"run dir {run_dir}", notify)


def saved_settings(recipe: Recipe, run_dir: Path) -> dict[str, Any]:
    """The settings in a run dir's config.yaml as data (older names migrated): the base a resume's options apply
    to. The file may have been edited by hand: `resume_diff` compares it with what ran."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise UserError(f"{run_dir} is not a run dir (no {CONFIG_FILE})")
    try:
        data = read_config_file(path)
    except UserError as err:
        raise UserError(f"{err}; the config of every segment that ran is in {Path(run_dir) / HISTORY_FILE}") from None
    if data.get("recipe", recipe.name) != recipe.name:
        raise UserError(f"{run_dir} is a run of recipe '{data.get('recipe')}', not '{recipe.name}'")
    return recipe.migrated(data, saved=True)


def saved_config(recipe: Recipe, run_dir: Path) -> Any:
    """The settings a run dir's config.yaml holds, validated."""
    try:
        return build(recipe.settings, saved_settings(recipe, run_dir))
    except UserError as err:
        raise UserError(f"{Path(run_dir) / CONFIG_FILE}: {err}") from None


def last_segment(recipe: Recipe, run_dir: Path) -> Any | None:
    """The settings of the segment that ran last (config_history.jsonl); None for a run without history."""
    data = last_recorded(Path(run_dir))
    if data is None:
        return None
    history, path = Path(run_dir) / HISTORY_FILE, Path(run_dir) / CONFIG_FILE
    if data.get("recipe", recipe.name) != recipe.name:
        raise UserError(f"{path} does not match {history}: the last segment ran recipe '{data.get('recipe')}'")
    try:
        return recipe.build(data, saved=True)
    except UserError as err:
        raise UserError(f"{history} (the record {path} is checked against): its last segment: {err}") from None


def resume_diff(recipe: Recipe, run_dir: Path, config: RunSettings) -> tuple[dict[str, list[Any]], list[str]]:
    """({setting: [old, new]}, the settings among them edited by hand in config.yaml): what a resume changes
    against the segment that ran last, by options or by editing config.yaml. A setting fixed on resume is
    refused whichever way it changed."""
    in_file = saved_config(recipe, run_dir)
    ran = last_segment(recipe, run_dir)
    if ran is None:
        return resume_changes(in_file, config, recipe.fixed_on_resume), []
    edits = resume_changes(ran, in_file, recipe.fixed_on_resume, edited_in=Path(run_dir) / CONFIG_FILE)
    changed = resume_changes(ran, config, recipe.fixed_on_resume)
    return changed, [key for key, (_, value) in edits.items() if key in changed and changed[key][1] == value]


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


def run_recipe(recipe: Recipe, config: RunSettings, resume_dir: Path | None = None, restart: bool = False,
               evaluation: Evaluation | None = None, notify: Callable[[str], None] = _warn) -> dict[str, Any]:
    """Start a new run of `recipe`, or continue `resume_dir` from its latest intact checkpoint."""
    run_dir = Path(resume_dir) if resume_dir is not None else run_dir_of(recipe, config)
    return execute_run(recipe, config, run_dir, resume=resume_dir is not None, restart=restart, notify=notify,
                       evaluation=evaluation)


def _open_run_dir(config: RunSettings, run_dir: Path, resume: bool, restart: bool, start_step: int,
                  changed: dict[str, list[Any]] | None, edited: list[str], data: dict[str, Any]) -> None:
    """A new run's dir and config; or a resumed run's config recorded and its logs cut back to its checkpoint."""
    if resume:
        remove_stale(run_dir, config.run.keep_last)
        if restart:
            for damaged in checkpoint_candidates(run_dir):
                discard_checkpoint(damaged)
        record_config(run_dir, config, start_step, changed, restarted=restart, edited=edited, data=data)
        for name in (METRICS_FILE, SAMPLES_FILE):
            truncate_after_step(run_dir / name, start_step - 1)
        # a run started again from step 1 evaluates its step 0 again: drop that row too
        truncate_after_step(run_dir / EVALS_FILE, start_step - 1 if start_step > 1 else -1)
    else:
        # written only now: a run that failed to start (bad model, missing data) must not claim its name
        run_dir.mkdir(parents=True, exist_ok=True)
        record_config(run_dir, config, 1, None, data=data)


def execute_run(recipe: Recipe, config: RunSettings, run_dir: Path, resume: bool, restart: bool = False,
                notify: Callable[[str], None] = _warn, evaluation: Evaluation | None = None) -> dict[str, Any]:
    """`_execute` under the run dir's lock, taken before anything in the dir is read: a second process writing the
    dir (a resume of a run still training, a second start of one run) is refused in one line naming the holder."""
    recipe.check_engine(config)
    with run_dir_lock(run_dir, notify):
        if not resume:
            _refuse_taken(run_dir)
        return _execute(recipe, config, run_dir, resume, restart, notify, evaluation)


def _execute(recipe: Recipe, config: RunSettings, run_dir: Path, resume: bool, restart: bool,
             notify: Callable[[str], None], evaluation: Evaluation | None) -> dict[str, Any]:
    """Prepare the recipe, load the engine, restore the latest intact checkpoint when resuming, run the steps.

    `recipe.prepare(config)` loads and checks what the recipe needs before the engine loads (data, scorers) and
    returns a function binding it to the engine. Everything a resume needs is checked first (settings,
    checkpoint, data, reward scorer, that the engine loads the checkpoint); only then are stale temporaries
    removed, the config recorded and the logs cut back to the checkpoint's step, so a resume that fails leaves
    the run dir exactly as it was. `evaluation`, when given, is run by the loop with the live engine and logged to
    evals.jsonl, which a resume cuts back with the other logs. Under torchrun every process runs this; only rank
    0 writes into the run dir, and every rank loads the same checkpoint."""
    start_step, checkpoint, changed, edited, state = 1, None, None, [], {}
    check_trackers(config.logging.trackers)  # a missing package fails now, not after the model loaded
    if resume:
        changed, edited = resume_diff(recipe, run_dir, config)
        checkpoint = resume_point(run_dir, restart, config.run.save_every, notify)
        if checkpoint is not None:
            state = read_state(checkpoint)
            if state.get("stop_reason") or state["step"] >= config.training.steps:
                remove_stale(run_dir, config.run.keep_last)  # e.g. a rotation the kill interrupted
                return {"last_step": state["step"], "stop_reason": state.get("stop_reason") or "completed all steps",
                        "run_dir": str(run_dir), "resumed_from": str(checkpoint), "nothing_to_do": True}
            start_step = state["step"] + 1

    bind = recipe.prepare(config)
    check_context(recipe.longest_sequence(config), config)
    data = data_sources(config)  # what the readers just read, recorded with the segment
    if resume and not restart:  # a restart keeps nothing made from the old data
        check_data(run_dir, data, notify)
    world = join_world(config.engine.procs, resolve_device(config.model.device))
    if world.size != config.engine.procs:  # started by torchrun itself: config.yaml says how many processes ran
        config = config.model_copy(update={"engine": config.engine.model_copy(update={"procs": world.size})})
    if config.training.batch_size % world.size:
        raise UserError(f"training.batch_size={config.training.batch_size} does not divide by the {world.size} "
                        f"data-parallel processes")
    # closed however the run ends: vLLM's engine process is stopped, not killed at the interpreter's exit
    model = config.model if recipe.engine_model is None else recipe.engine_model(config)
    with closing(make_engine(model, engine=config.engine, seed=config.training.seed,
                             settings=engine_settings(config), world=world)) as engine:
        if checkpoint is not None:
            engine.load(checkpoint)
        step_fn, early_stop = bind(engine, run_dir)
        if checkpoint is not None:
            restore_position(step_fn, state, checkpoint)  # a streamed source goes on at its next example

        if world.is_writer:
            _open_run_dir(config, run_dir, resume, restart, start_step, changed, edited, data)
        # rank 0 alone feeds the trackers, as it alone writes the logs they mirror
        with open_trackers(config.logging.trackers if world.is_writer else [], run_dir, config.settings(),
                           start_step, notify) as trackers:
            summary = run_steps(config, step_fn, early_stop, engine, run_dir, start_step, evaluation, trackers,
                                watched=tuple(recipe.summary_metrics))
    summary.update(run_dir=str(run_dir), resumed_from=str(checkpoint) if checkpoint else None)
    if world.is_writer:
        write_durably(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1))
    world.leave()
    return summary
