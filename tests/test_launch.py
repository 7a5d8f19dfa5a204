"""purplerl.launch: the one way from settings to a run. Every path gets its recipe's own defaults, named rewards
expanded into their terms, and a config of another recipe refused; and no other module builds a recipe's settings
itself."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from purplerl.errors import UserError
from purplerl.launch import recipe_named, run_dir, run_settings
from purplerl.recipes import RECIPES
from purplerl.rewards.named import expand_named

PACKAGE = Path(__file__).resolve().parents[1] / "purplerl"


def test_a_recipe_is_found_by_name_or_refused_naming_the_known_ones() -> None:
    assert recipe_named("sft") is RECIPES["sft"]
    with pytest.raises(UserError, match=r"^unknown recipe 'grpo' \(known: attack, defend, sft, .*\)$"):
        recipe_named("grpo")


def test_every_path_gets_the_recipes_own_defaults() -> None:
    # a config built in code (align's stages, tamper's fine-tunes) used to skip the row's defaults
    for name, recipe in RECIPES.items():
        built = run_settings(name, base={"run": {"name": "x"}})
        dumped = built.model_dump(mode="json")
        for section, fields in recipe.defaults.items():
            for field, value in fields.items():
                if field != "terms":  # reward terms are validated into their specs
                    assert dumped[section][field] == json.loads(json.dumps(value)), (name, section, field)
        assert built.run.name == "x" and built.recipe == name


def test_layers_apply_in_order_and_a_named_reward_becomes_its_terms(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("training: {lr: 0.002, steps: 7}\n")
    config = run_settings("attack", base={"training": {"lr": 0.001, "steps": 3, "batch_size": 4}}, file=file,
                          options=["--lr", "0.003"], reward="sentence_length_5_with_happy")
    assert (config.training.lr, config.training.steps, config.training.batch_size) == (0.003, 7, 4)
    expected = expand_named("sentence_length_5_with_happy")
    assert set(config.reward.terms) == set(expected)
    assert {name: spec.weight for name, spec in config.reward.terms.items()} == \
        {name: spec["weight"] for name, spec in expected.items()}


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"base": {"recipe": "sft"}}, "config is for recipe 'sft', not 'attack'"),
    ({"rewards_file": "r.yaml"}, "adds named rewards to choose from: choose one with --reward NAME"),
    ({"reward": "toxicity", "options": ["--reward.terms", "{toxicity: 1.0}"]}, "not both"),
])
def test_mistakes_are_one_line(kwargs: dict, says: str) -> None:
    with pytest.raises(UserError, match=says) as err:
        run_settings("attack", **kwargs)
    assert "\n" not in str(err.value)


def test_the_run_dir_is_the_output_dir_and_the_name() -> None:
    config = run_settings("sft", options=["--output_dir", "/tmp/out", "--name", "mine"])
    assert run_dir(RECIPES["sft"], config) == Path("/tmp/out/mine")


def test_no_other_module_builds_a_recipes_settings() -> None:
    """`Recipe.build` and `load_command_config(recipe.command() ...)` are the launch module's (and the runner's
    check of a saved segment): a second path would skip the recipe's defaults or its named rewards."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in ("purplerl/launch.py", "purplerl/train/recipe.py", "purplerl/train/runner.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            builds = isinstance(func, ast.Attribute) and func.attr == "build" and isinstance(func.value, ast.Name) \
                and func.value.id.isupper()  # ATTACK.build(...)
            first = node.args[0] if node.args else None
            loads = isinstance(func, ast.Name) and func.id == "load_command_config" and isinstance(first, ast.Call) \
                and isinstance(first.func, ast.Attribute) and first.func.attr == "command"  # recipe.command()
            if builds or loads:
                found.append(f"{rel}:{node.lineno}")
    assert not found, found


def test_the_pipeline_reads_what_a_recipe_produces() -> None:
    assert {name for name, recipe in RECIPES.items() if recipe.produces == "scorer"} == {"reward-model", "prm"}
    # each scorer names the registered term that reads its runs (serve-reward --model RUN_DIR, a pipeline's judge)
    assert {name: recipe.scorer_term for name, recipe in RECIPES.items() if recipe.scorer_term} == {
        "reward-model": "reward_model", "prm": "prm"}
    for changed in ({"scorer_term": None}, {"produces": "policy"}):
        with pytest.raises(ValueError, match="recipe prm: a scorer names its reward term .*and only a scorer"):
            dataclasses.replace(RECIPES["prm"], **changed)
