"""The recipe table: one row per recipe folder. The CLI makes a command of each row; the runner, the loop and the
engines take a row and never ask which one it is; purplerl.launch turns settings into a row's run. A new recipe is
its folder, recipes/NAME/ (`__init__.py`: its settings, defaults, run name, summary metrics, early stops and hooks,
the `Recipe(...)` row; `step.py`: its step, where the shared `rl_step` does not fit; any helper only it uses), one
row here, and its tests. `summary.py` is the recipes' shared helper, not a recipe."""

from purplerl.recipes.adversarial import ADVERSARIAL
from purplerl.recipes.attack import ATTACK
from purplerl.recipes.defend import DEFEND
from purplerl.recipes.ppo import PPO
from purplerl.recipes.prefs import PREFS
from purplerl.recipes.prm import PRM
from purplerl.recipes.reward_model import REWARD_MODEL
from purplerl.recipes.route import ROUTE
from purplerl.recipes.sft import SFT
from purplerl.train.recipe import Recipe

RECIPES: dict[str, Recipe] = {recipe.name: recipe for recipe in (ATTACK, DEFEND, SFT, PREFS, REWARD_MODEL, PRM,
                                                                  PPO, ROUTE, ADVERSARIAL)}

__all__ = ["RECIPES", "Recipe"]
