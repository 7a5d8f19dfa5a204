"""OUT/history.json: what a pipeline ran and decided, written atomically after every stage, and what a rerun into
the same dir may reuse.

```
{"pipeline": 1, "settings": {...}, "start": {"model", "metrics"},
 "stages": [{"name", "kind", "role", "spec", "model_in", "config", "run_dir", "summary", "model_out", "metrics",
             "gates": [{"metric", "bound", "value", "lower", "upper", "passed", "reason"}], "decision", "reasons",
             "model_after"}, ...],
 "final_model": ...}
```
A stage with a decision is done: a rerun reads it and goes on from the model it left. A stage without one (killed)
runs again, its run dir resumed. Settings that made a recorded decision may not change under it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from purplerl.errors import UserError
from purplerl.experiments.pipeline.settings import PipelineSettings, StageConfig
from purplerl.files import read_json_object, write_durably

HISTORY_FILE = "history.json"
VERSION = 1
PASSED, ROLLED_BACK, DONE, FAILED = "passed", "rolled back", "done", "failed"


def stage_spec(stage: StageConfig) -> dict[str, Any]:
    return stage.model_dump(mode="json")


def _pipeline_wide(settings: PipelineSettings) -> dict[str, Any]:
    """The settings every decision depends on: all but the stages and the dir."""
    return {key: value for key, value in settings.model_dump(mode="json").items() if key not in ("stages", "out")}


class History:
    """history.json of one pipeline dir."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    @classmethod
    def open(cls, out: Path, settings: PipelineSettings) -> History:
        """The dir's history, checked against `settings`; a fresh one when the dir has none."""
        path = out / HISTORY_FILE
        fresh = {"pipeline": VERSION, "settings": settings.model_dump(mode="json"), "start": None, "stages": [],
                 "final_model": None}
        if not path.is_file():
            return cls(path, fresh)
        saved = read_json_object(path)
        if saved.get("pipeline") != VERSION or not isinstance(saved.get("stages"), list):
            raise UserError(f"{path} is not the history of a purplerl pipeline: use another --out")
        decided = [entry for entry in saved["stages"] if entry.get("decision")]
        if decided:
            _check_unchanged(path, saved, settings, decided)
        return cls(path, {**saved, "settings": settings.model_dump(mode="json"),
                          "stages": [entry for entry in saved["stages"] if entry.get("decision")]})

    def decided(self, name: str) -> dict[str, Any] | None:
        return next((entry for entry in self.data["stages"] if entry["name"] == name), None)

    def record_start(self, model: str, metrics: dict[str, Any]) -> None:
        self.data["start"] = {"model": model, "metrics": metrics}
        self.write()

    def record(self, entry: dict[str, Any]) -> None:
        self.data["stages"] = [e for e in self.data["stages"] if e["name"] != entry["name"]] + [entry]
        self.write()

    def finish(self, model: str) -> None:
        self.data["final_model"] = model
        self.write()

    def write(self) -> None:
        write_durably(self.path, json.dumps(self.data, indent=1))


def _check_unchanged(path: Path, saved: dict[str, Any], settings: PipelineSettings,
                     decided: list[dict[str, Any]]) -> None:
    before = {key: value for key, value in saved["settings"].items() if key not in ("stages", "out")}
    now = _pipeline_wide(settings)
    changed = next((key for key in now if before.get(key) != now[key]), None)
    if changed is not None:
        raise UserError(f"{path}: the pipeline's {changed} changed since stage '{decided[0]['name']}' was decided "
                        "with it: use another --out (or restore it)")
    names = [stage.name for stage in settings.stages]
    for i, entry in enumerate(decided):
        if i >= len(names) or names[i] != entry["name"]:
            raise UserError(f"{path}: stage '{entry['name']}' was decided as stage {i + 1}, but the pipeline now has "
                            f"{names[i] if i < len(names) else 'no stage'} there: use another --out")
        if stage_spec(settings.stages[i]) != entry["spec"]:
            raise UserError(f"{path}: stage '{entry['name']}' changed since it was decided: use another --out "
                            "(or restore it)")
