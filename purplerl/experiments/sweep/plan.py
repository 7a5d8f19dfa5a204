"""The runs of a sweep: every combination of the grid for each seed, each named after its swept values and its
settings validated against the recipe's before any run starts.

A run's name is RECIPE_<key><value>..._s<seed> (small-rl's convention: every varied hyperparameter in the name, so
a run is findable by it: attack_lr1e-05_kl_beta0.02_s0, attack_data-redteam_s1), a key by its short name where the
recipe has one (lr, kl_beta) and dotted otherwise;
runs of one configuration differ only in their seed, and their configuration's label is the name without it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from purplerl.config import apply_overrides, parse_overrides, read_config_file
from purplerl.errors import UserError
from purplerl.experiments.sweep.settings import SweepSettings
from purplerl.files import plain_name_problem
from purplerl.launch import recipe_named, run_settings
from purplerl.rewards.named import TermSpec, expand_named, term_parameter_path
from purplerl.train.recipe import Recipe

RUNS_DIR = "runs"
SEED_KEY = "training.seed"
# what the sweep sets itself: the recipe, each run's seed and its run dir
SET_BY_SWEEP = {"recipe": "the sweep's recipe", SEED_KEY: "seeds (--seeds 0,1,2)",
                "run.output_dir": "the sweep dir (--out)", "run.name": "the sweep's run names"}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=,@-]+")
# A recipe command's --reward NAME and --rewards-file FILE (purplerl.rewards.named): a named reward, expanded into
# reward.terms; swept by name, so small-rl's `--grid reward=sentence_length_5,happy_binary` reads as it did there.
NAMED_REWARD, REWARDS_FILE, TERMS = "reward", "rewards_file", "reward.terms"


@dataclass(frozen=True)
class PlannedRun:
    """One run of the sweep."""

    name: str  # its run dir's name, under OUT/runs/
    label: str  # its configuration's: the name without the seed
    point: dict[str, Any]  # swept dotted setting -> its value in this run, as the validated settings hold it
    seed: int
    config: Any  # the recipe's validated settings


def recipe_of(name: str | None) -> Recipe:
    if name is None:
        raise UserError("name the recipe swept: recipe: NAME in the sweep file, or --recipe NAME")
    return recipe_named(name)


def _takes_anything_below(annotation: Any) -> bool:
    """Whether a field holds a mapping, whose keys a dotted path may go on into (reward.terms.toxicity)."""
    if get_origin(annotation) in (Union, UnionType):
        return any(_takes_anything_below(arg) for arg in get_args(annotation))
    return annotation is dict or get_origin(annotation) is dict


def check_key(recipe: Recipe, key: str, where: str) -> str:
    """The dotted setting a grid or fixed key names (a short name resolved); UserError in one line for a key that
    is no setting of the recipe, or one the sweep sets itself."""
    command = recipe.command()
    plain = key.replace("-", "_")  # dashes work as in every option (--max-new-tokens)
    if plain in (NAMED_REWARD, REWARDS_FILE):
        try:
            check_key(recipe, TERMS, where)
        except UserError:
            raise UserError(f"{where} key '{key}': recipe '{recipe.name}' has no reward.terms to name a reward "
                            f"for") from None
        return plain
    dotted = term_parameter_path(command.flat.get(plain, plain))  # reward.toxicity.url, the older spelling, too
    model: type[BaseModel] = command.schema
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            raise UserError(f"{where} key '{key}' is not a setting of recipe '{recipe.name}' "
                            f"(see purplerl {recipe.name} --help)")
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        if i < len(parts) - 1 and not _takes_anything_below(annotation):
            raise UserError(f"{where} key '{key}': {'.'.join(parts[:i + 1])} is a single setting, not a section")
        break
    else:
        raise UserError(f"{where} key '{key}' names the section {dotted}: sweep one of its settings")
    if dotted in SET_BY_SWEEP:
        raise UserError(f"{where} key '{key}': {dotted} is set by {SET_BY_SWEEP[dotted]}")
    return dotted


def typed(recipe: Recipe, dotted: str, value: Any) -> Any:
    """A value as the recipe's option parser reads it where it is command-line text ('1e-5', 'true', 'null');
    a value the sweep file typed already is kept."""
    if not isinstance(value, str):
        return value
    return parse_overrides([f"--{dotted}", value], recipe.command())[dotted]


def short_names(recipe: Recipe) -> dict[str, str]:
    """dotted setting -> the short name the recipe's options give it (the first one listed)."""
    names: dict[str, str] = {}
    for short, dotted in recipe.command().flat.items():
        names.setdefault(dotted, short)
    return names


