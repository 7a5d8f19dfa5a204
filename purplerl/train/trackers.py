"""Experiment trackers (W&B offline, TensorBoard, MLflow file store) fed with the rows of a run's JSONL logs.

The JSONL files stay the record; `logging.trackers` adds dashboards that receive the same rows. A tracker gets
a step's rows once the checkpoint that covers the step is on disk (`TrackerFeed.commit`): a resume recomputes
every step after its checkpoint, and a tracker that had already seen one of them would show it twice, since
W&B and MLflow histories cannot be cut back. So the dashboards trail the JSONL files by at most
`run.save_every` steps. run_dir/trackers.json holds, per tracker, its run id, the last step it was sent and
whether it was closed; a resume continues those runs and first sends each tracker the rows it lacks up to the
checkpoint, from the JSONL logs (a kill between a checkpoint and the hand-over, or a tracker added when
resuming). What a tracker holds is known only once it closed (a failure or Ctrl-C closes it too): after a kill,
W&B and MLflow get a new run given the whole log, and TensorBoard purges its events and gets it again.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.files import write_durably
from purplerl.runs.layout import EVALS_FILE, METRICS_FILE, SAMPLES_FILE, TRACKERS_FILE
from purplerl.train import tracker_backends
from purplerl.train.sinks import read_jsonl

STATE_FILE = TRACKERS_FILE  # {tracker: {"id": its run id, "step": the last step it holds}}
LOG_FILES = {"metrics": METRICS_FILE, "samples": SAMPLES_FILE, "evals": EVALS_FILE}
INSTALL_HINT = "pip install 'purplerl[trackers]'"


@dataclass(frozen=True)
class TrackerRun:
    """What a backend needs to open (or continue) its run."""

    run_dir: Path
    config: dict[str, Any]  # the resolved config, nested as in config.yaml (secrets already masked)
    resume_id: str | None  # the tracker's run to continue; None: start a new one
    first_step: int  # the first step it will be sent; TensorBoard drops what earlier segments logged from it on


class Tracker(Protocol):
    run_id: str

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        """Scalars of one step (finite numbers only)."""
        ...

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """The step's samples.jsonl rows, as one table."""
        ...

    def close(self, failed: bool) -> None:
        ...


@dataclass(frozen=True)
class TrackerKind:
    package: str  # what must be importable
    open: Callable[[TrackerRun], Tracker]
    # True: the tracker drops what it holds from a given step on (TensorBoard's purge_step), so its run goes on
    # whatever it holds; otherwise a run holding steps a resume recomputes, or unknown ones, is replaced by a
    # new run given the whole log
    purges: bool


TRACKERS: dict[str, TrackerKind] = {
    "wandb": TrackerKind("wandb", tracker_backends.WandbTracker, purges=False),
    "tensorboard": TrackerKind("tensorboardX", tracker_backends.TensorBoardTracker, purges=True),
    "mlflow": TrackerKind("mlflow", tracker_backends.MlflowTracker, purges=False),
}


def check_trackers(names: list[str]) -> None:
    """Import each tracker's package now, so a missing one stops the run before the engine loads."""
    for name in names:
        package = TRACKERS[name].package
        try:
            importlib.import_module(package)
        except ImportError as err:
            what = "is not installed" if err.name == package else f"cannot be imported ({first_line(err)})"
            raise UserError(f"--logging.trackers {name}: the '{package}' package {what} ({INSTALL_HINT})") from None


