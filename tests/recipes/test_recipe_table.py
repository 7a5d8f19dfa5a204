"""The recipe table: every listed setting is read, the settings counts, older config.yaml files, and a recipe that
lives only in its own module (the table's contract: the runner never asks which recipe it runs)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from purplerl.config import field_help, load_command_config, read_config_file
from purplerl.config.base import Section
from purplerl.config.sections import RunSettings
from purplerl.recipes import RECIPES
from purplerl.rewards.named import weights
from purplerl.runs.layout import CONFIG_FILE, METRICS_FILE
from purplerl.train.recipe import Recipe, RunNamePart, recipe_field
from purplerl.train.runner import run_recipe

FIXTURES = Path(__file__).parent.parent / "fixtures" / "old_runs"
# Recorded, not read: the recipe a config is for, and what the reward server said it serves.
METADATA = {"recipe"}
# Section methods that read every field to save, show or check the settings, not to use them
BOOKKEEPING = {"settings", "unread_fields", "_unread_refused", "listed", "check_params", "walk", "flat_config"}
SMALL = ["--steps", "2", "--batch_size", "2", "--save_every", "1", "--logging.progress", "false"]


def listed(config: Section) -> set[tuple[type, str]]:
    """(section class, field) of every setting --help lists for these values."""
    found: set[tuple[type, str]] = set()

    def walk(section: Section) -> None:
        for name in type(section).model_fields:
            if name in section.unread_fields():
                continue
            value = getattr(section, name)
            if isinstance(value, BaseModel):
                walk(value)
            else:
                found.add((type(section), name))

    walk(config)
    return found


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> set[tuple[type, str]]:
    """Every (section class, field) read through attribute access while the test runs."""
    seen: set[tuple[type, str]] = set()
    plain = BaseModel.__getattribute__

    def bookkeeping() -> bool:
        # the settings' own bookkeeping (saving config.yaml, deciding what is read, validating) reads every field
        # without using it: not a read
        frame = sys._getframe(2)
        for _ in range(8):
            if frame is None:
                return False
            if frame.f_code.co_name in BOOKKEEPING:
                return True
            frame = frame.f_back
        return False

    def tracked(self: Any, name: str) -> Any:
        if not name.startswith("_") and name in type(self).model_fields and not bookkeeping():
            for cls in type(self).__mro__:
                seen.add((cls, name))
        return plain(self, name)

    monkeypatch.setattr(Section, "__getattribute__", tracked)
    return seen


@pytest.mark.parametrize("name, extra", [
    ("attack", ["--group_size", "2", "--max_new_tokens", "4"]),
    ("defend", ["--group_size", "2", "--max_new_tokens", "4", "--defend.noiser_warmup", "1",
                "--defend.noiser_every", "1"]),
    ("sft", []),
    ("ppo", ["--group_size", "2", "--max_new_tokens", "4", "--training.ppo_epochs", "2"]),
    ("route", ["--group_size", "2", "--max_new_tokens", "4", "--route.eval_prompts", "2", "--route.eval_n", "2"]),
    ("adversarial", ["--group_size", "2", "--max_new_tokens", "4", "--turns", "2"]),
])
def test_every_listed_setting_is_read(name: str, extra: list[str], tiny_model_dir: Path, tmp_path: Path,
                                      reads: set[tuple[type, str]]) -> None:
    """A recipe run on the tiny model (setup, two steps, checkpoints) reads every setting its --help lists."""
    recipe = RECIPES[name]
    if name == "sft":
        data = tmp_path / "chats.jsonl"
        data.write_text("".join(f'{{"prompt": "say {i}", "completion": "ok {i}"}}\n' for i in range(8)))
        extra = ["--data", str(data)]
    args = ["--model", str(tiny_model_dir), "--output_dir", str(tmp_path / "runs"), *SMALL, *extra]
    config = load_command_config(recipe.command(), None, args)
    shown = listed(config)  # before the run: listing reads every field itself
    reads.clear()
    run_recipe(recipe, config)
    unread = sorted(f"{cls.__name__}.{field}" for cls, field in shown - reads if field not in METADATA)
    assert not unread, f"{name} lists settings nothing read: {unread}"


@pytest.mark.parametrize("name, at_most", [("attack", 60), ("sft", 45)])
def test_settings_counts(name: str, at_most: int) -> None:
    """The settings --help lists at the defaults: at most 60 for attack (TRL's GRPOConfig declares 79), 45 for SFT."""
    command = RECIPES[name].command()
    rows = field_help(command.schema, command.defaults, settings=load_command_config(command))
    assert len(rows) <= at_most, [r[0] for r in rows]


RL_RECIPES = ("attack", "defend", "ppo", "route", "adversarial")
# the recipe's own sections: what it adds to the RL settings every RL recipe lists
OWN = {"attack": "attack.", "defend": "defend.", "ppo": "critic.", "route": "route.", "adversarial": "adversarial."}


def _leaves(model: type[BaseModel]) -> int:
    """The leaf fields of a settings tree, read or not."""
    return sum(_leaves(info.annotation) if isinstance(info.annotation, type) and
               issubclass(info.annotation, BaseModel) else 1 for info in model.model_fields.values())


@pytest.mark.parametrize("name", RL_RECIPES)
def test_rl_recipes_list_at_most_60_settings(name: str) -> None:
    """A reward term carries its own parameters (issue 35): they are no settings of the recipe, which lists at its
    defaults at most 60 settings, its own section included (a Spec setting such as training.optimizer is one row);
    attack's whole tree has at most 80 leaves (127 when every registered term's parameters were sections of it)."""
    command = RECIPES[name].command()
    rows = [r[0] for r in field_help(command.schema, command.defaults, settings=load_command_config(command))]
    shared = [row for row in rows if not row.startswith(OWN[name])]
    listed = _help_options(command)  # counted as --help shows them: every `  --` line of its settings
    print(f"{name}: {len(listed)} listed in --help ({len(shared)} shared RL settings), "
          f"{_leaves(command.schema)} leaves")
    assert sorted(listed) == sorted("--" + row for row in rows)  # each setting once, and nothing else as one
    assert len(listed) <= 60, listed  # the recipe's own section included (issue 35: every RL recipe <= 60 listed)
    assert not [row for row in rows if row.startswith("reward.") and row.count(".") > 1]  # no term's parameter
    if name == "attack":
        assert _leaves(command.schema) <= 80


def _help_options(command: Any) -> list[str]:
    """The options --help's settings table lists on lines of their own (`  --NAME ...`), in its order."""
    from purplerl.cli.base import config_help
    return [line.split()[0] for line in config_help(command) if line.startswith("  --")]


def _count(command: Any) -> int:
    return len(field_help(command.schema, command.defaults, settings=load_command_config(command)))


def test_defend_and_tamper_stay_near_attack() -> None:
    from purplerl.experiments.tamper.settings import TAMPER

    attack = _count(RECIPES["attack"].command())
    assert _count(RECIPES["defend"].command()) <= attack + 8
    assert _count(TAMPER) <= attack + 25


def test_attack_has_no_noiser_and_sft_no_rl_fields() -> None:
    attack = {row[0] for row in field_help(RECIPES["attack"].settings)}
    sft = {row[0] for row in field_help(RECIPES["sft"].settings)}
    assert not [f for f in attack if "noiser" in f]
    assert not [f for f in sft if f.startswith(("reward.", "sampling.")) or "collapse" in f or "clip" in f]
    assert "attack.early_stop_toxicity" in attack and "training.early_stop_toxicity" not in attack


@pytest.mark.parametrize("args, says", [
    (["--engine.vllm_is_cap", "3"], "vllm_is_cap is read only when engine.kind is vllm"),
    (["--training.clip_low", "0.1"], "clip_low is read only when training.loss clips the ratio"),
    (["--training.collapse_top_share", "0.5"], "collapse_top_share is read only when training.collapse_stop"),
    (["--reward.terms.toxicity.params.timeout_s", "3"], "timeout_s is read only when url is set"),
    (["--reward.toxicity.timeout_s", "3"], "timeout_s is read only when url is set"),  # the older spelling
    # a term's parameters, for a term the reward does not use
    (["--reward.terms.entropy_bonus.params.cap", "2"], "reward.terms.entropy_bonus.params sets parameters of term "
                                                       "'entropy_bonus', which reward.terms does not use"),
    (["--reward.entropy_bonus.cap", "2"], "reward.entropy_bonus sets parameters of term 'entropy_bonus', which "
                                          "reward.terms does not use"),
    (["--training.noiser", "true"], "unknown field"),
])
def test_a_setting_nothing_reads_is_refused(args: list[str], says: str) -> None:
    from purplerl.errors import UserError

    with pytest.raises(UserError, match=says):
        load_command_config(RECIPES["attack"].command(), None, args)


def test_engine_fields_follow_the_kind() -> None:
    command = RECIPES["attack"].command()
    local = {r[0] for r in field_help(command.schema, settings=load_command_config(command))}
    vllm = {r[0] for r in field_help(command.schema, settings=load_command_config(command, None, ["--engine", "vllm"]))}
    assert "engine.procs" in local and not [f for f in local if "vllm" in f or "tinker" in f]
    assert "engine.vllm_is_cap" in vllm and "engine.procs" not in vllm


@pytest.mark.parametrize("name", ["attack", "defend", "sft", "adversarial"])
def test_an_older_config_yaml_reads_as_the_same_settings(name: str) -> None:
    """The fixtures were written by the purplerl before this structure: the same experiment comes back."""
    config = RECIPES[name].build(read_config_file(FIXTURES / f"{name}.yaml"), saved=True)
    if name == "attack":  # written with --refusal_penalty 1 --repetition_penalty 0.25 --repetition_ngram 4 ...
        assert weights(config.reward.terms) == {"toxicity": 1.0, "repetition": -0.25, "refusal": -1.0}
        assert config.reward.terms["repetition"].params == {"ngram": 4}
        assert config.engine.fast_paths == ["cuda_graphs", "fused_lora"]
        assert config.engine.micro_batch_tokens == 2048 and config.training.optimizer.betas == (0.9, 0.99)
        assert config.attack.early_stop_toxicity == 0.8
    if name == "defend":
        assert (config.defend.noiser, config.defend.noiser_warmup, config.defend.noiser_epsilon) == (True, 3, 0.2)
        assert weights(config.reward.terms) == {"response_entropy": -1.0, "toxicity": 0.0, "repetition": 0.0}
    if name == "sft":
        assert config.sft.max_tokens == 512 and config.training.lr == 0.0003
    if name == "adversarial":  # written with engine.autocast_bf16, advantage_std, adam_eps, weight_decay, the judge's
        # reads and unsafe_at as settings of their own (issue 35 folded each into one setting)
        assert config.model.dtype == "autocast_bf16" and config.training.advantage == "grpo_std"
        assert (config.training.optimizer.eps, config.training.optimizer.weight_decay) == (1e-6, 0.01)
        assert config.training.optimizer.betas == (0.9, 0.999) and config.training.optimizer.name == "adamw"
        judge = config.adversarial.judge
        assert (judge.fn, judge.reads, judge.unsafe_at, judge.params["threshold"]) == ("compliance", "dialogue", 0.7,
                                                                                      0.89)
        assert config.training.early_stop_repetition == 0.4


def test_an_older_attack_run_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A run whose config.yaml is in the older layout continues with --resume."""
    recipe = RECIPES["attack"]
    args = ["--model", str(tiny_model_dir), "--output_dir", str(tmp_path), "--name", "old", *SMALL,
            "--steps", "1", "--group_size", "2", "--max_new_tokens", "4", "--repetition_penalty", "0.25"]
    run_recipe(recipe, load_command_config(recipe.command(), None, args))
    run_dir = tmp_path / "old"
    old = yaml.safe_load((FIXTURES / "attack.yaml").read_text())
    old["model"]["name"] = str(tiny_model_dir)
    old["run"].update(output_dir=str(tmp_path), name="old", save_every=1)
    old["training"].update(steps=1, batch_size=2, micro_batch_tokens=4096, adam_beta2=0.999)
    old["sampling"].update(group_size=2, max_new_tokens=4)
    old["reward"].update(refusal_penalty=0.0, repetition_ngram=3)
    old["model"]["merged_sampler"] = True
    old["logging"]["progress"] = False
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(old))
    saved = recipe.build(read_config_file(run_dir / CONFIG_FILE), saved=True)
    resumed = load_command_config(recipe.command(), None, ["--steps", "2"], base=recipe.migrated(
        read_config_file(run_dir / CONFIG_FILE), saved=True))
    assert saved.reward.terms["repetition"].weight == -0.25
    summary = run_recipe(recipe, resumed, resume_dir=run_dir)
    assert summary["last_step"] == 2
    assert [r["step"] for r in map(yaml.safe_load, (run_dir / METRICS_FILE).read_text().splitlines())] == [1, 2]


def test_a_run_of_the_term_sections_layout_resumes_unchanged(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A run whose config.yaml and config_history.jsonl hold the layout before a term carried its parameters
    (reward.terms of weights, reward.toxicity and reward.repetition sections: the fixture, as that purplerl wrote
    it) reads as the same settings, and its resume records no setting change."""
    from purplerl.launch import run_settings
    from purplerl.runs.layout import HISTORY_FILE
    from purplerl.train.runner import saved_config, saved_settings

    recipe = RECIPES["attack"]
    args = ["--model", str(tiny_model_dir), "--output_dir", str(tmp_path), "--name", "old", *SMALL, "--steps", "1",
            "--group_size", "2", "--max_new_tokens", "4", "--repetition_penalty", "0.25",
            "--reward.terms.repetition.params.ngram", "4"]
    run_recipe(recipe, load_command_config(recipe.command(), None, args))
    run_dir = tmp_path / "old"
    now = saved_config(recipe, run_dir).settings()  # what this purplerl recorded for the same run
    old = yaml.safe_load((FIXTURES / "attack_term_sections.yaml").read_text())
    old["model"]["name"] = str(tiny_model_dir)
    old["run"].update(output_dir=str(tmp_path), name="old", save_every=1)
    old["training"].update(steps=2, batch_size=2)  # a run of 2 steps, stopped after its first
    old["sampling"].update(group_size=2, max_new_tokens=4)
    old["logging"]["progress"] = False
    assert set(old["reward"]) == {"kl_beta", "kl_estimator", "kl_in", "zscore", "terms", "toxicity", "repetition"}
    history = [json.loads(line) for line in (run_dir / HISTORY_FILE).read_text().splitlines()]
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(old))
    (run_dir / HISTORY_FILE).write_text(json.dumps({**history[0], "config": old}) + "\n")

    read = saved_config(recipe, run_dir)
    # the old run keeps the fast paths it recorded: one added since (packed_decode) is not turned on in its resume
    assert read.settings() == {**now, "training": {**now["training"], "steps": 2},
                               "engine": {**now["engine"], "fast_paths": old["engine"]["fast_paths"]}}
    assert read.reward.terms["repetition"].params == {"ngram": 4} and read.reward.terms["repetition"].weight == -0.25
    summary = run_recipe(recipe, run_settings(recipe, saved=saved_settings(recipe, run_dir)), resume_dir=run_dir)
    assert summary["last_step"] == 2
    rows = [json.loads(line) for line in (run_dir / HISTORY_FILE).read_text().splitlines()]
    assert rows[-1]["from_step"] == 2 and rows[-1]["changed"] == {}  # the resume changed no setting
    assert "# from step" not in (run_dir / CONFIG_FILE).read_text()
    assert "toxicity" not in yaml.safe_load((run_dir / CONFIG_FILE).read_text())["reward"]  # today's layout


