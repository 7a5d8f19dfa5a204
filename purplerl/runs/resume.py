"""Resuming a run from its directory: which checkpoint it continues from, which settings may change, and the
config (and its history) recorded for every segment of the run."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from purplerl.config import commented_yaml
from purplerl.data.content import content_change
from purplerl.errors import UserError
from purplerl.files import read_jsonl, write_durably
from purplerl.runs.checkpoints import describe_skipped, newest_intact
from purplerl.runs.layout import CHECKPOINTS_DIR, CONFIG_FILE, HISTORY_FILE, METRICS_FILE
from purplerl.runs.logs import last_logged_step


def flat_config(config: Any) -> dict[str, Any]:
    """Every leaf field by dotted name: {'training.lr': 0.0001, ...}."""
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and key != "filters":
                walk(value, f"{prefix}{key}.")
            else:
                out[prefix + key] = value

    walk(config.settings(), "")
    return out


def resume_changes(saved: Any, new: Any, fixed: Collection[str], edited_in: Path | None = None,
                   ) -> dict[str, list[Any]]:
    """{field: [old, new]} for the settings a resume changes; UserError for one of `fixed` (dotted names), which
    would make the continued run a different experiment from the one its checkpoints and logs hold. `edited_in`:
    the changes are hand edits of that file (named in the refusal), not options."""
    old_flat, new_flat = flat_config(saved), flat_config(new)
    changed = {k: [old_flat.get(k), v] for k, v in new_flat.items() if old_flat.get(k) != v}
    # a fixed mapping-valued setting (a judge's parameters) is fixed in each of its keys
    refused = [k for k in changed if k in fixed or any(k.startswith(f"{f}.") for f in fixed)]
    if refused:
        old, value = changed[refused[0]]
        how = f"{refused[0]} was edited in {edited_in} and" if edited_in is not None else f"--{refused[0]}"
        raise UserError(f"{how} cannot change when resuming ({old!r} -> {value!r}): the checkpoints and "
                        f"logs were made with {old!r}; start a new run for {value!r} instead (--name NEW)")
    return changed


def last_recorded(run_dir: Path) -> dict[str, Any] | None:
    """The settings of the segment that ran last, as config_history.jsonl recorded them (None: no history, a run
    of an older purplerl)."""
    history = _history(run_dir)
    if not history:
        return None
    config = history[-1].get("config")
    if not isinstance(config, dict):
        raise UserError(f"{run_dir / HISTORY_FILE}: its last row holds no config")
    return config


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


def check_data(run_dir: Path, data: dict[str, Any], notify: Callable[[str], None] = _warn) -> None:
    """Refuse a resume whose data sources (purplerl.data.content) hold other data than the segment that ran last
    read: one line naming the file and both hashes. A run of an older purplerl recorded none: said once, and
    the next segment records it."""
    history = _history(run_dir)
    recorded = history[-1].get("data") if history else None
    if not isinstance(recorded, dict):
        notify(f"note: {run_dir / HISTORY_FILE} records no data content (an older purplerl): its data cannot be "
               "checked now; this segment records it for later resumes")
        return
    for setting, now in data.items():
        then = recorded.get(setting)
        why = content_change(setting, then, now) if isinstance(then, dict) and now is not None else None
        if why:
            raise UserError(f"{why}: resuming would continue the run on other data; restore it, or start a new "
                            "run with --name NEW")


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
        raise UserError(f"no intact checkpoint in {run_dir / CHECKPOINTS_DIR} ({describe_skipped(skipped)}); "
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


def _history(run_dir: Path) -> list[dict[str, Any]]:
    """The config history rows (a torn last line, from a kill mid-write of an older purplerl, is dropped)."""
    path = run_dir / HISTORY_FILE
    return read_jsonl(path, cut_tail=True) if path.is_file() else []


def record_config(run_dir: Path, config: Any, from_step: int, changed: dict[str, list[Any]] | None,
                  restarted: bool = False, edited: Collection[str] = (), data: dict[str, Any] | None = None) -> None:
    """Add the resolved config in force from `from_step` to the history and rewrite config.yaml, whose header
    lists every resume that changed a setting (`edited`: those changed by editing config.yaml): config.yaml
    always describes what ran. `data`: what the segment's data sources hold (`check_data`). Both files are
    replaced in one rename each, so a kill leaves the old version or the new one."""
    row: dict[str, Any] = {"from_step": from_step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if data is not None:
        row["data"] = data
    if changed is not None:
        row["changed"] = changed
    if edited:
        row["edited"] = sorted(edited)
    if restarted:
        row["restarted"] = True
    history = (_history(run_dir) if changed is not None or restarted else []) + [
        {**row, "config": config.settings()}]
    header = []
    for past in history:
        if past.get("restarted"):
            header = [f"# restarted from step 1 at {past['time']}"]
        for key, (old, value) in (past.get("changed") or {}).items():
            how = f"edited in {CONFIG_FILE}" if key in (past.get("edited") or ()) else "resumed"
            header.append(f"# from step {past['from_step']} ({how}): {key} {json.dumps(old)} -> {json.dumps(value)}")
    if header:
        header.insert(0, f"# the settings below are in force from the last resume on; every segment's full config "
                         f"is in {HISTORY_FILE}")
    write_durably(run_dir / CONFIG_FILE, "".join(line + "\n" for line in header) + commented_yaml(config))
    write_durably(run_dir / HISTORY_FILE, "".join(json.dumps(r) + "\n" for r in history))
