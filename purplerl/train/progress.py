"""The console view of a run: a rich progress bar with the numbers a researcher watches."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# the loop's own metrics on the bar (key -> short label); a recipe adds the ones it watches (its summary metrics)
SHOWN = {"reward/mean": "reward", "kl/mean": "KL", "entropy/mean": "ent"}
STEP_TIME = "time/step_s"


def format_metrics(metrics: dict[str, float], watched: tuple[str, ...] = ()) -> str:
    # "toxicity/mean" shows as "toxicity"; "train/loss" and "eval/loss" keep their prefix, which tells them apart
    shown = {**SHOWN, **{key: key.removesuffix("/mean") for key in watched}}
    parts = [f"{label} {metrics[key]:.3f}" for key, label in shown.items() if key in metrics]
    return "  ".join(parts + ([f"s/step {metrics[STEP_TIME]:.1f}"] if STEP_TIME in metrics else []))


class StepProgress:
    """A progress bar over RL steps; one printed line per step when disabled or not on a terminal."""

    def __init__(self, total: int, completed: int, enabled: bool = True, console: Console | None = None,
                 watched: tuple[str, ...] = ()) -> None:
        self.console = console or Console(stderr=True)
        self.watched = watched
        # a live bar needs a terminal; in a log file (CI, nohup) one plain line per step reads better
        self.enabled = enabled and self.console.is_terminal
        self.progress = Progress(TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(bar_width=20),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=self.console,
                                 disable=not enabled)
        self.task = self.progress.add_task("rl", total=total, completed=completed, stats="")

    def __enter__(self) -> StepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, step: int, metrics: dict[str, float], samples: list[dict[str, Any]]) -> None:
        self.progress.update(self.task, completed=step, stats=format_metrics(metrics, self.watched))
        if not self.enabled:
            # one line a step, however wide: a log is read line by line
            self.console.print(f"step {step}  {format_metrics(metrics, self.watched)}", highlight=False,
                               soft_wrap=True)
        for row in samples:
            text = row["completion"].replace("\n", " ")[:160]
            self.progress.console.print(f"  [dim]{row['prompt'][:60]}[/dim] -> {text}", highlight=False)