def render(value: Any) -> str:
    """A value as it appears in a run name: numbers as %g, a path or model id by its last part, anything else
    with the characters a directory name cannot hold replaced by '-'."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int | float):
        return f"{value:g}"
    if isinstance(value, str):
        text = value.rstrip("/").split("/")[-1].split(":")[-1] or value
    else:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return _UNSAFE.sub("-", text).strip("-") or "-"


def setting(config: Any, dotted: str, given: Any = None) -> Any:
    """The value of a dotted setting in validated settings (into a mapping for reward.terms.NAME). A reward term
    swept by its weight (reward.terms.repetition=-0.1,-0.3: `given` a number) is that weight; swept whole, its use
    {fn, weight, params, hack_at}."""
    node: Any = config
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    if isinstance(node, TermSpec):
        return node.weight if isinstance(given, int | float) and not isinstance(given, bool) else node.settings()
    return node


def _named(overrides: dict[str, Any], rewards_file: str | None) -> dict[str, Any]:
    """Overrides with a named reward expanded into the reward.terms it stands for."""
    if NAMED_REWARD not in overrides:
        return overrides
    rest = {key: value for key, value in overrides.items() if key != NAMED_REWARD}
    return {**rest, TERMS: expand_named(str(overrides[NAMED_REWARD]), rewards_file)}


def _base_data(settings: SweepSettings, recipe: Recipe) -> tuple[dict[str, Any], str | None]:
    """(the settings every run starts from: the recipe config file with the fixed settings over it, the rewards
    file named rewards come from)."""
    # older names migrated and the reward terms written out, so a fixed or swept key can reach into a term
    data = recipe.migrated(read_config_file(settings.recipe_config)) if settings.recipe_config is not None else {}
    if data.get("recipe", recipe.name) != recipe.name:
        raise UserError(f"{settings.recipe_config} is a config of recipe '{data['recipe']}', not '{recipe.name}'")
    fixed = {check_key(recipe, key, "fixed"): value for key, value in settings.fixed.items()}
    rewards_file = fixed.pop(REWARDS_FILE, None)
    if NAMED_REWARD in fixed and TERMS in fixed:
        raise UserError("fixed names a reward and reward.terms: give one of them")
    typed_fixed = {key: typed(recipe, key, value) if key != NAMED_REWARD else value for key, value in fixed.items()}
    return apply_overrides(data, _named(typed_fixed, rewards_file)), rewards_file


def _grid(settings: SweepSettings, recipe: Recipe) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    fixed = {check_key(recipe, k, "fixed") for k in settings.fixed}
    for key, values in settings.grid.items():
        dotted = check_key(recipe, key, "grid")
        if dotted in grid:
            raise UserError(f"grid names {dotted} twice (as '{key}' and by another name)")
        if dotted in fixed:
            raise UserError(f"{dotted} is both swept (grid) and fixed: give it in one of them")
        if dotted == REWARDS_FILE:
            raise UserError("grid: sweep named rewards with reward=NAME1,NAME2 and give their file in fixed "
                            "(rewards_file=FILE)")
        grid[dotted] = [typed(recipe, dotted, value) if dotted != NAMED_REWARD else str(value) for value in values]
    if NAMED_REWARD in grid.keys() | fixed and TERMS in grid.keys() | fixed:
        raise UserError("the sweep names a reward and sets reward.terms: give one of them")
    return grid


def run_name(recipe: Recipe, point: dict[str, Any], seed: int) -> tuple[str, str]:
    """(the run's name, its configuration's label)."""
    shorts = short_names(recipe)
    parts = []
    for key, value in point.items():
        shown = render(value)
        # lr1e-05 as the recipes name their runs; text after a dash (data-redteam), so the two stay apart
        parts.append(f"{shorts.get(key, key)}{'-' if shown[0].isalpha() else ''}{shown}")
    label = "_".join([recipe.name, *parts])
    return f"{label}_s{seed}", label


def _build(recipe: Recipe, data: dict[str, Any], point: dict[str, Any], seed: int) -> Any:
    try:
        return run_settings(recipe, base=data)
    except UserError as err:
        shown = ", ".join(f"{key}={value}" for key, value in point.items())
        raise UserError(f"the run with {shown or 'the fixed settings'}, seed {seed}: {err}") from None


def plan_sweep(settings: SweepSettings) -> list[PlannedRun]:
    """Every run of the sweep, its settings validated (one line naming the run and the setting on a mistake)."""
    recipe = recipe_of(settings.recipe)
    base, rewards_file = _base_data(settings, recipe)
    grid = _grid(settings, recipe)
    count = math.prod(len(values) for values in grid.values()) * len(settings.seeds)
    if count > settings.max_runs:  # counted before any run is built: each takes milliseconds to validate
        sizes = " x ".join([*(str(len(values)) for values in grid.values()), f"{len(settings.seeds)} seeds"])
        raise UserError(f"the sweep has {count} runs ({sizes}), more than max_runs={settings.max_runs}: sweep fewer "
                        "values, or raise --max_runs")
    runs_dir = str(Path(settings.out).expanduser().resolve() / RUNS_DIR)
    runs: list[PlannedRun] = []
    for values in itertools.product(*grid.values()):
        given = dict(zip(grid, values, strict=True))
        for seed in settings.seeds:
            # a swept reward term's weight over its fixed parameters: reward.terms.NAME=W sets the weight only
            data = apply_overrides(base, {**_named(given, rewards_file), SEED_KEY: seed, "run.output_dir": runs_dir},
                                   recipe.command().schema)
            config = _build(recipe, data, given, seed)
            # as validated: '1e-5' is 1e-05; a named reward by its name
            point = {key: given[key] if key == NAMED_REWARD else setting(config, key, given[key]) for key in grid}
            name, label = run_name(recipe, point, seed)
            _check_name(name, point, runs)
            config = _build(recipe, apply_overrides(data, {"run.name": name}), given, seed)
            runs.append(PlannedRun(name, label, point, seed, config))
    return runs


def _check_name(name: str, point: dict[str, Any], runs: list[PlannedRun]) -> None:
    problem = plain_name_problem(name)
    if problem:
        raise UserError(f"run name '{name}' {problem}: sweep fewer settings at once, or shorter values")
    twin = next((run for run in runs if run.name == name), None)
    if twin is not None:
        raise UserError(f"two runs would share the name {name} ({twin.point} and {point}): their values differ "
                        f"only in characters a run name cannot hold")


def describe(runs: list[PlannedRun]) -> str:
    """The dry-run listing: one line per run with its swept values."""
    lines = [f"{len(runs)} runs ({len({run.label for run in runs})} configurations x "
             f"{len({run.seed for run in runs})} seeds):"]
    for run in runs:
        values = ", ".join(f"{key}={json.dumps(value)}" for key, value in run.point.items())
        lines.append(f"  {run.name}" + (f"  ({values})" if values else ""))
    return "\n".join(lines)
