"""The recipe table: one row per recipe folder. The CLI makes a command of each row; the runner, the loop and the
engines take a row and never ask which one it is. A new recipe is its folder, recipes/NAME/ (`__init__.py`: its
settings, defaults, run name, summary metrics, early stops and hooks, the `Recipe(...)` row; `step.py`: its step, where
the shared `rl_step` does not fit; any helper only it uses), one row here, and its tests. `summary.py` is the recipes'
shared helper, not a recipe."""

from purplerl.recipes.adversarial import ADVERSARIAL
from purplerl.recipes.attack import ATTACK
from purplerl.recipes.defend import DEFEND
from purplerl.recipes.ppo import PPO
from purplerl.recipes.prefs import PREFS
from purplerl.recipes.reward_model import REWARD_MODEL
from purplerl.recipes.route import ROUTE
from purplerl.recipes.sft import SFT
from purplerl.train.recipe import Recipe

RECIPES: dict[str, Recipe] = {recipe.name: recipe for recipe in (ATTACK, DEFEND, SFT, PREFS, REWARD_MODEL, PPO,
                                                                  ROUTE, ADVERSARIAL)}

__all__ = ["RECIPES", "Recipe", "build_config", "load_config", "recipe_of"]


def recipe_of(data: dict | None) -> Recipe:
    """The row a config's `recipe` names (attack when it names none)."""
    from purplerl.errors import UserError

    name = (data or {}).get("recipe", "attack")
    if name not in RECIPES:
        raise UserError(f"unknown recipe '{name}' (known: {', '.join(RECIPES)})")
    return RECIPES[name]


def load_config(path=None, overrides: list[str] | None = None, base: dict | None = None):
    """A recipe's settings as the CLI reads them: its defaults (and `base`, e.g. a run's saved config) <- a config
    file <- `--section.field VALUE` overrides; the recipe is the one `base` names (attack by default)."""
    from purplerl.config import load_command_config

    recipe = recipe_of(base)
    return load_command_config(recipe.command(), path, overrides, base=recipe.migrated(base or {}, saved=True))


def build_config(data: dict):
    """Validate nested settings into the settings of the recipe they name (a saved config.yaml's older names
    migrated)."""
    return recipe_of(data).build(data, saved=True)