class HelloConfig(Section):
    greeting: str = Field("hello", description="what each step logs")


class HelloSettings(RunSettings):
    recipe: str = recipe_field("hello")
    hello: HelloConfig = Field(default_factory=HelloConfig, description="the greeting")


def _hello_prepare(config: Any):
    def bind(engine: Any, run_dir: Path):
        def step(step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
            return {"hello/len": float(len(config.hello.greeting)), "step_seen": float(step)}, []
        return step, lambda metrics: None
    return bind


def test_a_recipe_of_its_own_runs_without_the_runner_knowing_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A recipe is its module's row: settings, defaults, run name, hooks. Nothing below names it."""
    hello = Recipe(name="hello", settings=HelloSettings,
                   help="Say hello.", prepare=_hello_prepare, defaults={"training": {"steps": 2}},
                   run_name=(RunNamePart("g", lambda c: c.hello.greeting),))
    config = load_command_config(hello.command(), None, ["--model.name", str(tiny_model_dir), "--run.output_dir",
                                                         str(tmp_path), "--hello.greeting", "hi"])
    summary = run_recipe(hello, config)
    run_dir = Path(summary["run_dir"])
    assert run_dir.name == f"hello_{tiny_model_dir.name.replace('_', '-')}_ghi_s0"
    assert (run_dir / CONFIG_FILE).read_text().count("greeting: hi") == 1
    rows = [yaml.safe_load(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    assert [(r["step"], r["hello/len"]) for r in rows] == [(1, 2.0), (2, 2.0)]
    shutil.rmtree(run_dir)


def test_sample_and_eval_read_every_setting_they_list(tiny_model_dir: Path, tmp_path: Path,
                                                      reads: set[tuple[type, str]]) -> None:
    """The commands that are not recipes: `sample` and `eval` (every suite) on the tiny model."""
    from purplerl.config import EVAL, SAMPLE
    from purplerl.eval.run import run_eval
    from purplerl.runs.sample import generate

    sample = load_command_config(SAMPLE, None, ["--model", str(tiny_model_dir), "--prompt", "hi", "--n", "2",
                                                "--max_new_tokens", "3"])
    evaluate = load_command_config(EVAL, None, [
        "--model", str(tiny_model_dir), "--limit", "2", "--n", "2", "--max_new_tokens", "3", "--batch_size", "2",
        "--utility_limit", "2", "--utility_tokens", "8", "--choice_limit", "2", "--out", str(tmp_path / "eval")])
    for config, run in ((sample, lambda c: generate(c, announce=lambda _: None)),
                        (evaluate, lambda c: run_eval(c, announce=lambda _: None))):
        shown = listed(config)
        reads.clear()
        run(config)
        unread = sorted(f"{cls.__name__}.{field}" for cls, field in shown - reads)
        assert not unread, f"{type(config).__name__} lists settings nothing read: {unread}"
