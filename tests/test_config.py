"""Config loading: defaults, YAML/JSON files, flat and dotted CLI overrides, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from purplerl.config import (
    ALIGN,
    EMBEDDED_MODEL,
    EVAL,
    PREPARE,
    SAMPLE,
    Command,
    RewardServerConfig,
    build,
    build_server_config,
    field_help,
    load_command_config,
    read_config_file,
    save_config,
)
from purplerl.config.base import Section, Spec
from purplerl.errors import UserError
from purplerl.experiments.sweep.settings import SWEEP
from purplerl.experiments.tamper.settings import TAMPER
from purplerl.launch import run_settings
from purplerl.recipes import RECIPES
from purplerl.recipes.attack import ATTACK, AttackSettings
from purplerl.rewards.named import weights

EXAMPLE_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "configs" / "attack.yaml"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _verl_export() -> Command:
    from purplerl.cli import _verl_command

    return _verl_command()


# every command that reads settings, by its name on the command line
COMMANDS: dict[str, Command] = {
    **{name: recipe.command() for name, recipe in RECIPES.items()},
    "align": ALIGN, "tamper-test": TAMPER, "eval": EVAL, "sample": SAMPLE, "data prepare": PREPARE,
    "verl export": _verl_export(), "sweep": SWEEP}


def _attack_defaults() -> AttackSettings:
    """The attack recipe's settings at its defaults: the tree's own, with the recipe's changes (its target is the
    aligned model)."""
    return AttackSettings.model_validate(ATTACK.command().defaults)


def _leaf_fields(model: type[BaseModel], prefix: str = "", specs_as_rows: bool = False) -> list[str]:
    """The dotted leaf fields of a settings tree; `specs_as_rows`: a Spec setting (training.optimizer) as the one
    row --help lists for it, not its fields."""
    names = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if specs_as_rows and isinstance(ann, type) and issubclass(ann, Spec):
            names.append(f"{prefix}{name}")
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            names += _leaf_fields(ann, f"{prefix}{name}.", specs_as_rows)
        else:
            names.append(f"{prefix}{name}")
    return names


def _read_leaves(section: Section, prefix: str = "") -> set[str]:
    """Dotted names of the leaf fields these values make read (what config.yaml and --help hold for them)."""
    names: set[str] = set()
    for name in type(section).model_fields:
        if name in section.unread_fields():
            continue
        value = getattr(section, name)
        names |= _read_leaves(value, f"{prefix}{name}.") if isinstance(value, Section) else {f"{prefix}{name}"}
    return names


def _paths(node: dict, fields: set[str], prefix: str = "") -> set[str]:
    """Dotted paths of the values in nested data (a dict-valued field such as data.filters is one value)."""
    out: set[str] = set()
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        out |= _paths(value, fields, dotted + ".") if isinstance(value, dict) and dotted not in fields else {dotted}
    return out


def _unknown_flat_targets(command: Command) -> list[str]:
    """The flat names' targets that are no field of the command, and that its migration does not move onto one
    (an older name, e.g. --repetition_penalty -> reward.terms, is fine). A Spec setting is a target (--judge NAME
    sets the judge's shorthand field)."""
    leaves = set(_leaf_fields(command.schema)) | set(_leaf_fields(command.schema, specs_as_rows=True))
    bad = []
    for dotted in sorted(set(command.flat.values()) - leaves):
        moved = command.migrate(_nested(dotted, 0.3)) if command.migrate is not None else _nested(dotted, 0.3)
        if not _paths(moved, leaves) <= leaves:
            bad.append(dotted)
    return bad


# ----------------------------------------------------------------------------------------------- defaults


def test_defaults():
    cfg = run_settings("attack")
    assert cfg == _attack_defaults()
    assert cfg.recipe == "attack"
    # the tree's default model is the instruct model; the attack recipe's is the aligned one (safety to break)
    assert AttackSettings().model.name == EMBEDDED_MODEL
    assert cfg.model.name == "embedded:smollm2-135m-safe"
    assert cfg.training.lr == 1e-4
    assert cfg.training.steps == 60
    assert cfg.sampling.group_size == 4
    assert cfg.reward.kl_beta == 0.1
    assert cfg.reward.zscore is False
    assert cfg.reward.terms["toxicity"].params["model"] == "embedded"
    assert cfg.run.save_every == 10


# ---------------------------------------------------------------------------------------------- files


def test_yaml_file(tmp_path: Path):
    path = _write(tmp_path / "c.yaml", "training:\n  lr: 0.001\n  steps: 5\nreward:\n  kl_beta: 0.3\n")
    cfg = run_settings("attack", file=path)
    assert (cfg.training.lr, cfg.training.steps, cfg.reward.kl_beta) == (0.001, 5, 0.3)
    assert cfg.training.batch_size == AttackSettings().training.batch_size  # untouched fields keep their defaults


def test_yaml_exponent_without_dot(tmp_path: Path):
    # YAML 1.1 reads `1e-4` as a string; the config must still take it as the number
    cfg = run_settings("attack", file=_write(tmp_path / "c.yaml", "training:\n  lr: 1e-4\n"))
    assert cfg.training.lr == pytest.approx(1e-4)


def test_json_file(tmp_path: Path):
    path = _write(tmp_path / "c.json", json.dumps({"sampling": {"group_size": 6}, "reward": {"zscore": True}}))
    cfg = run_settings("attack", file=path)
    assert cfg.sampling.group_size == 6
    assert cfg.reward.zscore is True


def test_empty_yaml_file_gives_defaults(tmp_path: Path):
    assert run_settings("attack", file=_write(tmp_path / "c.yaml", "")) == _attack_defaults()


# ------------------------------------------------------------------------------------------- overrides


def test_flat_overrides():
    cfg = run_settings("attack", options=["--kl_beta", "0.2", "--lr", "1e-4", "--steps", "7", "--model", "/some/model"])
    assert cfg.reward.kl_beta == 0.2
    assert cfg.training.lr == pytest.approx(1e-4)
    assert cfg.training.steps == 7
    assert cfg.model.name == "/some/model"


def test_dotted_overrides():
    # the toxicity term's batch_size is read only with an HF classifier, which needs its label
    cfg = run_settings("attack", options=["--reward.kl_beta", "0.2", "--reward.zscore=true",
                                          "--reward.terms.toxicity.params.model=org/clf",
                                          "--reward.terms.toxicity.params.label=toxic",
                                          "--reward.terms.toxicity.params.batch_size=4"])
    assert cfg.reward.kl_beta == 0.2
    assert cfg.reward.zscore is True
    assert cfg.reward.terms["toxicity"].params["batch_size"] == 4



def test_dashes_in_option_names():
    cfg = run_settings("attack", options=["--kl-beta", "0.25", "--training.batch-size", "3"])
    assert cfg.reward.kl_beta == 0.25
    assert cfg.training.batch_size == 3


def test_override_values_are_yaml():
    cfg = run_settings("attack", options=["--attack.early_stop_toxicity", "null", "--data.filters", "{is_safe: false}",
                                          "--zscore", "true"])
    assert cfg.attack.early_stop_toxicity is None
    assert cfg.data.filters == {"is_safe": False}
    assert cfg.reward.zscore is True


@pytest.mark.parametrize("value", ["123", "2024-05-01", "yes", "1.5", "on", "off", "no"])
def test_string_fields_keep_text_that_looks_like_another_type(value: str):
    cfg = run_settings("attack", options=["--name", value, "--system_prompt", value])
    assert cfg.run.name == value
    assert cfg.data.system_prompt == value


def test_null_for_optional_string_field():
    assert run_settings("attack", options=["--name", "null"]).run.name is None


def test_toxicity_label_keeps_int_or_name():
    base = ["--toxicity_model", "/some/classifier"]
    def label(*options: str) -> object:
        return run_settings("attack", options=[*base, *options]).reward.terms["toxicity"].params["label"]

    assert label("--toxicity_label", "1") == 1
    assert label("--toxicity_label", "toxic") == "toxic"
    # a label named like a YAML boolean stays a name; it would otherwise become the index True == 1
    assert label("--toxicity_label", "yes") == "yes"
    assert label("--reward.terms.toxicity.params.label", "yes") == "yes"


def test_precedence_defaults_file_cli(tmp_path: Path):
    path = _write(tmp_path / "c.yaml", "training:\n  lr: 0.001\n  steps: 5\n")
    cfg = run_settings("attack", file=path, options=["--steps", "9"])
    assert cfg.training.steps == 9  # CLI beats file
    assert cfg.training.lr == 0.001  # file beats default
    assert cfg.training.batch_size == AttackSettings().training.batch_size  # default where neither sets it


def test_file_overrides_base_and_keeps_siblings(tmp_path: Path):
    path = _write(tmp_path / "c.yaml", "reward:\n  kl_beta: 0.5\n")
    cfg = run_settings("attack", file=path, base={"reward": {"zscore": True, "kl_beta": 0.01}})
    assert cfg.reward.kl_beta == 0.5
    assert cfg.reward.zscore is True


def test_a_saved_config_keeps_its_own_reward_terms_and_a_file_changes_one_weight(tmp_path: Path):
    # a run's saved config is complete: its terms are the run's terms, not a union with the recipe's defaults (a
    # resumed route run trained on the defaults' terms besides its own before this was fixed)
    saved = {"reward": {"terms": {"toxicity": 1.0}, "kl_beta": 0.01}}
    resumed = load_command_config(ATTACK.command(), None, ["--steps", "4"], saved=saved)
    assert weights(resumed.reward.terms) == {"toxicity": 1.0}
    route = load_command_config(RECIPES["route"].command(), None, [],
                                saved={"reward": {"terms": {"e_count": {"fn": "regex_count", "weight": 1.0,
                                                                        "params": {"pattern": "e"}}}}})
    assert list(route.reward.terms) == ["e_count"]
    # a config file names what it changes: one weight of the default terms
    path = _write(tmp_path / "c.yaml", "reward:\n  terms: {refusal: -1.0}\n")
    assert weights(run_settings("attack", file=path).reward.terms) == {"toxicity": 1.0, "repetition": -0.3,
                                                                   "refusal": -1.0}


def test_every_flat_name_points_at_a_field():
    assert _unknown_flat_targets(ATTACK.command()) == []


# ---------------------------------------------------------------------------------------------- errors


def _error(path: str | Path | None = None, overrides: list[str] | None = None) -> str:
    with pytest.raises(UserError) as info:
        run_settings("attack", file=path, options=overrides)
    return str(info.value)


def test_unknown_top_level_key_in_file(tmp_path: Path):
    msg = _error(_write(tmp_path / "c.yaml", "bogus_section: 1\n"))
    assert "bogus_section" in msg and "unknown field" in msg


def test_unknown_nested_key_in_file(tmp_path: Path):
    msg = _error(_write(tmp_path / "c.yaml", "reward:\n  kl_betaa: 0.2\n"))
    assert "reward.kl_betaa" in msg and "unknown field" in msg


def test_unknown_nested_key_on_cli():
    msg = _error(None, ["--reward.kl_betaa", "0.2"])
    assert "reward.kl_betaa" in msg


@pytest.mark.parametrize(("args", "field"), [
    (["--lr", "-1"], "training.lr"),
    (["--group_size", "1"], "sampling.group_size"),
    (["--top_p", "1.5"], "sampling.top_p"),
    (["--reward.kl_beta", "-0.1"], "reward.kl_beta"),
])
def test_out_of_range(args: list[str], field: str):
    assert field in _error(None, args)


@pytest.mark.parametrize(("args", "field"), [
    (["--steps", "abc"], "training.steps"),
    (["--reward.zscore", "maybe"], "reward.zscore"),
    (["--dtype", "float64"], "model.dtype"),
])
def test_wrong_type(args: list[str], field: str):
    msg = _error(None, args)
    assert field in msg
    assert args[1] in msg  # the offending value is shown


def test_hf_toxicity_model_needs_label():
    assert "'reward.terms.toxicity.params': label is required" in _error(None, ["--toxicity_model", "some/classifier"])


def test_unknown_option():
    assert "--bogus" in _error(None, ["--bogus", "1"])


@pytest.mark.parametrize("args", [["--lr"], ["--lr", "--steps", "2"]])
def test_option_without_value(args: list[str]):
    assert "--lr" in _error(None, args)


def test_positional_argument():
    assert "stray" in _error(None, ["stray"])


def test_missing_config_file(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    msg = _error(missing)
    assert "not found" in msg and str(missing) in msg


def test_unparsable_yaml(tmp_path: Path):
    path = _write(tmp_path / "bad.yaml", "training: [unclosed\n  lr: 1\n")
    msg = _error(path)
    assert "cannot parse" in msg and str(path) in msg


def test_unparsable_json(tmp_path: Path):
    path = _write(tmp_path / "bad.json", "{\"training\": ")
    assert "cannot parse" in _error(path)


def test_non_mapping_yaml(tmp_path: Path):
    path = _write(tmp_path / "list.yaml", "- a\n- b\n")
    msg = _error(path)
    assert "mapping" in msg and str(path) in msg


def test_section_given_a_scalar(tmp_path: Path):
    msg = _error(_write(tmp_path / "c.yaml", "reward: 3\n"))
    assert "reward" in msg


# ----------------------------------------------------------------------------------- saving and --help


def test_save_config_round_trips(tmp_path: Path):
    cfg = run_settings("attack", options=["--kl_beta", "0.2", "--lr", "3e-5", "--toxicity_model", "org/clf",
                                          "--toxicity_label", "toxic", "--data.filters", "{is_safe: false}", "--name",
                                          "007"])
    save_config(cfg, tmp_path / "config.yaml")
    assert run_settings("attack", file=tmp_path / "config.yaml") == cfg
    assert read_config_file(tmp_path / "config.yaml")["reward"]["kl_beta"] == 0.2


@pytest.mark.parametrize("text", ["a # not a comment", "key: value", "two\nlines", "'quoted' \"both\"", "", "null",
                                  "- item", "{x: 1}", "trailing space "])
def test_save_config_round_trips_awkward_strings(tmp_path: Path, text: str):
    cfg = AttackSettings.model_validate({"data": {"system_prompt": text, "split": text or "x"}})
    save_config(cfg, tmp_path / "config.yaml")
    assert run_settings("attack", file=tmp_path / "config.yaml") == cfg


def test_save_config_of_defaults_lists_every_field_it_reads(tmp_path: Path):
    cfg = AttackSettings()
    save_config(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())

    def leaves(node: dict, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, value in node.items():
            is_section = isinstance(value, dict) and key not in ("filters", "terms")
            out |= leaves(value, f"{prefix}{key}.") if is_section else {f"{prefix}{key}"}
        return out

    assert leaves(saved) == _read_leaves(cfg)
    # the fields nothing reads at these values are left out (local engine, importance sampling, no reward server)
    assert not {"engine.vllm_is_cap", "training.clip_low"} & leaves(saved)
    assert "timeout_s" not in saved["reward"]["terms"]["toxicity"]["params"]
    assert {"training.lr", "reward.terms", "engine.fast_paths"} <= leaves(saved)


def test_field_help_covers_every_leaf_field():
    rows = field_help(AttackSettings)
    names = [name for name, _, _ in rows]
    # a Spec setting (training.optimizer) is one row; --help lists its fields below it
    assert sorted(names) == sorted(_leaf_fields(AttackSettings, specs_as_rows=True))
    assert ("training.optimizer", '"adamw"') in [(n, d) for n, d, _ in rows]
    assert len(names) == len(set(names))
    for name, default, desc in rows:
        assert desc.strip(), f"{name} has no description"
        json.loads(default)  # defaults are shown as JSON
    assert ("reward.kl_beta", "0.1") in [(n, d) for n, d, _ in rows]


def test_example_config_shows_the_defaults():
    if not EXAMPLE_CONFIG.is_file():
        pytest.skip(f"{EXAMPLE_CONFIG} does not exist yet")
    # the attack recipe's defaults: the global ones with its own changes (its target is the aligned model)
    assert run_settings("attack", file=EXAMPLE_CONFIG) == run_settings("attack", base={"recipe": "attack"})
    # it is meant to list every field the attack reads at its defaults, not only some
    assert "reward.kl_beta" in {n for n, _, _ in field_help(AttackSettings)}
    text = EXAMPLE_CONFIG.read_text()
    for name in _read_leaves(run_settings("attack")):
        assert f"{name.split('.')[-1]}:" in text, f"{name} missing from {EXAMPLE_CONFIG.name}"


# ------------------------------------------------------------------------- values YAML would mistype


def _typed_leaves(model: type[BaseModel], wanted: type, prefix: str = "") -> list[str]:
    """Dotted names of the leaf fields whose annotation admits `wanted` (float: `float | None` counts; a union that
    also admits a boolean, like logging.progress, does not: there the boolean means something)."""
    names = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            names += _typed_leaves(ann, wanted, f"{prefix}{name}.")
        elif ann is wanted or (wanted in getattr(ann, "__args__", ()) and bool not in ann.__args__):
            names.append(f"{prefix}{name}")
    return names


def _nested(dotted: str, value: object) -> dict:
    *sections, leaf = dotted.split(".")
    node: dict = {leaf: value}
    for part in reversed(sections):
        node = {part: node}
    return node


@pytest.mark.parametrize(("args", "field", "why"), [
    (["--steps", "yes"], "training.steps", "got a boolean"),
    (["--attack.early_stop_toxicity", ".nan"], "attack.early_stop_toxicity", "finite number"),
    (["--reward.terms", "{toxicity: .nan}"], "reward.terms.toxicity.weight", "finite number"),
    (["--training.optimizer.weight_decay", ".inf"], "training.optimizer.weight_decay", "finite number"),
    (["--training.weight_decay", ".inf"], "training.optimizer.weight_decay", "finite number"),  # the older name
    (["--reward.terms.toxicity.params.timeout_s", ".inf"], "reward.terms.toxicity.params.timeout_s", "finite number"),
    (["--reward.toxicity.timeout_s", ".inf"], "reward.terms.toxicity.params.timeout_s", "finite number"),
    (["--lr", "on"], "training.lr", "got a boolean"),
    (["--training.max_grad_norm", "-.inf"], "training.max_grad_norm", "finite number"),
])
def test_booleans_and_non_finite_numbers_are_refused_on_the_cli(args: list[str], field: str, why: str):
    msg = _error(None, args)
    assert f"config field '{field}'" in msg and why in msg, msg
    assert "\n" not in msg


def _holding(dotted: str, bad: float) -> tuple[str, object]:
    """(where the error points, the value of field `dotted`) with `bad` in it: a float inside a container sits in
    one (a reward term's weight, one of the Adam betas)."""
    if dotted.endswith(".terms"):
        return f"{dotted}.toxicity.weight", {"toxicity": bad}
    if dotted.endswith(".betas"):
        return f"{dotted}.1", [0.9, bad]
    return dotted, bad


def _term_parameters(wanted: type) -> list[str]:
    """reward.terms.NAME.params.FIELD of every registered term's parameter whose annotation admits `wanted`, and a
    term's detector threshold: a term carries its own settings, and they are checked like the recipe's."""
    from purplerl.rewards.registry import REWARD_TERMS

    hack_at = ["reward.terms.toxicity.hack_at"] if wanted is float else []
    return hack_at + [name for term in REWARD_TERMS.values() if term.params is not None
                      for name in _typed_leaves(term.params, wanted, f"reward.terms.{term.name}.params.")]


def _saved(dotted: str, value: object) -> dict:
    """A saved config holding `value` at `dotted`; a reward term's parameter or threshold sits in a term that has a
    weight, as every term of a saved config has."""
    parts = dotted.split(".")
    if parts[:2] == ["reward", "terms"] and len(parts) > 3:
        entry = {"weight": 1.0, **_nested(".".join(parts[3:]), value)}
        return {"reward": {"terms": {parts[2]: entry}}}
    return _nested(dotted, value)


def test_every_float_field_refuses_nan_and_inf():
    # reward.terms holds the terms (purplerl.rewards.named.TermSpec): their weights, thresholds and parameters are
    # floats too
    floats = [*_typed_leaves(AttackSettings, float), "reward.terms", *_term_parameters(float)]
    # the walk must see the fields the issue names, or this test checks nothing
    assert {"attack.early_stop_toxicity", "reward.terms", "training.optimizer.weight_decay", "training.optimizer.betas",
            "reward.terms.toxicity.params.timeout_s", "reward.terms.entropy_bonus.params.cap",
            "reward.terms.toxicity.hack_at"} <= set(floats)
    assert len(floats) >= 20
    for dotted in floats:
        for bad in (float("nan"), float("inf"), float("-inf")):
            where, value = _holding(dotted, bad)
            with pytest.raises(UserError) as err:
                run_settings("attack", saved=_saved(dotted, value))
            assert str(err.value).startswith(f"config field '{where}': Input should be a finite number"), err.value
            assert "\n" not in str(err.value)


def test_every_int_field_refuses_booleans():
    ints = [*_typed_leaves(AttackSettings, int), *_term_parameters(int)]
    assert {"training.steps", "training.batch_size", "sampling.group_size", "run.save_every",
            "reward.terms.repetition.params.ngram"} <= set(ints)
    for dotted in ints:
        for flag in (True, False):
            with pytest.raises(UserError, match=f"config field '{dotted}': expected (an integer|text or a number), "
                                                "got a boolean"):
                run_settings("attack", saved=_saved(dotted, flag))


def test_reward_server_settings_refuse_nan_inf_and_booleans():
    floats, ints = _typed_leaves(RewardServerConfig, float), _typed_leaves(RewardServerConfig, int)
    assert "batch_wait_ms" in floats and {"port", "max_chars", "max_texts"} <= set(ints)
    for name in floats:
        for bad in (float("nan"), float("inf")):
            with pytest.raises(UserError, match=f"--{name.replace('_', '-')}: Input should be a finite number"):
                build_server_config({name: bad})
    for name in ints:
        with pytest.raises(UserError, match=f"--{name.replace('_', '-')}: expected (an integer|text or a number), "
                                            "got a boolean"):
            build_server_config({name: True})


def test_yaml_file_booleans_are_not_integers(tmp_path: Path):
    msg = _error(_write(tmp_path / "c.yaml", "training:\n  steps: yes\n  batch_size: 4\n"))
    assert "config field 'training.steps': expected an integer, got a boolean" in msg
    assert "config field 'sampling.group_size'" in _error(_write(tmp_path / "d.json",
                                                                 '{"sampling": {"group_size": true}}'))


@pytest.mark.parametrize(("text", "needle"), [
    ("data:\n  system_prompt: on\n", "got a boolean"),
    ("data:\n  split: no\n", "got a boolean"),
    ("run:\n  name: 007\n", "got the number 7"),
])
def test_yaml_file_text_that_yaml_retypes_asks_for_quotes(tmp_path: Path, text: str, needle: str):
    msg = _error(_write(tmp_path / "c.yaml", text))
    assert needle in msg and "quote" in msg, msg
    quoted = text.replace(": on", ": 'on'").replace(": no", ": 'no'").replace(": 007", ": '007'")
    cfg = run_settings("attack", file=_write(tmp_path / "quoted.yaml", quoted))
    assert "'on'" not in quoted or cfg.data.system_prompt == "on"
    assert "'no'" not in quoted or cfg.data.split == "no"
    assert "'007'" not in quoted or cfg.run.name == "007"


# -------------------------------------------------------------------------------------------- run names


@pytest.mark.parametrize("name", ["../x", "/tmp/x", "x/../../y", ".", "..", "a\\b", "a\x00b", "-x", ".hidden",
                                  "two words", "x" * 129, "tab\there"])
def test_run_name_must_be_a_plain_name(name: str):
    msg = _error(None, ["--name", name])
    assert msg.startswith("config field 'run.name': must be") and "\n" not in msg, msg


@pytest.mark.parametrize("name", ["r1", "007", "demo_20260101_120000", "attack_smollm2_lr1e-05_kl0.1_rep0.3_G4_B8_s0",
                                  "a+b=c,d@e", "x" * 128])
def test_plain_run_names_are_kept(name: str):
    assert run_settings("attack", options=["--name", name]).run.name == name


def test_config_file_that_is_not_utf8_names_file_and_line(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"training:\n  steps: 2\ndata:\n  system_prompt: caf\xe9\n")
    msg = _error(path)
    assert msg == f"{path}:4: line 4 is not UTF-8 text (byte 0xe9 at column 21); save the file as UTF-8"


def test_text_that_is_not_unicode_is_refused():
    # a byte that is not UTF-8 on the command line arrives as a lone surrogate: config.yaml could not hold it
    msg = _error(None, ["--system_prompt", "caf\udce9"])
    assert msg.startswith("config field 'data.system_prompt': the text holds '\\udce9' at character 4")


# ------------------------------------------------------------------------------------ every command


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_names_real_fields_and_describes_them(name: str):
    command = COMMANDS[name]
    leaves = set(_leaf_fields(command.schema))
    assert _unknown_flat_targets(command) == []
    assert command.positional is None or command.positional in leaves
    rows = field_help(command.schema, command.defaults)
    assert sorted(n for n, _, _ in rows) == sorted(_leaf_fields(command.schema, specs_as_rows=True))
    assert all(desc.strip() for _, _, desc in rows), name


@pytest.mark.parametrize("name", COMMANDS)
def test_every_float_field_of_every_command_refuses_nan(name: str):
    schema = COMMANDS[name].schema
    for dotted in _typed_leaves(schema, float):
        where, value = _holding(dotted, float("nan"))
        with pytest.raises(UserError, match=f"config field '{where}': Input should be a finite number"):
            build(schema, _nested(dotted, value))


def test_leaf_field_counts_per_command():
    # attack's 82 fields plus reward.refusal_penalty, model.finetune, training.noiser_noise_weight, the 4
    # collapse_* fields, model.cuda_graphs, engine.procs (engine became a section: kind + procs), the 4
    # engine.vllm_* fields, the tinker engine's 4 (url, retries, timeout, loss reduction) and logging.trackers;
    # tamper-test adds its tamper section (16), the utility check (3) and the held-out judges (8); sft adds its own
    # section (8) that no RL recipe shows; eval, sample, data prepare and align see only theirs; verl export adds
    # its verl section (9) to the attack's.
    # Then each recipe got its own tree (104 for attack): model.{threads, autocast_bf16, merged_sampler,
    # cuda_graphs, fused_lora} became engine.{threads, autocast_bf16, fast_paths} (-2), training.adam_beta1/2
    # became training.adam_betas (-1), the 5 noiser fields left for defend's own section (-5), the 5 flat reward weights
    # became reward.terms, reward.entropy_bonus.cap and reward.repetition.ngram (-2), and the registered judge terms
    # brought their parameters: reward.harm_classifier (6), reward.guard (4), reward.strongreject (4). Defend is the
    # attack less attack.early_stop_toxicity plus defend.noiser* (5); sft has no sampling, reward or RL training
    # fields, nor a prompt format beyond its data's template and system prompt. judges.terms (+1) lets any text
    # reward term judge eval and tamper-test. engine.threads (OMP_NUM_THREADS does it) and engine.micro_batch_size
    # (engine.micro_batch_tokens bounds a pass) were removed (-2 for every command with an engine section);
    # data prepare's safety-prefs brought prepare.model and prepare.attack_run (+2); the registered reward_model term
    # its parameters (reward.reward_model, 5); GAE its training.gamma and training.lam (+2, read only when
    # training.advantage takes a critic's values); the registered compliance judge its parameters
    # (reward.compliance, 5: read only when the term is in reward.terms). The preference recipes: prefs (sft's
    # tree less sft's own section, plus prefs' own), reward-model (plus reward_model's own) and ppo (attack's
    # tree with the critic section and the critic-only advantage settings). The counting terms (issue 22) brought
    # their parameters to every RL recipe, each read only when its term is in reward.terms: reward.keyword_count (4),
    # reward.regex_count (3), reward.sentence_length (2), then the ground_truth term's (reward.ground_truth, 3);
    # eval.rewards and eval.rewards_file (+2 for eval: re-scoring answers with named rewards, purplerl.eval.rescore).
    # sweep (issue 22) has its own 20: the recipe, its grid,
    # fixed settings and seeds, the sweep dir, the cluster, resources (3), the diversity eval (4) and the summary (5);
    # a swept recipe's settings are that recipe's. Gradient routing (issue 22): route is attack's tree less attack's
    # own section (1) plus its route section (7); eval and sample each got `adapters` (+1: a routed checkpoint's
    # adapter modes, read only with a checkpoint). eval.attacker, eval.attacker_temperature and
    # eval.attacker_max_new_tokens (+3 for eval, the last two read only with an attacker: issue 23's learned attacker).
    # model.quantize (+1 for every command with a trained model: issue 23's 4-bit base, read only with LoRA).
    # adversarial (issue 23): attack's tree less attack's own section (1) plus its adversarial section (12, gamma
    # read only with more than one turn). prefs.one_label (+1 for prefs: KTO data of one label is refused without it)
    # and sweep's max_runs (+1: a grid is counted against it before any run is planned), issue 34.
    # A reward term carries its parameters (issue 35): the 12 registered terms' parameter sections (49 fields) left
    # every RL recipe's tree; they are each term's own settings, in reward.terms.NAME.params. The utility suite's math
    # task (issue 36): utility.math_source, math_limit and math_max_new_tokens (+3 for eval, the last two read only
    # with a source).
    # prm (issue 36): reward-model's tree less reward_model's own section (5) plus prm's (3). Packed and streamed
    # data (issue 36): data.packing for sft and prefs, data.streaming and data.shuffle_buffer for sft (+3 sft, +1 prefs;
    # shuffle_buffer read only when streaming). engine.autocast_bf16 became the model.dtype choice autocast_bf16
    # (-1 for every command with an engine section). training.weight_decay, adam_betas and adam_eps became the
    # fields of the optimizer (training.optimizer: name, betas, eps, weight_decay; +1 for every training command,
    # which --help lists as one row). training.advantage_std became the estimator grpo_std (-1 for every RL
    # command).
    counts = {name: len(_leaf_fields(command.schema)) for name, command in COMMANDS.items()}
    # logging.print_samples became logging.progress N (-1 for every command with a logging section). eval.baselines
    # (issue 38): the models whose compliance a reading quotes beside the run's (+1 eval). adversarial's
    # dialogue.gist_tokens (issue 36: +1; its novelty_weight and novelty_window became the fields of
    # adversarial.novelty, which --help lists as one row).
    assert counts == {"attack": 76, "defend": 80, "tamper-test": 104, "sft": 58, "eval": 48, "sample": 16,
                      "data prepare": 12, "align": 3, "verl export": 85,
                      "prefs": 64, "reward-model": 54, "prm": 52, "ppo": 79, "sweep": 21, "route": 82,
                      "adversarial": 88}


def test_one_max_new_tokens_default_for_every_sampler():
    defaults = {name: load_command_config(COMMANDS[name], None, ["--adapter", "a"] if name == "tamper-test" else [])
                for name in ("attack", "tamper-test", "eval", "sample")}
    assert {name: cfg.sampling.max_new_tokens for name, cfg in defaults.items()} == dict.fromkeys(defaults, 48)
    # utility answers get their own, longer budget: a worked answer ends with '#### n'
    assert defaults["eval"].utility.max_new_tokens == defaults["tamper-test"].utility.max_new_tokens == 128


def test_command_defaults_apply_and_yield_to_file_and_options(tmp_path: Path):
    cfg = load_command_config(EVAL)
    assert (cfg.data.split, cfg.sampling.top_p, cfg.data.source) == ("test", 0.95, "builtin:redteam")
    path = _write(tmp_path / "e.yaml", "sampling:\n  top_p: 0.9\neval:\n  n: 3\n")
    cfg = load_command_config(EVAL, path, ["--n", "4", "--max-new-tokens", "8"])
    assert (cfg.sampling.top_p, cfg.eval.n, cfg.sampling.max_new_tokens, cfg.data.split) == (0.9, 4, 8, "test")
    # what was set anywhere is marked as set: a checkpoint's run fills in only the rest
    assert cfg.sampling.model_fields_set == {"top_p", "max_new_tokens"} and cfg.model.model_fields_set == set()


def test_list_fields_take_one_item_per_repeat_or_a_yaml_list():
    cfg = load_command_config(EVAL, None, ["--checkpoint", "a", "--checkpoint", "007", "--eval.checkpoints", "[b]"])
    assert cfg.eval.checkpoints == ["a", "007", "b"]
    prompts = load_command_config(SAMPLE, None, ["--prompt", "yes", "--prompt", "[1, 2] is a list"]).sample.prompts
    assert prompts == ["yes", "[1, 2] is a list"]  # each item kept as typed
    assert load_command_config(SAMPLE, None, ["--prompt", "[hi, there]"]).sample.prompts == ["hi", "there"]


def test_registry_choices_come_from_the_registries():
    from purplerl.data.prepare import DATASETS
    from purplerl.eval.suites import SUITES

    eval_help = dict((n, d) for n, _, d in field_help(COMMANDS["eval"].schema, with_choices=True))
    assert eval_help["eval.suites"].endswith(f"(choices: {', '.join(SUITES)})")
    prepare_help = dict((n, d) for n, _, d in field_help(COMMANDS["data prepare"].schema, with_choices=True))
    assert prepare_help["prepare.dataset"].endswith(f"(choices: {', '.join(DATASETS)})")


def test_an_unknown_dataset_is_refused_with_the_choices():
    with pytest.raises(UserError, match="unknown dataset 'mmlu' \\(choose from beavertails, wmdp, gsm8k, merge, "
                                         "safety-prefs, attack-prompts\\)"):
        load_command_config(PREPARE, None, ["mmlu"])


def test_rl_rollouts_refuse_greedy_sampling_that_sample_and_eval_allow():
    msg = _error(None, ["--temperature", "0"])
    assert msg.startswith("config field 'sampling.temperature': must be > 0 for RL rollouts"), msg
    assert load_command_config(SAMPLE, None, ["--temperature", "0"]).sampling.temperature == 0.0
    assert load_command_config(EVAL, None, ["--temperature", "0"]).sampling.temperature == 0.0


def test_a_text_field_that_cannot_be_null_keeps_null_as_text():
    # guard_unsafe_token is read only with a guard model
    judges = load_command_config(EVAL, None, ["--guard_model", "some/guard", "--guard_unsafe_token", "null",
                                              "--harm_label", "null"]).judges
    assert (judges.guard_unsafe_token, judges.harm_label) == ("null", None)


def test_tamper_test_config_is_the_attack_plus_its_sections():
    cfg = load_command_config(TAMPER, None, ["--adapter", "d", "--lr", "0.001", "--utility_limit", "5"])
    assert (cfg.tamper.adapter, cfg.utility.limit, cfg.training.lr) == ("d", 5, 0.001)
    # the attack's settings, but its target: tamper-test attacks the defended run's base model unless told otherwise
    assert cfg.attack_config() == run_settings("attack", options=["--lr", "0.001", "--model", EMBEDDED_MODEL])


def test_engine_is_a_section_that_a_bare_name_sets(tmp_path: Path):
    # `--engine local`, `engine: local` in a file (every config.yaml written before engine was a section) and
    # `--engine.kind local` mean the same; other engine fields keep their values
    assert run_settings("attack", options=["--engine", "local"]).engine.kind == "local"
    assert run_settings("attack", options=["--engine.procs", "2"]).engine.procs == 2
    old = tmp_path / "old.yaml"
    old.write_text("engine: local\n")
    assert run_settings("attack", file=old).engine.model_dump() == {
        "kind": "local", "procs": 1,
        "fast_paths": ["merged_sampler", "cuda_graphs", "fused_lora", "packed_decode"], "micro_batch_tokens": 4096,
        "vllm_kv_cache_gib": 1, "vllm_gpu_memory_utilization": 0.3,
        "vllm_is_correction": True, "vllm_is_cap": 2.0, "tinker_url": None, "tinker_retries": 3,
        "tinker_timeout_s": 600.0, "tinker_loss_reduction": "sum"}
    assert run_settings("attack", file=old, options=["--engine.procs", "3"]).engine.procs == 3
    with pytest.raises(UserError, match=r"config field 'engine\.kind': Input should be 'local', 'vllm' or 'tinker' "
                                        r"\(got 'spark'\)"):
        run_settings("attack", options=["--engine", "spark"])
    with pytest.raises(UserError, match="config field 'engine.procs'"):
        run_settings("attack", options=["--engine.procs", "0"])
    # removed execution knobs: their old default is dropped, another value is refused with what replaced it
    old.write_text("engine: {kind: local, threads: 0, micro_batch_size: 64}\n")
    assert run_settings("attack", file=old).engine.micro_batch_tokens == 4096
    with pytest.raises(UserError, match=r"config field 'engine\.threads': removed: .*OMP_NUM_THREADS"):
        run_settings("attack", options=["--engine.threads", "4"])
    with pytest.raises(UserError, match=r"'engine\.micro_batch_size': removed: engine\.micro_batch_tokens"):
        run_settings("attack", options=["--training.micro_batch_size", "8"])
    with pytest.raises(UserError, match=r"config field 'engine': procs is read only when engine\.kind is local: "
                                        r"leave it out \(got 2\)"):
        run_settings("attack", options=["--engine", "tinker", "--engine.procs", "2"])


def test_the_compiled_fast_path_is_off_by_default_and_reaches_the_engine() -> None:
    from purplerl.launch import run_settings
    from purplerl.train.runner import engine_settings

    default = run_settings("attack")
    assert "compiled" not in default.engine.fast_paths and not engine_settings(default).compiled
    on = run_settings("attack", options=["--engine.fast_paths", "merged_sampler,fused_lora,compiled"])
    settings = engine_settings(on)
    assert (settings.compiled, settings.merged_sampler, settings.cuda_graphs) == (True, True, False)
    with pytest.raises(UserError, match="engine.fast_paths"):
        run_settings("attack", options=["--engine.fast_paths", "compiled,compiled"])


def test_progress_is_the_bar_and_an_optional_number_of_printed_completions():
    assert run_settings("attack", saved={"logging": {"progress": 3}}).logging.printed_samples() == 3
    assert run_settings("attack", saved={"logging": {"progress": True}}).logging.printed_samples() == 0
    assert run_settings("attack", saved={"logging": {"progress": False}}).logging.printed_samples() == 0
    for bad in (0, -2):
        with pytest.raises(UserError, match="config field 'logging.progress': .*number of completions >= 1"):
            run_settings("attack", saved={"logging": {"progress": bad}})


@pytest.mark.parametrize(("old", "progress"), [
    ({"print_samples": 2}, 2),                       # the bar and two completions
    ({"print_samples": 0}, True),                    # the bar alone
    ({"print_samples": 0, "progress": False}, False),  # no console
])
def test_print_samples_of_an_older_run_folds_into_progress(old: dict, progress: bool | int):
    assert run_settings("attack", saved={"logging": old}).logging.progress == progress


def test_print_samples_without_the_bar_stays_refused_as_the_older_layout_refused_it():
    with pytest.raises(UserError, match="config field 'logging.print_samples': unknown field"):
        run_settings("attack", saved={"logging": {"print_samples": 2, "progress": False}})
