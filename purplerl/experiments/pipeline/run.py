"""Running a pipeline: each stage in order from the model the last passing stage left, gated, rolled back when a
gate fails, recorded in history.json; a rerun into the same dir resumes.

A policy stage trains from the current model (so its reference, the frozen base, is the stage before it, as in
RLHF), its final checkpoint is merged into a plain model dir (a full fine-tune's checkpoint already is one), the
capability eval and the validator measure that model, and the gates decide: passed, the model is the next stage's;
failed (or collapsed while training), it is rolled back: the next stage starts from the last passing model. A
reward-model stage's output is its run dir, a refine stage's the SFT file the refiner wrote with the current model
as its policy; an eval stage measures the current model against its gates.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.engines.loading import is_full_model_dir
from purplerl.engines.merge import merge_adapter
from purplerl.errors import ExperimentError
from purplerl.experiments.pipeline.gates import check_all, failures
from purplerl.experiments.pipeline.history import DONE, FAILED, HISTORY_FILE, PASSED, ROLLED_BACK, History, stage_spec
from purplerl.experiments.pipeline.measure import Evaluator, reward_judge_check, win_rate
from purplerl.experiments.pipeline.settings import (
    EVALS_DIR,
    MODELS_DIR,
    REFINE,
    REFINE_DIR,
    RUNS_DIR,
    PipelineSettings,
    StageConfig,
)
from purplerl.experiments.pipeline.stages import recipe_config
from purplerl.experiments.pipeline.validator import HACKED, WIN_RATE
from purplerl.experiments.refiner import refine_model
from purplerl.files import read_json_object
from purplerl.launch import recipe_named
from purplerl.locks import hold_dir
from purplerl.outputs import check_output_dir
from purplerl.runs.checkpoints import describe_skipped, newest_intact
from purplerl.runs.layout import CONFIG_FILE, PLOTS_DIR, REPORT_FILE, SUMMARY_FILE
from purplerl.train.runner import run_recipe

MERGE_INFO = "purplerl_pipeline.json"


@dataclass(frozen=True)
class Position:
    """Where the pipeline stands: the model the next stage starts from, the stage that made it, and its eval."""

    model: str
    label: str
    eval: dict[str, Any]


def run_pipeline(settings: PipelineSettings, announce: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or resume) the pipeline in settings.out; returns history.json's content."""
    out = check_output_dir(settings.out, "--out", files=(HISTORY_FILE, REPORT_FILE),
                           dirs=(RUNS_DIR, MODELS_DIR, EVALS_DIR, REFINE_DIR, PLOTS_DIR))
    with hold_dir(out, f"pipeline dir {out}", announce):  # one pipeline writes a dir; before its history is read
        history = History.open(out, settings)
        evaluator = Evaluator(settings, out / EVALS_DIR, announce)
        try:
            final = run_stages(settings, history, evaluator, announce)
        finally:
            evaluator.close()
        history.finish(final)
    return history.data


def run_stages(settings: PipelineSettings, history: History, evaluator: Evaluator,
               announce: Callable[[str], None]) -> str:
    """Every stage not decided yet, each from the position the ones before it left; the model they end with."""
    start = evaluator.evaluate("start", settings.model, settings.eval)
    history.record_start(settings.model, start["metrics"])
    position = Position(settings.model, "start", start)
    for stage in settings.stages:
        entry = history.decided(stage.name)
        if entry is not None:
            announce(f"pipeline: {stage.name} was decided before: {entry['decision']}")
        else:
            announce(f"pipeline: stage {stage.name} ({stage.kind}) from {position.model}")
            entry = run_stage(settings, stage, position, evaluator, start, announce)
            history.record(entry)
            announce(f"pipeline: {stage.name} {entry['decision']}" + "".join(f"; {r}" for r in entry["reasons"]))
        if stage.role() == "policy" and entry["decision"] == PASSED:
            position = Position(entry["model_out"], stage.name,
                                evaluator.evaluate(stage.name, entry["model_out"], settings.eval))
    return position.model


