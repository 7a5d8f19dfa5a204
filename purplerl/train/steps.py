"""Any recipe's steps, run one after another: log each, evaluate when due, checkpoint, stop early, feed the
trackers. `run_steps` is the one driver every recipe's `StepFn` goes through (the RL step of purplerl.train.loop, the
SFT, preference and reward-model steps alike); a recipe hands it a step function and an early-stop rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purplerl.config.sections.run import RunSettings
from purplerl.engines.base import Engine
from purplerl.errors import ExperimentError
from purplerl.runs.layout import EVALS_FILE, METRICS_FILE, SAMPLES_FILE
from purplerl.train.checkpoint import save_checkpoint
from purplerl.train.position import position_of
from purplerl.train.progress import StepProgress
from purplerl.train.sinks import JsonlSink
from purplerl.train.stops import Collapse, set_aside_collapsed
from purplerl.train.trackers import TrackerFeed

StepFn = Callable[[int], tuple[dict[str, float], list[dict[str, Any]]]]  # step -> (metrics, sample rows)
EarlyStop = Callable[[dict[str, float]], str | None]


def never_stop(metrics: dict[str, float]) -> str | None:
    return None


EvaluateFn = Callable[[Engine, int], dict[str, Any]]  # (live engine, step) -> one evals.jsonl row, without "step"


@dataclass(frozen=True)
class Evaluation:
    """A held-out evaluation the loop runs with the live engine, so it judges exactly the policy a step left
    behind: before the first step (logged as step 0), every `every` steps and at the last step (also an early
    stop's). Rows go to the run's evals.jsonl; RL and SFT runs both take it (`run_steps`, `execute_run`)."""

    evaluate: EvaluateFn
    every: int  # 0: only at step 0 and at the last step

    def due(self, step: int, finished: bool) -> bool:
        return finished or (self.every > 0 and step % self.every == 0)


class _Discard:
    """A sink that keeps nothing: the logs of a rank other than 0."""

    def write(self, rows: list[dict[str, Any]]) -> None:
        pass

    def sync(self) -> None:
        pass


def _evaluated(evaluation: Evaluation, engine: Engine, step: int) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        row = evaluation.evaluate(engine, step)
    except ExperimentError as err:
        raise ExperimentError(f"step {step}: held-out evaluation: {err}") from err
    return {"step": step, **row, "time/eval_s": time.perf_counter() - started}


def run_steps(config: RunSettings, step_fn: StepFn, early_stop: EarlyStop, engine: Engine, run_dir: Path,
              start_step: int = 1, evaluation: Evaluation | None = None,
              trackers: TrackerFeed | None = None, watched: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run any recipe's steps start_step..training.steps: log each, checkpoint every run.save_every steps and
    at the end, stop early when `early_stop` gives a reason; run `evaluation` when it is due (evals.jsonl).
    Over several processes (a data-parallel engine), rank 0 alone logs, evaluates and writes checkpoints, and
    every rank follows rank 0's stop decision. `trackers` get the logged rows once the checkpoint after them is
    saved (purplerl.train.trackers)."""
    trackers = trackers or TrackerFeed()
    run_dir, world = Path(run_dir), engine.world
    if world.is_writer:
        metrics_sink, samples_sink = JsonlSink(run_dir / METRICS_FILE), JsonlSink(run_dir / SAMPLES_FILE)
    else:  # the other ranks write nothing
        metrics_sink = samples_sink = _Discard()
    evals_sink = JsonlSink(run_dir / EVALS_FILE) if evaluation is not None and world.is_writer else None
    if evals_sink is not None and start_step == 1:
        first = _evaluated(evaluation, engine, 0)  # the start point every curve is measured from
        evals_sink.write([first])
        trackers.evals(first)
    stop_reason: str | None = None
    last_step = start_step - 1
    with StepProgress(config.training.steps, start_step - 1, enabled=config.logging.progress,
                      watched=watched) as progress:
        for step in range(start_step, config.training.steps + 1):
            started = time.perf_counter()
            try:
                metrics, samples = step_fn(step)
            except ExperimentError as err:  # every failure names the step it happened in
                message = str(err)
                raise ExperimentError(message if message.startswith(f"step {step}") else f"step {step}: {message}"
                                      ) from err
            metrics["time/step_s"] = time.perf_counter() - started
            stop_reason = world.agree(early_stop(metrics))
            row = {"step": step, **metrics, **({"early_stop": stop_reason} if stop_reason else {})}
            metrics_sink.write([row])
            samples_sink.write(samples)
            trackers.metrics(row)
            trackers.samples(samples)
            if world.is_writer:
                progress.update(step, metrics, samples[: config.logging.printed_samples()])
            last_step = step
            finished = stop_reason is not None or step == config.training.steps
            if evals_sink is not None and evaluation.due(step, finished):
                evaluated = _evaluated(evaluation, engine, step)
                evals_sink.write([evaluated])
                trackers.evals(evaluated)
            collapsed = isinstance(stop_reason, Collapse)
            if finished or step % config.run.save_every == 0:
                metrics_sink.sync()  # on disk before the checkpoint that claims these steps
                samples_sink.sync()
                if evals_sink is not None:
                    evals_sink.sync()
            if collapsed:  # no checkpoint of a collapsed model; see set_aside_collapsed
                if world.is_writer:
                    set_aside_collapsed(run_dir, step)
            elif finished or step % config.run.save_every == 0:
                state = {"finished": finished, "stop_reason": stop_reason, **position_of(step_fn)}
                save_checkpoint(run_dir, step, engine, state, config.run.keep_last, writer=world.is_writer)
            if finished or step % config.run.save_every == 0:
                trackers.commit()  # after the checkpoint: a resume never recomputes a step a tracker holds
            if stop_reason is not None:
                break
    return {"last_step": last_step, "stop_reason": stop_reason or "completed all steps"}
