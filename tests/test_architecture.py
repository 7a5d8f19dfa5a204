"""The import direction of docs/architecture.md: the import-linter contracts in pyproject.toml, and the dotted
"module:NAME" strings that registries resolve with importlib, which import-linter cannot see."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "purplerl"
DOTTED = re.compile(r"^purplerl(\.\w+)+:\w+$")


def test_the_import_linter_contracts_hold(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    # in this process (what `lint-imports --no-cache` runs, without a child's start-up); it reads pyproject.toml
    # from the working directory and builds the import graph from the source files, not from sys.modules
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    code = lint_imports(no_cache=True, no_logo=True)
    assert code == 0, f"lint-imports exited {code}:\n{capsys.readouterr().out}"


def layers() -> list[tuple[set[str], bool]]:
    """The layers contract's layers, top first: (the top-level modules in it, whether they are independent)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers" and c.get("containers") == ["purplerl"]]
    parsed = []
    for layer in contract["layers"]:
        independent = ":" not in layer
        names = re.split(r"[|:]", layer)
        parsed.append(({name.strip().strip("()") for name in names}, independent))
    return parsed


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def top(module: str) -> str | None:
    """The top-level module of purplerl that `module` is in (None for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def dotted_strings() -> list[tuple[str, int, str]]:
    """(holding module, line, target module) of every "purplerl.x.y:NAME" string constant in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.match(node.value):
                found.append((module_of(path), node.lineno, node.value.split(":", 1)[0]))
    return found


def test_dotted_registry_strings_point_down_the_layers() -> None:
    """A "module:NAME" string resolved with importlib is an import: it may name its own top-level module or a
    lower layer, never a higher one, nor an independent sibling in its own layer."""
    place = {name: (index, independent) for index, (names, independent) in enumerate(layers()) for name in names}
    problems = []
    for holder, line, target in dotted_strings():
        if not is_module(target):
            problems.append(f"{holder}:{line} names {target}, which is no module")
            continue
        if top(holder) is None or top(holder) == top(target):
            continue
        (holder_index, _), (target_index, independent) = place[top(holder)], place[top(target)]
        if target_index < holder_index:
            problems.append(f"{holder}:{line} -> {target}: {top(target)} is above {top(holder)}")
        elif target_index == holder_index and independent:
            problems.append(f"{holder}:{line} -> {target}: {top(target)} and {top(holder)} are independent siblings")
    assert problems == [], "dotted strings that point up the layers (register from the lower module instead):\n" + \
        "\n".join(problems)


def recipe_folder(module: str) -> str | None:
    """The folder of recipes/ (a recipe, or the shared helper `summary`) that `module` is in; None elsewhere."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "recipes" else None


def test_a_recipe_s_dotted_strings_name_no_other_recipe() -> None:
    """The recipes-independent contract for "module:NAME" strings: a recipe's strings name its own folder, the shared
    helper or a lower layer, never another recipe's folder."""
    problems = [f"{holder}:{line} -> {target}" for holder, line, target in dotted_strings()
                if recipe_folder(holder) not in (None, "summary")
                and recipe_folder(target) not in (None, "summary", recipe_folder(holder))]
    assert problems == [], "dotted strings from one recipe into another:\n" + "\n".join(problems)


def test_one_recipe_one_folder() -> None:
    """recipes/ holds the table (__init__.py), the shared helper (summary.py) and one package per row of the table,
    named as the row (reward-model: reward_model/): a new recipe's body has one place to go."""
    from purplerl.recipes import RECIPES

    recipes = PACKAGE / "recipes"
    loose = sorted(p.name for p in recipes.glob("*.py"))
    folders = {p.name for p in recipes.iterdir() if (p / "__init__.py").is_file()}
    assert loose == ["__init__.py", "summary.py"]
    assert folders == {name.replace("-", "_") for name in RECIPES}
    for name, recipe in RECIPES.items():
        row = importlib.import_module(f"purplerl.recipes.{name.replace('-', '_')}")
        assert any(value is recipe for value in vars(row).values()), f"{name}'s row is not in its folder"
