"""A reward term carries its settings (issue 35): its parameters from the command line, typed as the term types
them; --help lists them for the terms in force, apart from the recipe's settings; a bare weight changes the weight
only; and the older spelling reward.TERM.FIELD still reaches them."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest
from pydantic import Field

from purplerl.cli.base import config_help, term_parameters
from purplerl.config import field_help
from purplerl.config.base import Section
from purplerl.errors import UserError
from purplerl.launch import run_settings
from purplerl.recipes import RECIPES
from purplerl.rewards.registry import REWARD_TERMS, text_term


def test_the_older_spelling_of_a_terms_parameters_still_works() -> None:
    old = run_settings("attack", options=["--reward.toxicity.model=org/clf", "--reward.toxicity.label=toxic",
                                          "--reward.repetition.ngram=4"])
    new = run_settings("attack", options=["--reward.terms.toxicity.params.model=org/clf", "--toxicity_label=toxic",
                                          "--reward.terms.repetition.params.ngram=4"])
    assert old == new and new.reward.terms["repetition"].params == {"ngram": 4}


def test_a_bare_weight_changes_the_weight_and_keeps_the_parameters() -> None:
    url = "http://127.0.0.1:50050"
    for options in (["--reward.terms.toxicity.params.url", url, "--reward.terms.toxicity", "2"],
                    ["--reward.terms.toxicity", "2", "--reward.terms.toxicity.params.url", url],
                    ["--reward.terms.toxicity.params.url", url, "--reward.terms.toxicity.weight", "2"]):
        term = run_settings("attack", options=options).reward.terms["toxicity"]
        assert (term.weight, term.params["url"]) == (2.0, url), options
    # the whole use, given as a mapping, is the use: its parameters are the ones it names
    term = run_settings("attack", options=["--reward.terms.toxicity.params.url", url,
                                           "--reward.terms.toxicity", "{weight: 2}"]).reward.terms["toxicity"]
    assert (term.weight, term.params["url"]) == (2.0, None)


def test_a_named_use_takes_its_parameters_by_the_same_path() -> None:
    # route's default reward: catalogue terms (short_with_cheer), written out from their names
    config = run_settings("route", options=["--reward.terms.cheer_any.params.max_count", "2"])
    assert config.reward.terms["cheer_any"].params["max_count"] == 2 and config.reward.terms["cheer_any"].hack_at == 1
    with pytest.raises(UserError, match="reward.terms.cheer_any.params.max_count': Input should be greater than"):
        run_settings("route", options=["--reward.terms.cheer_any.params.max_count", "0"])


def test_help_lists_the_parameters_of_the_terms_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["purplerl", "attack", "--reward.terms.toxicity.params.url", "http://x:1",
                                      "--reward.terms.entropy_bonus", "1", "--help"])
    lines = config_help(RECIPES["attack"].command())
    headers = [line.split(":")[0] for line in lines if not line.startswith(" ")][1:]
    assert headers == ["engine", "model", "sampling", "training", "training.optimizer", "data", "reward",
                       "reward.terms.toxicity.params",
                       "reward.terms.repetition.params", "reward.terms.entropy_bonus.params", "attack", "logging",
                       "run"]
    # the url switches the server's own parameters on; the recorded server model is metadata, not a setting
    # a term's parameters are listed under their term, not as the recipe's --settings
    assert "    timeout_s [default 30.0]: reward server: seconds to wait for one answer" in lines
    assert "  --reward.terms.toxicity.params.timeout_s" not in "\n".join(lines)
    assert "    cap [default 3.0]: " in "\n".join(lines)
    assert not [line for line in lines if "server_model" in line or "reward.terms.refusal" in line]


def test_a_terms_parameters_are_not_the_recipes_settings() -> None:
    command = RECIPES["attack"].command()
    config = run_settings("attack")
    recipe = [row[0] for row in field_help(command.schema, command.defaults, settings=config)]
    parameters = [row[0] for _, _, rows in term_parameters(config) for row in rows]
    assert parameters == ["reward.terms.toxicity.params.model", "reward.terms.toxicity.params.url",
                          "reward.terms.repetition.params.ngram"]
    assert not set(parameters) & set(recipe) and "reward.terms" in recipe


class _WordParams(Section):
    """A judge registered by a test: the share of a response's words that are `word`."""

    word: str = Field("harm", min_length=1, description="the word counted")


def _word_share(params: _WordParams) -> Callable[[list[str], list[str]], list[float]]:
    return lambda texts, prompts: [t.split().count(params.word) / max(len(t.split()), 1) for t in texts]


def test_a_new_judge_touches_no_settings_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering a judge with parameters changes no recipe's settings: its weight and parameters are a
    reward.terms entry, set by the same path as every term's."""
    rl = [name for name, recipe in RECIPES.items() if "reward" in recipe.settings.model_fields]
    before = {name: json.dumps(RECIPES[name].settings.model_json_schema(), sort_keys=True) for name in rl}
    monkeypatch.setitem(REWARD_TERMS, "word_share", text_term("word_share", "share of one word", _WordParams,
                                                              _word_share))
    assert {name: json.dumps(RECIPES[name].settings.model_json_schema(), sort_keys=True) for name in rl} == before
    config = run_settings("attack", options=["--reward.terms.word_share", "0.5",
                                             "--reward.terms.word_share.params.word", "weapon"])
    assert (config.reward.terms["word_share"].weight, config.reward.terms["word_share"].params) == (
        0.5, {"word": "weapon"})
    shown = {where: [row[0] for row in rows] for where, _, rows in term_parameters(config)}
    assert shown["reward.terms.word_share.params"] == ["reward.terms.word_share.params.word"]
    with pytest.raises(UserError, match=r"reward.terms.word_share.params.colour"):
        run_settings("attack", options=["--reward.terms.word_share", "0.5",
                                        "--reward.terms.word_share.params.colour", "red"])
