"""`purplerl sweep`: the grid x seeds of any recipe, on Ray (purplerl.experiments.sweep)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from purplerl.cli.base import OVERRIDES, app, config_command, reports_errors, say
from purplerl.config import Command
from purplerl.errors import ExperimentError


def _sweep() -> Command:
    from purplerl.experiments.sweep.settings import SWEEP

    return SWEEP


@app.command(context_settings=OVERRIDES, cls=config_command(_sweep), options_metavar="[SWEEP_FILE] [OPTIONS]")
@reports_errors
def sweep(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="the sweep YAML or JSON file (or its first argument)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list the runs and stop")] = False,
) -> None:
    """Run every combination of --grid KEY=V1,V2 (repeat it) for each of --seeds, with --fixed KEY=V, of any
    recipe (--recipe NAME), each run a `purplerl RECIPE` process scheduled by Ray: on a local cluster started for
    the sweep, or on --address. Each run holds --cpus_per_run cores (its torch threads) and --gpus_per_run GPUs (a
    fraction shares one). After each run the diversity eval of its final checkpoint runs. A failed run is recorded
    and the others go on.

    Writes OUT/runs/, OUT/outcomes/, OUT/evals/ and the table of final metrics per configuration (mean and 95%
    interval over seeds, template collapse flagged) as OUT/summary.csv, .json and .html. Running it again
    resumes: finished runs are skipped, unfinished ones continue from their checkpoints."""
    from purplerl.experiments.sweep.execute import run_sweep
    from purplerl.experiments.sweep.plan import describe, plan_sweep
    from purplerl.experiments.sweep.report import text_table
    from purplerl.experiments.sweep.settings import load_sweep

    settings = load_sweep(config, list(ctx.args))
    runs = plan_sweep(settings)
    if dry_run:
        typer.echo(describe(runs))
        return
    try:
        summary = run_sweep(settings, runs, announce=say)
    except KeyboardInterrupt:
        say("interrupted: run the same sweep again (same --out) to resume it; finished runs are kept")
        raise typer.Exit(130) from None
    out = Path(settings.out)
    typer.echo(text_table(summary))
    typer.echo(f"wrote {out / 'summary.csv'}, {out / 'summary.json'} and {out / 'summary.html'}")
    failed = [run["name"] for run in summary["runs"] if run["status"] != "finished"]
    if failed:
        raise ExperimentError(f"{len(failed)} of {len(summary['runs'])} runs did not finish ({', '.join(failed[:3])}"
                              f"{', ...' if len(failed) > 3 else ''}): their errors are above and in "
                              f"{out / 'outcomes'}; rerun with --retry_failed true to run them again")
