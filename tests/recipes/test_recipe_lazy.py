"""A recipe's row names its step's functions as "module:NAME" (purplerl.train.recipe.lazy), which the CLI reads for
--help without importing them: each name must resolve, though only a run calls it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from purplerl.train.recipe import lazy

RECIPES_DIR = Path(__file__).parents[2] / "purplerl" / "recipes"
LAZY = re.compile(r'lazy\("(purplerl(?:\.\w+)+):(\w+)"\)')


def test_every_lazy_name_of_a_row_is_a_function() -> None:
    found = [(str(path.relative_to(RECIPES_DIR)), module, name) for path in sorted(RECIPES_DIR.rglob("*.py"))
             for module, name in LAZY.findall(path.read_text())]
    assert found, "no recipe names a lazy step: the pattern no longer matches lazy(...)"
    missing = [f"{where}: {module}:{name}" for where, module, name in found
               if not callable(getattr(importlib.import_module(module), name, None))]
    assert missing == [], f"these names resolve to no function: {missing}"


def test_lazy_calls_the_named_function_with_its_arguments() -> None:
    assert lazy("purplerl.train.stops:first_stop")()({"step": 1.0}) is None  # no rules: never stops
