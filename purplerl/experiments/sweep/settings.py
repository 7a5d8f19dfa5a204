"""`purplerl sweep`'s settings: the recipe swept, its grid and fixed settings, the seeds, where the runs go, what
each run may use of a machine, the diversity eval after each run and the summary.

A sweep file is YAML or JSON with these fields; the command line adds `--grid KEY=V1,V2` (repeat it, or list
several `KEY=V1,V2` after one `--grid`, as small-rl's sweep.py takes them), `--fixed KEY=V` and the sweep's own
settings (`--seeds 0,1,2`, `--out DIR`, `--cpus_per_run 2`...). A grid or fixed key is a setting of the recipe,
dotted (`training.lr`) or by its short name (`lr`); it is checked against the recipe's settings when the sweep is
planned (plan.py), before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from purplerl.config import Command, Section, apply_overrides, build, parse_overrides, read_config_file
from purplerl.config.base import read_when
from purplerl.errors import UserError


def _evaluated(eval_section: Any) -> bool:
    return eval_section.diversity


class SweepResources(Section):
    """What Ray reserves for each run. Ray never starts more runs on a machine than its cores (and GPUs) hold, so
    the runs on one machine get disjoint thread budgets that sum to at most its cores."""

    cpus_per_run: int = Field(1, ge=1, description=(
        "CPU cores per run: Ray reserves them, and the run's torch threads are this many (OMP_NUM_THREADS and "
        "MKL_NUM_THREADS of its process)"))
    gpus_per_run: float = Field(0.0, ge=0.0, description=(
        "GPUs per run; a fraction (0.25) lets that many small runs share one GPU"))
    reserve_cpus: int = Field(0, ge=0, description=(
        "cores a local cluster leaves out, e.g. for a serve-reward server beside the sweep (an --address cluster has "
        "its own)"))

    @field_validator("gpus_per_run")
    @classmethod
    def _whole_above_one(cls, gpus: float) -> float:
        if gpus > 1 and gpus != int(gpus):
            raise ValueError(f"a run takes a fraction of one GPU or whole GPUs, not {gpus} (Ray's rule)")
        return gpus


class SweepEvalConfig(Section):
    """The diversity/degeneracy eval of each run's final checkpoint (`purplerl eval --suite diversity`)."""

    diversity: bool = Field(True, description=(
        "after each run, measure the diversity of its final checkpoint's answers beside its base model's"))
    limit: read_when(int, _evaluated, "eval.diversity is true") = Field(16, ge=1, description=(
        "held-out prompts answered (the eval's --limit)"))
    n: read_when(int, _evaluated, "eval.diversity is true") = Field(4, ge=1, le=1024, description=(
        "answers per prompt (the eval's --n)"))
    args: read_when(list[str], _evaluated, "eval.diversity is true") = Field(default_factory=list, description=(
        "more `purplerl eval` options, e.g. [--prompts, FILE.jsonl, --max_new_tokens, 32]"))


