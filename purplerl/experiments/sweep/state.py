"""The sweep dir, and what a rerun into it does.

```
OUT/sweep.json             the sweep's settings and its runs (name, configuration, seed, swept values)
OUT/configs/NAME.yaml      each run's settings, as `purplerl RECIPE --config` reads them
OUT/runs/NAME/             each run's dir (purplerl.runs.layout)
OUT/logs/NAME.log          each run's commands and their output, every attempt appended
OUT/outcomes/NAME.json     how each run ended: finished, or failed with its error line
OUT/evals/NAME/            each run's diversity eval (`purplerl eval --suite diversity`)
OUT/summary.csv/.json/.html
```

A rerun into the same OUT skips the runs whose outcome says finished (and those that failed, unless
retry_failed), and starts the others: a run whose dir holds a run continues from its latest intact checkpoint.
An interrupted run has no outcome, so it is resumed. A run planned with other settings than its config file holds
is refused before anything starts: its checkpoints were made with those.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from purplerl.config import commented_yaml, read_config_file
from purplerl.errors import UserError
from purplerl.experiments.sweep.plan import RUNS_DIR, PlannedRun
from purplerl.experiments.sweep.settings import SweepSettings
from purplerl.experiments.sweep.task import FAILED, FINISHED
from purplerl.files import read_json_object, write_durably
from purplerl.outputs import check_output_dir, make_output_dir

SWEEP_FILE = "sweep.json"
CONFIGS_DIR, LOGS_DIR, OUTCOMES_DIR, EVALS_DIR = "configs", "logs", "outcomes", "evals"
SUMMARY_FILES = ("summary.csv", "summary.json", "summary.html")


def sweep_dir(settings: SweepSettings) -> Path:
    return Path(settings.out).expanduser().resolve()


def check_sweep_dir(settings: SweepSettings) -> Path:
    return check_output_dir(settings.out, "--out", files=(SWEEP_FILE, *SUMMARY_FILES),
                            dirs=(CONFIGS_DIR, LOGS_DIR, OUTCOMES_DIR, EVALS_DIR, RUNS_DIR))


def config_file(out: Path, name: str) -> Path:
    return out / CONFIGS_DIR / f"{name}.yaml"


def outcome_file(out: Path, name: str) -> Path:
    return out / OUTCOMES_DIR / f"{name}.json"


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix.rstrip("."): data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def first_difference(saved: dict[str, Any], planned: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """(setting, saved value, planned value) of the first setting that differs, or None."""
    old, new = _flat(json.loads(json.dumps(saved))), _flat(json.loads(json.dumps(planned)))
    key = next((k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)), None)
    return None if key is None else (key, old.get(key), new.get(key))


def check_configs(out: Path, runs: list[PlannedRun]) -> None:
    """A run whose config file holds other settings than planned is refused (one line naming the setting); nothing
    is written."""
    for run in runs:
        path = config_file(out, run.name)
        if path.is_file():
            differs = first_difference(read_config_file(path), run.config.settings())
            if differs is not None:
                key, old, new = differs
                raise UserError(f"run {run.name} in {out} was planned with {key}={json.dumps(old)}, now "
                                f"{json.dumps(new)}: its checkpoints were made with the old value; use another "
                                f"--out for the new settings")


def write_configs(out: Path, runs: list[PlannedRun]) -> None:
    """Each run's config file, once `check_configs` found none that holds other settings."""
    check_configs(out, runs)
    make_output_dir(out / CONFIGS_DIR)
    for run in runs:
        path = config_file(out, run.name)
        if not path.is_file():
            write_durably(path, commented_yaml(run.config))


def write_plan(out: Path, settings: SweepSettings, runs: list[PlannedRun]) -> None:
    plan = {"settings": settings.settings(),
            "runs": [{"name": run.name, "configuration": run.label, "seed": run.seed, "point": run.point}
                     for run in runs]}
    write_durably(out / SWEEP_FILE, json.dumps(plan, indent=1))


def read_outcome(out: Path, name: str) -> dict[str, Any] | None:
    path = outcome_file(out, name)
    return read_json_object(path) if path.is_file() else None


def record_outcome(out: Path, outcome: dict[str, Any]) -> None:
    make_output_dir(out / OUTCOMES_DIR)
    write_durably(outcome_file(out, outcome["name"]), json.dumps(outcome, indent=1))


def to_run(out: Path, runs: list[PlannedRun], retry_failed: bool) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """(the runs to start now, the runs a recorded outcome leaves alone)."""
    start, kept = [], []
    for run in runs:
        outcome = read_outcome(out, run.name)
        status = None if outcome is None else outcome.get("status")
        done = status == FINISHED or (status == FAILED and not retry_failed)
        (kept if done else start).append(run)
    return start, kept
