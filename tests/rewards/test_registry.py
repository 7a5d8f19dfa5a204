"""The reward-term registry: what is registered, how parameters are validated, and that registering loads nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from purplerl.config import ToxicityConfig
from purplerl.errors import UserError
from purplerl.rewards.judges import GuardParams, HarmClassifierParams, StrongRejectJudge, StrongRejectParams
from purplerl.rewards.refusal import RefusalJudge
from purplerl.rewards.registry import REWARD_TERMS, RewardTerm, get_term, register_term, term_params
from purplerl.rewards.repetition import RepetitionScorer
from purplerl.rewards.terms import EntropyBonusParams, RepetitionParams

BUILT_IN = {  # name -> (needs, params class)
    "toxicity": ("text", ToxicityConfig),
    "repetition": ("text", RepetitionParams),
    "refusal": ("text", None),
    "kl": ("kl", None),
    "response_entropy": ("tokens", None),
    "entropy_bonus": ("tokens", EntropyBonusParams),
    "harm_classifier": ("text", HarmClassifierParams),
    "guard": ("text", GuardParams),
    "strongreject": ("text", StrongRejectParams),
}


def test_every_built_in_term_is_registered_with_a_description() -> None:
    assert set(BUILT_IN) <= set(REWARD_TERMS)
    for name, (needs, params) in BUILT_IN.items():
        term = get_term(name)
        assert (term.name, term.needs, term.params) == (name, needs, params)
        assert term.description.strip() and "\n" not in term.description
        assert (term.scorer is not None) == (needs == "text")
        if params is not None:  # every parameter has a default: the term builds from its defaults
            assert all(not f.is_required() for f in params.model_fields.values()), name
            assert all(f.description for f in params.model_fields.values()), name


def test_unknown_term_lists_the_known_ones() -> None:
    with pytest.raises(UserError) as err:
        get_term("toxicty")
    assert str(err.value).startswith("unknown reward term 'toxicty' (known: ")
    for name in BUILT_IN:
        assert name in str(err.value)


@pytest.mark.parametrize(("name", "values", "says"), [
    ("repetition", {"ngram": 0}, "reward term 'repetition' parameter ngram: Input should be greater than or equal"),
    ("repetition", {"ngrams": 2}, "reward term 'repetition' parameter ngrams: Extra inputs are not permitted"),
    ("repetition", {"ngram": "yes"}, "reward term 'repetition' parameter ngram:"),
    ("entropy_bonus", {"cap": -1.0}, "reward term 'entropy_bonus' parameter cap:"),
    ("harm_classifier", {"threshold": 1.5}, "reward term 'harm_classifier' parameter threshold:"),
    ("toxicity", {"url": "localhost:50050"}, "reward term 'toxicity' parameter url: must start with http"),
    ("refusal", {"window": 3}, "reward term 'refusal' takes no parameters, got window"),
    ("repetition", ToxicityConfig(), "reward term 'repetition' takes RepetitionParams or a mapping of its fields, "
                                     "got ToxicityConfig"),
])
def test_bad_params_name_the_field(name: str, values: object, says: str) -> None:
    with pytest.raises(UserError) as err:
        term_params(name, values)  # type: ignore[arg-type]
    assert str(err.value).startswith(says) and "\n" not in str(err.value)


def test_params_defaults_mappings_and_instances() -> None:
    assert term_params("repetition", None) == RepetitionParams(ngram=3)
    assert term_params("repetition", {"ngram": 4}).ngram == 4
    assert term_params("entropy_bonus", {}).cap == 3.0
    assert term_params("refusal", None) is None and term_params("kl", {}) is None
    toxicity = ToxicityConfig()
    # the same instance: the toxicity term records its server's model in the run's own config section
    assert term_params("toxicity", toxicity) is toxicity


def test_text_terms_build_their_scorers() -> None:
    assert isinstance(get_term("refusal").scorer(None), RefusalJudge)
    scorer = get_term("repetition").scorer(term_params("repetition", {"ngram": 2}))
    assert isinstance(scorer, RepetitionScorer) and scorer.n == 2
    judge = get_term("strongreject").scorer(term_params("strongreject", {"url": "http://127.0.0.1:1/v1", "model": "m"}))
    assert isinstance(judge, StrongRejectJudge) and judge.url == "http://127.0.0.1:1/v1/chat/completions"
    judge.close()


@pytest.mark.parametrize(("name", "says"), [
    ("harm_classifier", "reward term 'harm_classifier' needs model and label (its parameters: model, label, "),
    ("guard", "reward term 'guard' needs model (its parameters: model, unsafe_token, "),
    ("strongreject", "reward term 'strongreject' needs url and model (its parameters: "),
])
def test_a_judge_without_its_model_is_one_line(name: str, says: str) -> None:
    with pytest.raises(UserError) as err:
        get_term(name).build(term_params(name, None))
    assert str(err.value).startswith(says)


def test_registration_is_checked() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_term(RewardTerm("kl", "again", "kl", None, lambda _: lambda batch: batch.kl_N))
    with pytest.raises(ValueError, match="one-line description"):
        RewardTerm("x", "two\nlines", "kl", None, lambda _: lambda batch: batch.kl_N)
    with pytest.raises(ValueError, match="a scorer goes with needs='text'"):
        RewardTerm("x", "tokens with a scorer", "tokens", None, lambda _: lambda b: b.kl_N, scorer=lambda _: None)
    with pytest.raises(ValueError, match="needs 'logits'"):
        RewardTerm("x", "unknown input", "logits", None, lambda _: lambda b: b.kl_N)  # type: ignore[arg-type]


@pytest.mark.process
def test_registering_the_terms_loads_no_model() -> None:
    """Importing purplerl.rewards registers every term; no scorer library is imported until a term is built."""
    heavy = ("transformers", "profanity_check", "sklearn", "httpx")
    code = ("import sys, purplerl.rewards as r; assert len(r.REWARD_TERMS) >= 9; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