def numbers(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numeric fields of a log row except its step (text, flags and NaN stay in the JSONL file)."""
    return {prefix + k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < float("inf")}


Entry = tuple[int, str, Any]  # (step, "metrics" | "samples" | "evals", a row or the step's sample rows)


class TrackerFeed:
    """The open trackers of a run and the rows they have not been sent yet (none: every call does nothing)."""

    def __init__(self, run_dir: Path | None = None, trackers: dict[str, Tracker] | None = None,
                 held: dict[str, int] | None = None) -> None:
        self.run_dir = run_dir
        self.trackers = trackers or {}
        self.held = held or {}  # tracker -> the last step it holds (-1: none)
        self.pending: list[Entry] = []

    def metrics(self, row: dict[str, Any]) -> None:
        if self.trackers:
            self.pending.append((row["step"], "metrics", row))

    def samples(self, rows: list[dict[str, Any]]) -> None:
        if self.trackers and rows:
            self.pending.append((rows[0]["step"], "samples", rows))

    def evals(self, row: dict[str, Any]) -> None:
        if self.trackers:
            self.pending.append((row["step"], "evals", row))

    def commit(self) -> None:
        """Send the pending rows: called once the checkpoint covering them (or the run's last step) is on disk."""
        for name in self.trackers:
            self._send(name, [entry for entry in self.pending if entry[0] > self.held[name]])
        self.pending = []
        if self.trackers:
            self._write_state()

    def _send(self, name: str, entries: list[Entry]) -> None:
        tracker = self.trackers[name]
        for step, kind, payload in entries:
            try:
                if kind == "samples":
                    tracker.log_samples(step, payload)
                else:
                    tracker.log_metrics(step, numbers(payload, "eval/" if kind == "evals" else ""))
            except Exception as err:  # any library's failure: stop with one line, the logs stay whole
                raise ExperimentError(
                    f"tracker {name} failed at step {step}: {type(err).__name__}: {first_line(err)} (the JSONL logs "
                    f"are complete; resume with --resume {self.run_dir}, adding --logging.trackers [] to go on "
                    f"without trackers)") from err
            self.held[name] = max(self.held[name], step)

    def replay(self, upto: int) -> None:
        """Send each tracker the logged rows of steps up to `upto` that it does not hold yet."""
        if not self.trackers or min(self.held.values()) >= upto:
            return
        entries = logged_entries(self.run_dir, min(self.held.values()), upto)
        for name in self.trackers:
            self._send(name, [entry for entry in entries if entry[0] > self.held[name]])
        self._write_state()

    def _write_state(self, closed: frozenset[str] = frozenset()) -> None:
        state = read_state(self.run_dir)
        state.update({name: {"id": t.run_id, "step": self.held[name], "closed": name in closed}
                      for name, t in self.trackers.items()})
        write_durably(self.run_dir / STATE_FILE, json.dumps(state, indent=1))

    def close(self, failed: bool = False) -> None:
        errors, closed = [], set()
        for name, tracker in self.trackers.items():  # every one is closed, even after another one failed to
            try:
                tracker.close(failed)
                closed.add(name)
            except Exception as err:  # reported below, after the others had their chance to close
                errors.append(f"tracker {name} failed to close: {type(err).__name__}: {first_line(err)}")
        if self.trackers:
            self._write_state(frozenset(closed))  # what a closed tracker was sent is on disk
        self.trackers = {}
        if errors and not failed:
            raise ExperimentError("; ".join(errors))
        for error in errors:  # the run's own failure is the one reported; these only follow it
            print(f"warning: {error}", file=sys.stderr)

    def __enter__(self) -> TrackerFeed:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        self.close(failed=kind is not None)


def read_state(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / STATE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ExperimentError(f"{path} is damaged; remove it to start new tracker runs") from None


def logged_entries(run_dir: Path, after: int, upto: int) -> list[Entry]:
    """The rows of the run's JSONL logs for steps after..upto, in the order the loop logs them."""
    order = {"metrics": 0, "samples": 1, "evals": 2}
    entries: list[Entry] = []
    for kind, file in LOG_FILES.items():
        rows = [r for r in read_jsonl(run_dir / file) if after < r["step"] <= upto]
        if kind != "samples":
            entries += [(r["step"], kind, r) for r in rows]
            continue
        for step in sorted({r["step"] for r in rows}):
            entries.append((step, kind, [r for r in rows if r["step"] == step]))
    return sorted(entries, key=lambda e: (e[0], order[e[1]]))


def continuation(name: str, held: dict[str, Any] | None, upto: int,
                 notify: Callable[[str], None]) -> tuple[str | None, int]:
    """(the tracker run to continue, or None for a new one; the last step it keeps) for a resume from step
    upto + 1, given what trackers.json says the tracker was sent."""
    if not held:
        return None, -1
    # what a tracker holds is known once it closed: until then W&B's service and tensorboardX's writer thread
    # keep rows in memory, and a kill during a hand-over leaves MLflow with rows trackers.json does not list
    known = held.get("closed", False)
    last = held["step"] if known else -1
    if known and last <= upto:
        return held["id"], last
    if TRACKERS[name].purges:
        return held["id"], min(last, upto)
    why = f"holds steps after step {upto}, where this resume goes on" if known else \
        "was not closed (the process was killed) and may have lost its last rows"
    notify(f"warning: {name} run {held['id']} {why}; the whole log goes to a new {name} run")
    return None, -1


def open_trackers(names: list[str], run_dir: Path, config: dict[str, Any], start_step: int,
                  notify: Callable[[str], None]) -> TrackerFeed:
    """Open (or continue) each named tracker for a run going on from `start_step`, and send it what the JSONL
    logs hold up to the step before that it does not have yet."""
    state = read_state(run_dir) if start_step > 1 else {}  # a run from step 1 starts new tracker runs
    upto = start_step - 1
    feed = TrackerFeed(run_dir, {}, {})
    try:
        for name in names:
            run_id, last = continuation(name, state.get(name), upto, notify)
            try:
                tracker = TRACKERS[name].open(TrackerRun(run_dir, config, run_id, last + 1))
            except Exception as err:  # the library's own failure, named in one line
                raise ExperimentError(f"tracker {name} failed to open: {type(err).__name__}: {first_line(err)}"
                                      ) from err
            feed.trackers[name], feed.held[name] = tracker, last
        feed.replay(upto)
    except BaseException:
        feed.close(failed=True)
        raise
    return feed
