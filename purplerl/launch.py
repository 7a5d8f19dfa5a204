"""One way from settings to a run.

Every path that starts a recipe's run asks this module: the command line (`purplerl attack ...`, a resume), a
sweep's runs, a pipeline's stages, tamper-test's attacks and fine-tunes, and align's stages. It gives the recipe a
name means, the run's validated settings, and the run dir they name. So every run gets the same rules: its recipe's
own defaults, older names migrated, a named reward expanded into the terms it stands for, a config of another
recipe refused, and one line naming the setting on a mistake.

The settings are layered, later over earlier:

    the recipe's defaults <- base (a sweep's fixed settings and point, a pipeline's shared sections and stage,
    a config built in code) <- saved (a run's config.yaml on resume: complete, so its mapping-valued settings
    replace the defaults') <- file (--config) <- options (command-line text) <- reward (a named reward, as the
    reward.terms it stands for)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from purplerl.config import load_command_config
from purplerl.errors import UserError
from purplerl.recipes import RECIPES
from purplerl.rewards.named import expand_named
from purplerl.train.recipe import Recipe

TERMS = "reward.terms"


def recipe_named(name: str | None, where: str = "recipe") -> Recipe:
    """The recipe table's row called `name`; one line naming the known ones for any other."""
    if name is None:
        raise UserError(f"name the {where}: one of {', '.join(RECIPES)}")
    if name not in RECIPES:
        raise UserError(f"unknown {where} '{name}' (known: {', '.join(RECIPES)})")
    return RECIPES[name]


def run_settings(recipe: Recipe | str, *, base: Mapping[str, Any] | None = None,
                 saved: Mapping[str, Any] | None = None, file: str | Path | None = None,
                 options: list[str] | None = None, reward: str | None = None,
                 rewards_file: str | Path | None = None) -> Any:
    """The validated settings of a run of `recipe` (a row or its name), layered as the module says. A `reward`
    (a named reward of the catalogue or of `rewards_file`) sets reward.terms to the terms it stands for, so the
    run records the terms themselves, not a name or a file that may change."""
    recipe = recipe_named(recipe) if isinstance(recipe, str) else recipe
    options = list(options or [])
    if rewards_file is not None and reward is None:
        raise UserError("--rewards-file FILE adds named rewards to choose from: choose one with --reward NAME")
    if reward is not None:
        if any(option.lstrip("-").split("=")[0].replace("-", "_") == TERMS for option in options):
            raise UserError("give --reward NAME or --reward.terms, not both")
        options += [f"--{TERMS}", json.dumps(expand_named(reward, rewards_file))]
    config = load_command_config(recipe.command(), file, options, base=dict(base or {}), saved=saved)
    if config.recipe != recipe.name:
        raise UserError(f"config is for recipe '{config.recipe}', not '{recipe.name}'")
    return config


def scorer_term(path: str | Path) -> str:
    """The registered reward term that scores with `path`, a run dir or a checkpoint of one, of a recipe that makes
    a scorer (its row's scorer_term: reward-model's reward_model, prm's prm): the recipe its config.yaml names."""
    from purplerl.config import read_config_file
    from purplerl.runs.layout import CONFIG_FILE, run_config_of

    path = Path(path)
    config = path / CONFIG_FILE if (path / CONFIG_FILE).is_file() else run_config_of(path)
    if config is None:
        raise UserError(f"{path} is neither a run dir nor a checkpoint of one (runs/<run>/checkpoints/step_N)")
    name = read_config_file(config).get("recipe")
    recipe = recipe_named(name if isinstance(name, str) else None, f"recipe of {config}")
    if recipe.scorer_term is None:
        scorers = ", ".join(row.name for row in RECIPES.values() if row.scorer_term is not None)
        raise UserError(f"{path} is a run of {recipe.name}, which makes a policy, not a scorer (those of {scorers})")
    return recipe.scorer_term


def run_dir(recipe: Recipe, config: Any) -> Path:
    """The dir a run of these settings writes: run.output_dir / (run.name, or the recipe's name for its settings)."""
    from purplerl.train.runner import run_dir_of  # the runner imports torch: not for --help

    return run_dir_of(recipe, config)


__all__ = ["recipe_named", "run_dir", "run_settings", "scorer_term"]