class SweepSummaryConfig(Section):
    """The table of final metrics per configuration."""

    metrics: list[str] | None = Field(None, description=(
        "metrics.jsonl keys in the table (null: the recipe's summary metrics and reward_metric)"))
    reward_metric: str = Field("reward/mean", description=(
        "the metric whose high value, with low diversity, flags template collapse"))
    window: int = Field(5, ge=1, description="a run's final value of a metric: the mean of its last N logged steps")
    ranges: dict[str, tuple[float, float]] = Field(default_factory=dict, description=(
        "[low, high] of bounded metrics (e.g. {toxicity/mean: [0, 1]}): their intervals are clipped to it; the "
        "diversity measures are in [0, 1] already"))
    collapse_ratio: float = Field(0.5, gt=0.0, le=1.0, description=(
        "low diversity: the eval calls the answers degenerate, or their distinct-2 is below this share of the base "
        "model's"))

    @field_validator("ranges")
    @classmethod
    def _ordered(cls, ranges: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for metric, (low, high) in ranges.items():
            if not low < high:
                raise ValueError(f"the range of {metric} must go from low to high, got [{low}, {high}]")
        return ranges


class SweepSettings(Section):
    """`purplerl sweep`: every combination of the grid, for each seed, run on Ray; then the summary."""

    recipe: str | None = Field(None, description="required: the recipe swept (attack, defend, sft, ...)")
    recipe_config: str | None = Field(None, description=(
        "a config file of the recipe (as `purplerl RECIPE --config`) that every run starts from"))
    grid: dict[str, list[Any]] = Field(default_factory=dict, description=(
        "swept settings, dotted (training.lr) or short (lr), each with its values; every combination runs (--grid "
        "lr=1e-5,3e-5)"))
    fixed: dict[str, Any] = Field(default_factory=dict, description="settings every run gets (--fixed steps=50)")
    seeds: list[int] = Field(default_factory=lambda: [0], description=(
        "the training.seed values: each combination runs once per seed ('0,1,2' works too)"))
    out: str = Field("runs/sweep", description=(
        "the sweep dir (runs/, configs/, logs/, outcomes/, evals/, summary.csv/.json/.html); a rerun into it resumes"))
    address: str | None = Field(None, description=(
        "an existing Ray cluster ('auto', or HOST:PORT); null: a local one on this machine for the sweep's time"))
    retry_failed: bool = Field(False, description=(
        "a rerun also runs again the runs recorded as failed (each resumes from its checkpoint)"))
    max_runs: int = Field(1000, ge=1, description=(
        "the most runs (grid combinations x seeds) a sweep plans: a larger grid is refused before any run is planned "
        "(a grid of six 10-value keys is 10^6 runs); raise it for a sweep that large"))
    resources: SweepResources = Field(default_factory=SweepResources, description="what each run may use of a machine")
    eval: SweepEvalConfig = Field(default_factory=SweepEvalConfig, description="the diversity eval after each run")
    summary: SweepSummaryConfig = Field(default_factory=SweepSummaryConfig, description="the summary table")

    @field_validator("seeds", mode="before")
    @classmethod
    def _split_seeds(cls, value: Any) -> Any:
        if not isinstance(value, str | list):
            return value
        items = [value] if isinstance(value, str) else value  # '0,1', ['0,1', '2'] or [0, 1] from a file
        return [part for item in items
                for part in ([p.strip() for p in item.split(",")] if isinstance(item, str) else [item])]

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int]) -> list[int]:
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError("name each seed once, at least one")
        return seeds

    @field_validator("grid")
    @classmethod
    def _values(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in grid.items():
            if not values:
                raise ValueError(f"grid key {key} has no values")
        return grid


SWEEP = Command(SweepSettings, {
    "recipe": "recipe", "recipe_config": "recipe_config", "seeds": "seeds", "out": "out", "address": "address",
    "retry_failed": "retry_failed", "max_runs": "max_runs", "cpus_per_run": "resources.cpus_per_run",
    "gpus_per_run": "resources.gpus_per_run", "reserve_cpus": "resources.reserve_cpus"})


def split_values(text: str) -> list[str]:
    """'1e-5,3e-5' -> ['1e-5', '3e-5']; commas inside brackets or braces stay ('[q,v],[q]' is two values)."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += 1 if char in "[{" else -1 if char in "]}" else 0
        if char == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += char
    return [*values, current]


def _pair(item: str, option: str) -> tuple[str, str]:
    key, eq, value = item.partition("=")
    if not eq or not key.strip():
        raise UserError(f"{option} takes KEY=VALUE, got '{item}'")
    return key.strip(), value


def split_args(args: list[str]) -> tuple[Path | None, dict[str, list[str]], dict[str, str], list[str]]:
    """(the sweep file, the --grid values, the --fixed values, the remaining `--setting VALUE` options) of a
    `purplerl sweep` command line. After --grid or --fixed every bare KEY=VALUE belongs to it."""
    path: Path | None = None
    grid: dict[str, list[str]] = {}
    fixed: dict[str, str] = {}
    rest: list[str] = []
    mode = None
    for arg in args:
        if arg in ("--grid", "--fixed"):
            mode = arg
        elif arg.startswith(("--grid=", "--fixed=")):
            mode, _, item = arg.partition("=")
            _add(mode, item, grid, fixed)
        elif arg.startswith("--"):
            mode = None
            rest.append(arg)
        elif mode is not None:
            _add(mode, arg, grid, fixed)
        elif rest and rest[-1].startswith("--") and "=" not in rest[-1]:
            rest.append(arg)  # the value of a --setting
        elif path is None:
            path = Path(arg)
        else:
            raise UserError(f"unexpected argument '{arg}': give one sweep file; settings look like --name value, "
                            f"swept ones --grid KEY=V1,V2, fixed ones --fixed KEY=V")
    if mode is not None and not (grid or fixed):
        raise UserError(f"{mode} needs KEY=VALUE after it")
    return path, grid, fixed, rest


def _add(mode: str, item: str, grid: dict[str, list[str]], fixed: dict[str, str]) -> None:
    key, value = _pair(item, mode)
    target = grid if mode == "--grid" else fixed
    if key in target:
        raise UserError(f"{mode} {key} is given twice")
    if mode == "--grid":
        grid[key] = split_values(value)
    else:
        fixed[key] = value


def load_sweep(path: str | Path | None, args: list[str]) -> SweepSettings:
    """The sweep's settings: its file (if any) <- --grid/--fixed <- `--setting VALUE` options."""
    file_path, grid, fixed, rest = split_args(args)
    if file_path is not None and path is not None:
        raise UserError(f"give the sweep file once: '{file_path}' and --config {path}")
    path = path if path is not None else file_path
    data = read_config_file(path) if path is not None else {}
    for field, given in (("grid", grid), ("fixed", fixed)):
        if given:
            current = data.get(field) or {}
            if not isinstance(current, dict):
                raise UserError(f"{field} in {path} must be a mapping of settings")
            data[field] = {**current, **given}
    try:
        overrides = parse_overrides(rest, SWEEP)
    except UserError as err:
        raise UserError(f"{err}; a recipe setting goes in --fixed KEY=VALUE or --grid KEY=V1,V2") from None
    return build(SweepSettings, apply_overrides(data, overrides))
