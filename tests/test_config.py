"""Config loading: defaults, YAML/JSON files, flat and dotted CLI overrides, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from purplerl.config import EMBEDDED_MODEL, FLAT_NAMES, Config, field_help, load_config, read_config_file, save_config
from purplerl.errors import UserError

EXAMPLE_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "configs" / "attack.yaml"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            names += _leaf_fields(ann, f"{prefix}{name}.")
        else:
            names.append(f"{prefix}{name}")
    return names


# ----------------------------------------------------------------------------------------------- defaults


def test_defaults():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.recipe == "attack"
    assert cfg.model.name == EMBEDDED_MODEL
    assert cfg.training.lr == 1e-4
    assert cfg.training.steps == 60
    assert cfg.sampling.group_size == 4
    assert cfg.reward.kl_beta == 0.1
    assert cfg.reward.zscore is False
    assert cfg.reward.toxicity.model == "embedded"
    assert cfg.run.save_every == 10


# ---------------------------------------------------------------------------------------------- files


def test_yaml_file(tmp_path: Path):
    path = _write(tmp_path / "c.yaml", "training:\n  lr: 0.001\n  steps: 5\nreward:\n  kl_beta: 0.3\n")
    cfg = load_config(path)
    assert (cfg.training.lr, cfg.training.steps, cfg.reward.kl_beta) == (0.001, 5, 0.3)
    assert cfg.training.batch_size == Config().training.batch_size  # untouched fields keep their defaults


def test_yaml_exponent_without_dot(tmp_path: Path):
    # YAML 1.1 reads `1e-4` as a string; the config must still take it as the number
    cfg = load_config(_write(tmp_path / "c.yaml", "training:\n  lr: 1e-4\n"))
    assert cfg.training.lr == pytest.approx(1e-4)


def test_json_file(tmp_path: Path):
    path = _write(tmp_path / "c.json", json.dumps({"sampling": {"group_size": 6}, "reward": {"zscore": True}}))
    cfg = load_config(path)
    assert cfg.sampling.group_size == 6
    assert cfg.reward.zscore is True


def test_empty_yaml_file_gives_defaults(tmp_path: Path):
    assert load_config(_write(tmp_path / "c.yaml", "")) == Config()


# ------------------------------------------------------------------------------------------- overrides


def test_flat_overrides():
    cfg = load_config(None, ["--kl_beta", "0.2", "--lr", "1e-4", "--steps", "7", "--model", "/some/model"])
    assert cfg.reward.kl_beta == 0.2
    assert cfg.training.lr == pytest.approx(1e-4)
    assert cfg.training.steps == 7
    assert cfg.model.name == "/some/model"


def test_dotted_overrides():
    cfg = load_config(None, ["--reward.kl_beta", "0.2", "--reward.zscore=true", "--reward.toxicity.batch_size=4"])
    assert cfg.reward.kl_beta == 0.2
    assert cfg.reward.zscore is True
    assert cfg.reward.toxicity.batch_size == 4


def test_dashes_in_option_names():
    cfg = load_config(None, ["--kl-beta", "0.25", "--training.batch-size", "3"])
    assert cfg.reward.kl_beta == 0.25
    assert cfg.training.batch_size == 3


def test_override_values_are_yaml():
    cfg = load_config(None, ["--training.early_stop_toxicity", "null", "--data.filters", "{is_safe: false}",
                             "--zscore", "true"])
    assert cfg.training.early_stop_toxicity is None
    assert cfg.data.filters == {"is_safe": False}
    assert cfg.reward.zscore is True


@pytest.mark.parametrize("value", ["123", "2024-05-01", "yes", "1.5"])
def test_string_fields_keep_text_that_looks_like_another_type(value: str):
    cfg = load_config(None, ["--name", value, "--system_prompt", value])
    assert cfg.run.name == value
    assert cfg.data.system_prompt == value


def test_null_for_optional_string_field():
    assert load_config(None, ["--name", "null"]).run.name is None


def test_toxicity_label_keeps_int_or_name():
    base = ["--toxicity_model", "/some/classifier"]
    assert load_config(None, [*base, "--toxicity_label", "1"]).reward.toxicity.label == 1
    assert load_config(None, [*base, "--toxicity_label", "toxic"]).reward.toxicity.label == "toxic"


def test_precedence_defaults_file_cli(tmp_path: Path):
    path = _write(tmp_path / "c.yaml", "training:\n  lr: 0.001\n  steps: 5\n")
    cfg = load_config(path, ["--steps", "9"])
    assert cfg.training.steps == 9  # CLI beats file
    assert cfg.training.lr == 0.001  # file beats default
    assert cfg.training.batch_size == Config().training.batch_size  # default where neither sets it


def test_file_overrides_base_and_keeps_siblings(tmp_path: Path):
    path = _write(tmp_path / "c.yaml", "reward:\n  kl_beta: 0.5\n")
    cfg = load_config(path, base={"reward": {"zscore": True, "kl_beta": 0.01}})
    assert cfg.reward.kl_beta == 0.5
    assert cfg.reward.zscore is True


def test_every_flat_name_points_at_a_field():
    leaves = set(_leaf_fields(Config))
    assert set(FLAT_NAMES.values()) <= leaves


# ---------------------------------------------------------------------------------------------- errors


def _error(path: str | Path | None = None, overrides: list[str] | None = None) -> str:
    with pytest.raises(UserError) as info:
        load_config(path, overrides)
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
    assert "reward.toxicity.label" in _error(None, ["--toxicity_model", "some/classifier"])


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
    cfg = load_config(None, ["--kl_beta", "0.2", "--lr", "3e-5", "--toxicity_model", "org/clf",
                             "--toxicity_label", "toxic", "--data.filters", "{is_safe: false}", "--name", "007"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert read_config_file(tmp_path / "config.yaml")["reward"]["kl_beta"] == 0.2


@pytest.mark.parametrize("text", ["a # not a comment", "key: value", "two\nlines", "'quoted' \"both\"", "", "null",
                                  "- item", "{x: 1}", "trailing space "])
def test_save_config_round_trips_awkward_strings(tmp_path: Path, text: str):
    cfg = Config.model_validate({"data": {"system_prompt": text}, "run": {"name": text or "x"}})
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_save_config_of_defaults_lists_every_field(tmp_path: Path):
    save_config(Config(), tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())

    def leaves(node: dict, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, value in node.items():
            is_section = isinstance(value, dict) and key != "filters"
            out |= leaves(value, f"{prefix}{key}.") if is_section else {f"{prefix}{key}"}
        return out

    assert leaves(saved) == set(_leaf_fields(Config))


def test_field_help_covers_every_leaf_field():
    rows = field_help()
    names = [name for name, _, _ in rows]
    assert sorted(names) == sorted(_leaf_fields(Config))
    assert len(names) == len(set(names))
    for name, default, desc in rows:
        assert desc.strip(), f"{name} has no description"
        json.loads(default)  # defaults are shown as JSON
    assert ("reward.kl_beta", "0.1") in [(n, d) for n, d, _ in rows]


def test_example_config_shows_the_defaults():
    if not EXAMPLE_CONFIG.is_file():
        pytest.skip(f"{EXAMPLE_CONFIG} does not exist yet")
    assert load_config(EXAMPLE_CONFIG) == Config()
    # it is meant to list every field, not only some
    assert "reward.kl_beta" in {n for n, _, _ in field_help()}
    text = EXAMPLE_CONFIG.read_text()
    for name in _leaf_fields(Config):
        assert f"{name.split('.')[-1]}:" in text, f"{name} missing from {EXAMPLE_CONFIG.name}"
