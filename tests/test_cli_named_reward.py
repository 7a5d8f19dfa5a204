"""`--reward NAME` and `--rewards-file FILE`: command-line options that expand into reward.terms (no new settings),
so the run's config records the terms themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from purplerl.cli.base import with_named_reward
from purplerl.config import load_command_config
from purplerl.errors import UserError
from purplerl.recipes.attack import ATTACK
from purplerl.rewards.named import weights


def _config(args: list[str]):
    return load_command_config(ATTACK.command(), None, with_named_reward(args))


def test_reward_expands_into_reward_terms_and_keeps_other_options() -> None:
    cfg = _config(["--kl_beta", "0.2", "--reward", "sentence_length_5_with_happy", "--steps", "3"])
    assert cfg.reward.kl_beta == 0.2 and cfg.training.steps == 3
    assert list(cfg.reward.terms) == ["sentence_length_5", "happy_bonus", "happy_any"]
    assert cfg.reward.terms["happy_any"].hack_at == 1.0
    assert weights(_config(["--reward=repetition"]).reward.terms) == {"repetition": 1.0}
    assert with_named_reward(["--steps", "3"]) == ["--steps", "3"]


def test_a_users_file_and_its_name(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("len_7: {fn: sentence_length, params: {target: 7, tolerance: 1}}\n")
    cfg = _config(["--rewards-file", str(path), "--reward", "len_7"])
    assert cfg.reward.terms["len_7"].params == {"target": 7, "tolerance": 1}


@pytest.mark.parametrize(("args", "message"), [
    (["--rewards-file", "x.yaml"], "--rewards-file FILE adds named rewards to choose from: choose one with --reward"),
    (["--reward", "happy_count", "--reward", "happy_binary"], "--reward is given twice: 'happy_count' and "
                                                              "'happy_binary'"),
    (["--reward"], "option --reward needs a value"),
    (["--reward", "happy_count", "--reward.terms", "{toxicity: 1}"], "give --reward NAME or --reward.terms, not both"),
    (["--reward", "no_such"], "unknown reward 'no_such' (named: "),
    (["--reward", "happy_count", "--rewards-file", "missing.yaml"], "rewards file not found: missing.yaml"),
])
def test_bad_reward_options_are_one_line_errors(args: list[str], message: str) -> None:
    with pytest.raises(UserError) as err:
        _config(args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.process
def test_help_shows_the_expanded_terms_and_no_new_dotted_setting() -> None:
    out = subprocess.run([sys.executable, "-m", "purplerl", "attack", "--reward", "happy_binary", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--reward NAME writes a named reward" in out
    assert '"happy_binary": {"fn": "keyword_count", "weight": 1.0' in out
    dotted = [line.split()[0] for line in out.splitlines() if line.startswith("  --") and "." in line.split()[0]]
    # the term's parameters are listed as its own, under their header, apart from the recipe's settings
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("reward.terms.happy_binary.params:")))
    parameters = [line.split()[0] for line in lines[header + 1:header + 5]]
    assert parameters == ["words", "whole_word", "case_sensitive", "max_count"]
    assert "--reward.terms.happy_binary.params.KEY VALUE" in lines[header]
    assert not any(name.startswith("--reward.terms.") for name in dotted)
    assert len(dotted) <= 60
