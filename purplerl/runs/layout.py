"""The names inside a run directory, spelled once.

```
runs/<run>/config.yaml                     the resolved config in force (its header lists every resume's changes)
           config_history.jsonl            the resolved config of every segment of the run, with its first step
           metrics.jsonl, samples.jsonl    one row per step / per logged sample
           evals.jsonl                     held-out evaluations, one row per evaluated step (0: before training)
           summary.json                    what the run ended with
           trackers.json                   the external trackers' run ids and the last step each holds
           checkpoints/step_NNNNNN/        a PEFT adapter (or full model) + optimizer + loop_state.json + manifest.json
           collapsed_checkpoints/          checkpoints an early stop found already collapsed, moved aside
           report.html, plots/             the report of the run
```
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "config.yaml"
HISTORY_FILE = "config_history.jsonl"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
EVALS_FILE = "evals.jsonl"
SUMMARY_FILE = "summary.json"
TRACKERS_FILE = "trackers.json"
CHECKPOINTS_DIR = "checkpoints"
COLLAPSED_DIR = "collapsed_checkpoints"
REPORT_FILE = "report.html"
PLOTS_DIR = "plots"
# inside a checkpoint dir
STATE_FILE = "loop_state.json"  # the loop's state: step, sampler position, stop reason...
MANIFEST_FILE = "manifest.json"  # every file's size and SHA-256, written last


def checkpoint_name(step: int) -> str:
    """checkpoints/<this> for step `step`: step_NNNNNN, sorting by step up to a million steps."""
    return f"step_{step:06d}"


def run_config_of(checkpoint: Path) -> Path | None:
    """runs/<run>/config.yaml for a checkpoint runs/<run>/checkpoints/step_N; None for a dir outside a run."""
    parent = Path(checkpoint).absolute().parent
    path = parent.parent / CONFIG_FILE
    return path if parent.name == CHECKPOINTS_DIR and path.is_file() else None