def run_stage(settings: PipelineSettings, stage: StageConfig, position: Position, evaluator: Evaluator,
              start: dict[str, Any], announce: Callable[[str], None]) -> dict[str, Any]:
    """One stage, from training to its decision: its history.json entry."""
    entry: dict[str, Any] = {"name": stage.name, "kind": stage.kind, "role": stage.role(), "spec": stage_spec(stage),
                             "model_in": position.model, "gates": [], "reasons": []}
    role = stage.role()
    if role == REFINE:
        output = refine_stage(settings, stage, position, announce)
        return {**entry, "output": str(output), "decision": DONE, "model_after": position.model}
    if role == "eval":
        cfg = settings.stage_eval(stage)
        measured = evaluator.evaluate(stage.name, position.model, cfg)
        return decide({**entry, "metrics": measured["metrics"]}, settings, stage, position, start, FAILED)
    config = recipe_config(settings, stage, position.model)
    run_dir = Path(config.run.output_dir) / config.run.name
    entry.update(config=config.settings(), run_dir=str(run_dir), summary=train(stage, config, run_dir, announce))
    if role == "scorer":
        return {**entry, "decision": DONE, "model_after": position.model}
    stop = str(entry["summary"].get("stop_reason") or "")
    if stop.startswith("collapsed:"):
        return {**entry, "decision": ROLLED_BACK, "reasons": [f"training {stop}"], "model_after": position.model}
    model_out = stage_model(run_dir, position.model, settings.path(MODELS_DIR, stage.name))
    measured = evaluator.evaluate(stage.name, str(model_out), settings.eval)
    metrics = dict(measured["metrics"])
    judge = settings.stage_judge(stage)
    if judge is not None:
        scorer = evaluator.judge(settings.path(RUNS_DIR, judge))
        metrics[WIN_RATE] = win_rate(scorer, measured, position.eval)
        v = settings.validator
        hacked = reward_judge_check(scorer, run_dir, v.samples, v.top, v.bottom)
        if hacked is not None:
            metrics[HACKED] = {"mean": hacked}
    entry.update(model_out=str(model_out), metrics=metrics)
    return decide(entry, settings, stage, position, start, ROLLED_BACK, passed_model=str(model_out))


def decide(entry: dict[str, Any], settings: PipelineSettings, stage: StageConfig, position: Position,
           start: dict[str, Any], failed: str, passed_model: str | None = None) -> dict[str, Any]:
    """The gates on the entry's metrics (references: the model the stage started from, the start model) and the
    decision: a failed gate gives `failed` and leaves the model where it was."""
    results = check_all(settings.stage_gates(stage), entry["metrics"],
                        {"previous": position.eval["metrics"], "start": start["metrics"]})
    reasons = failures(results)
    decision = failed if reasons else PASSED
    after = passed_model if decision == PASSED and passed_model is not None else position.model
    return {**entry, "gates": results, "decision": decision, "reasons": reasons, "model_after": after}


def train(stage: StageConfig, config: Any, run_dir: Path, announce: Callable[[str], None]) -> dict[str, Any]:
    """Run the stage's recipe, or resume its run dir (a killed pipeline); its summary.json."""
    resume = (run_dir / CONFIG_FILE).is_file()
    if resume:
        announce(f"pipeline: resuming {run_dir}")
    summary = run_recipe(recipe_named(stage.kind), config, resume_dir=run_dir if resume else None, notify=announce)
    path = run_dir / SUMMARY_FILE
    return read_json_object(path) if path.is_file() else summary


def stage_model(run_dir: Path, model_in: str, target: Path) -> Path:
    """The model a policy stage trained: its final checkpoint, merged into `model_in`'s weights at `target` (built
    once), or the checkpoint itself when it is a full model dir."""
    checkpoint, skipped = newest_intact(run_dir)
    if checkpoint is None:
        why = f" ({describe_skipped(skipped)})" if skipped else ""
        raise ExperimentError(f"{run_dir} holds no intact checkpoint to take the stage's model from{why}")
    if is_full_model_dir(checkpoint):
        return checkpoint
    info = {"checkpoint": str(checkpoint.resolve()), "base_model": model_in}
    if (target / "config.json").is_file() and (target / MERGE_INFO).is_file():
        if read_json_object(target / MERGE_INFO) == info:
            return target
    shutil.rmtree(target, ignore_errors=True)  # a merge of an earlier checkpoint (or half of one): the pipeline's own
    return merge_adapter(checkpoint, target, model_in, metadata={MERGE_INFO: info})


def refine_stage(settings: PipelineSettings, stage: StageConfig, position: Position,
                 announce: Callable[[str], None]) -> Path:
    """The refiner (purplerl.experiments.refiner) with the current model as its policy: the SFT file it writes,
    where `${stages.NAME}` said it would be."""
    expected = settings.output_of(stage)
    assert expected is not None
    written = Path(refine_model(position.model, expected.parent, notify=announce, **stage.config))
    if written.resolve() != expected:
        raise ExperimentError(f"stage '{stage.name}': the refiner wrote {written}, not {expected} where the later "
                              "stages' ${stages." + stage.name + "} points")
    return written
