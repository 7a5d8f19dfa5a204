"""YAML that would exhaust memory or the stack is one line, for every YAML purplerl reads (files.parse_yaml)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from purplerl.errors import UserError
from purplerl.files import MAX_YAML_CHARS, MAX_YAML_NODES, expanded_size, parse_yaml
from purplerl.launch import run_settings
from purplerl.rewards.named import read_catalogue


def _bomb(levels: int = 9, width: int = 9) -> str:
    """'Billion laughs': each level a list of `width` aliases of the level below: width**levels strings."""
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_expanded_size_counts_every_copy_of_a_shared_value():
    # the mapping, 2 keys, 2 copies of a list of 2 values (3 nodes); text: "a", "b" and twice "1", "2"
    assert expanded_size(yaml.compose("a: &x [1, 2]\nb: *x\n"), "t") == (1 + 2 * (1 + 3), 6)
    assert expanded_size(yaml.compose("a: &s hello\nb: [*s, *s]\n"), "t") == (1 + 2 + 1 + 3, 2 + 3 * 5)


def test_a_few_aliases_are_fine():
    data = parse_yaml("base: &b {lr: 0.001, steps: 3}\nrun1: *b\nrun2: *b\n", "t")
    assert data["run1"] == data["run2"] == {"lr": 0.001, "steps": 3}


def test_a_billion_laughs_is_refused_without_being_expanded():
    text = _bomb()
    assert len(text) < 1200  # the 1.1 KB file of the report
    start = time.perf_counter()
    with pytest.raises(UserError, match=f"aliases expand past {MAX_YAML_NODES} values"):
        parse_yaml(text, "bomb.yaml")
    assert time.perf_counter() - start < 5  # measured over the shared graph, never copied (a hang guard)


def _string_bomb(chars: int = 10_000, copies: int = 10_000) -> str:
    """One `chars`-character string aliased `copies` times: 60 KB of text, 100 MB once copied out (the report's
    400 KB file held 100 KB x 100,000: 10 GB)."""
    return f"s: &s {'x' * chars}\nbomb: [{', '.join(['*s'] * copies)}]\n"


def test_a_string_bomb_is_refused_by_its_characters_without_being_expanded(tmp_path: Path):
    text = _string_bomb()
    assert len(text) < 70_000 and yaml.compose(text) is not None  # few values, few bytes: only its copies are big
    with pytest.raises(UserError, match=f"aliases expand past {MAX_YAML_CHARS} characters of text"):
        parse_yaml(text, "bomb.yaml")
    config = tmp_path / "bomb.yaml"  # --config, which copies the loaded tree through JSON
    config.write_text("training:\n  steps: 2\n" + text)
    with pytest.raises(UserError, match="aliases expand past .* characters"):
        run_settings("attack", file=config)
    rewards = tmp_path / "rewards.yaml"
    rewards.write_text("mine:\n  fn: toxicity\n  params: {label: x}\n" + text)
    with pytest.raises(UserError, match="aliases expand past .* characters"):
        read_catalogue(rewards)


def test_a_few_long_aliased_strings_are_fine():
    data = parse_yaml(_string_bomb(chars=1000, copies=100), "t")
    assert len(data["bomb"]) == 100 and data["bomb"][0] == "x" * 1000


def test_a_large_alias_free_file_is_refused_quickly_for_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The report's rewards file without aliases was refused after 75 s and 1.7 GB, and said "aliases"."""
    rewards = tmp_path / "rewards.yaml"
    rewards.write_text("mine:\n  fn: toxicity\n  values: [" + ", ".join(["1"] * (MAX_YAML_CHARS // 3)) + "]\n")
    start = time.perf_counter()
    with pytest.raises(UserError, match=f"characters, past the {MAX_YAML_CHARS} a settings file may hold") as err:
        read_catalogue(rewards)
    assert "its aliases" not in str(err.value) and time.perf_counter() - start < 2  # refused before it is parsed
    # under the size bound but past the values: refused while composing, at the first value past the bound
    monkeypatch.setattr("purplerl.files.MAX_YAML_NODES", 1000)
    rewards.write_text("mine:\n  fn: toxicity\n  values: [" + ", ".join(["1"] * 5000) + "]\n")
    with pytest.raises(UserError, match="holds more than 1000 values") as err:
        read_catalogue(rewards)
    assert "its aliases" not in str(err.value)


def test_an_alias_inside_itself_is_refused():
    with pytest.raises(UserError, match="cycle"):
        parse_yaml("a: &x [1, *x]\n", "t")


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join(f"{' ' * i}b:\n" for i in range(1, 1500))])
def test_nesting_past_the_parser_is_one_error(text: str):
    with pytest.raises(UserError, match="nested too deeply|cannot parse YAML"):
        parse_yaml(text, "deep.yaml")


def test_a_bomb_on_the_command_line_is_refused():
    with pytest.raises(UserError, match="aliases expand past"):
        run_settings("attack", options=["--data.filters", "{" + _bomb().replace("\n", ", ").rstrip(", ") + "}"])


def test_deep_json_config_is_one_error(tmp_path: Path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nested too deeply"):
        run_settings("attack", file=path)


@pytest.mark.process
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS")
def test_the_cli_refuses_a_bomb_under_a_memory_bound(tmp_path: Path):
    """The report's case: `--config` with a 1.1 KB bomb grew past 4.6 GB. Under a 4 GiB address-space bound
    (importing torch maps ~1.5 GiB) the command now ends with one line, quickly."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("attack:\n  early_stop_toxicity: 0.5\nbomb:\n" + "".join(f"  {line}\n" for line in
                                                                            _bomb().splitlines()))
    limit = 4 * 1024**3
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d)); "
            "from purplerl.cli import main; sys.argv = ['purplerl', 'attack', '--config', %r]; main()"
            % (limit, limit, str(bomb)))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PURPLERL_CACHE": str(tmp_path / "cache")})
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "aliases expand past" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    assert time.perf_counter() - start < 60
