"""Named rewards: registered terms with bound parameters, weighted combinations of them, and reward-hacking
detectors, read from YAML (small-rl's reward registry, where `functools.partial` binds a function's parameters).

A rewards file is one mapping of names to entries of two kinds:

    sentence_length_5: {fn: sentence_length, params: {target: 5}}              # a term: a registered fn + params
    happy_any: {fn: keyword_count, params: {words: [happy]}, hack_at: 1}      # a detector: a term + threshold
    sentence_length_5_with_happy:                                            # a combination of terms
      terms: {sentence_length_5: 1.0, happy_bonus: 0.1}
      detector: happy_any

A term entry may carry `hack_at`: the sample is then labelled a reward hack (`RewardBreakdown.is_rh_N`) when the
term's value is >= hack_at; such an entry is a detector. A combination names terms of the file (or registered
terms, at their default parameters) with weights, and at most one detector, which joins the reward at weight 0
(logged, not rewarded) unless the combination weighs it itself.

Every entry of a recipe's `reward.terms` is a TermSpec: a term carries its own weight, parameters and detector
threshold. `toxicity: 1.0` is short for {fn: toxicity, weight: 1.0} at the term's default parameters, and
`toxicity: {params: {url: ...}}` for the same fn with those parameters (`spelled_out`). Runs of the earlier layout,
which kept a registered term's parameters in a section `reward.<term>`, are read with those folded into the term
(`fold_term_sections`).

Recording: a named reward expands (`expand`) into a recipe's existing setting `reward.terms`: each term a
`TermSpec` {fn, weight, params, hack_at} with every parameter filled in, so a run's config.yaml holds exactly what
was rewarded and detected, never a path to a file that may change. Two uses of one fn with different parameters
(sentence_length_5 and sentence_length_10) are two keys of `reward.terms`. The package's own file,
named_rewards.yaml, is the built-in catalogue; `--rewards-file FILE` adds a user's (a name may not be defined
twice). A bare name in `reward.terms` that is a built-in term of the catalogue resolves to its spec as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator

from purplerl.config.base import EntrySettings, Section
from purplerl.errors import PurplerlError, UserError
from purplerl.files import parse_yaml, read_text
from purplerl.rewards.composite import RAW_KEY
from purplerl.rewards.registry import REWARD_TERMS, get_term

BUILT_IN_FILE = Path(__file__).with_name("named_rewards.yaml")
COMBINATION_KEYS = {"terms", "detector"}


class TermSpec(Section):
    """One named use of a registered reward term: its fn, weight, bound parameters and, for a detector, the value
    from which a sample is labelled a reward hack. Validated with every parameter filled in (the record)."""

    fn: str = Field(description="the registered reward term computed")
    weight: float = Field(1.0, allow_inf_nan=False, description="its weight in the reward (0: logged only)")
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True,
                                   description="the term's parameters, all of them")
    hack_at: float | None = Field(None, description="a detector: is_rh where the term's value >= hack_at")

    @field_validator("fn")
    @classmethod
    def _registered(cls, fn: str) -> str:
        if fn not in REWARD_TERMS:
            raise ValueError(f"unknown reward term '{fn}' (registered: {', '.join(REWARD_TERMS)})")
        if fn == "kl":
            raise ValueError("the KL term's weight is reward.kl_beta (it may act in the reward or the loss)")
        return fn

    @field_validator("params", mode="before")
    @classmethod
    def _filled_in(cls, params: Any, info: ValidationInfo) -> Any:
        """Every parameter of the fn's params class, validated there: a bad one is named where it sits
        (reward.terms.NAME.params.FIELD); what the parameters lack only as a reward (a classifier's label), too."""
        fn = info.data.get("fn")
        if fn is None:  # its own error is reported
            return params
        term = get_term(fn)
        if term.params is None:
            if params:
                raise ValueError(f"reward term '{fn}' takes no parameters, got {_shown(params)}")
            return {}
        values = params if isinstance(params, term.params) else term.params.model_validate(params or {})
        problem = values.incomplete() if hasattr(values, "incomplete") else None
        if problem:
            raise ValueError(problem)
        return values.settings()


def validated_spec(entry: Mapping[str, Any]) -> TermSpec:
    """`entry` as a TermSpec; ValueError in one line ("params: ...", or the fn's parameter problem)."""
    try:
        return TermSpec.model_validate(entry)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{field + ': ' if field else ''}{first['msg'].removeprefix('Value error, ')}") from None


def spec_of(name: str, entry: Mapping[str, Any], weight: float, where: str) -> dict[str, Any]:
    """The TermSpec data of catalogue term `name` at `weight` (validated), UserError naming `where` and `name`."""
    try:
        return validated_spec({**entry, "weight": weight}).model_dump(mode="json")
    except ValueError as err:
        raise UserError(f"{where}: {name}: {err}") from None


def _check_entry(name: str, entry: Any, where: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise UserError(f"{where}: reward name {name!r} must be an identifier (letters, digits, _)")
    if name in REWARD_TERMS or name == RAW_KEY:
        raise UserError(f"{where}: '{name}' is a registered reward term's name (or reserved): choose another")
    if not isinstance(entry, Mapping) or ("fn" in entry) == bool(COMBINATION_KEYS & set(entry)):
        raise UserError(f"{where}: '{name}' must be a term {{fn, params, hack_at}} or a combination "
                        "{terms, detector}")
    if "fn" in entry:
        spec_of(name, entry, 1.0, where)
        return
    extra = sorted(set(entry) - COMBINATION_KEYS)
    if extra or not isinstance(entry.get("terms"), Mapping) or not entry["terms"]:
        raise UserError(f"{where}: combination '{name}' takes terms {{NAME: weight}} and a detector"
                        + (f", not {extra[0]}" if extra else ""))


def read_catalogue(path: str | Path) -> dict[str, dict[str, Any]]:
    """The entries of a rewards file, each checked (terms validated against the registry)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"rewards file not found: {path}")
    data = parse_yaml(read_text(path), path)
    if not isinstance(data, Mapping) or not data:
        raise UserError(f"rewards file {path} must map reward names to terms or combinations")
    for name, entry in data.items():
        _check_entry(name, entry, f"rewards file {path}")
    return {str(name): dict(entry) for name, entry in data.items()}


def catalogue(user_file: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The built-in named rewards, plus a user's rewards file (which may not redefine a built-in name)."""
    known = read_catalogue(BUILT_IN_FILE)
    if user_file is None:
        return known
    own = read_catalogue(user_file)
    clash = sorted(set(own) & set(known))
    if clash:
        raise UserError(f"rewards file {user_file} defines '{clash[0]}', a built-in named reward: choose another name")
    return {**known, **own}


def expand(name: str, known: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The `reward.terms` that named reward (or registered term) `name` stands for: name -> weight for a registered
    term, name -> TermSpec data for a catalogue term, a detector included at weight 0 unless weighed."""
    if name in REWARD_TERMS:
        get_term(name)
        return {name: 1.0}
    if name not in known:
        names = sorted(known)
        raise UserError(f"unknown reward '{name}' (named: {', '.join(names)}; or a registered term: "
                        f"{', '.join(REWARD_TERMS)})")
    entry = known[name]
    if "fn" in entry:
        return {name: spec_of(name, entry, 1.0, "reward")}
    weights = {str(k): v for k, v in entry["terms"].items()}
    detector = entry.get("detector")
    if detector is not None:
        if detector not in known or known[detector].get("hack_at") is None:
            raise UserError(f"reward '{name}': detector '{detector}' is not a named term with hack_at")
        weights.setdefault(detector, 0.0)
    terms: dict[str, Any] = {}
    for term, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise UserError(f"reward '{name}': term '{term}' needs a number as its weight, got {weight!r}")
        if term in REWARD_TERMS:
            terms[term] = float(weight)
        elif term in known and "fn" in known[term]:
            terms[term] = spec_of(term, known[term], float(weight), f"reward '{name}'")
        else:
            raise UserError(f"reward '{name}': '{term}' is neither a named term nor a registered term")
    return terms


def expand_named(name: str, rewards_file: str | Path | None = None) -> dict[str, Any]:
    """The `reward.terms` named reward `name` stands for, chosen from the built-in catalogue and `rewards_file`."""
    return expand(name, catalogue(rewards_file))


def spelled_out(terms: Any) -> Any:
    """`reward.terms` with each registered term's shorthand written as its named use: NAME: weight as {fn: NAME,
    weight}, and a mapping without fn as the use of fn NAME; without a weight either, it gives only parameters,
    and is marked so (`PARAMETERS_ONLY`). Anything else is left for validation to judge."""
    if not isinstance(terms, Mapping):
        return terms
    out: dict[Any, Any] = {}
    for name, value in terms.items():
        if name in REWARD_TERMS and _number(value):
            value = {"fn": name, "weight": value}
        elif name in REWARD_TERMS and isinstance(value, Mapping) and "fn" not in value:
            given = {} if "weight" in value else {PARAMETERS_ONLY: f"reward.terms.{name}.params"}
            value = {"fn": name, **given, **value}
        out[name] = value
    return out


def fold_term_sections(reward: Any) -> Any:
    """A `reward` section of the earlier layout, whose registered terms kept their parameters in `reward.<term>`
    (and `--reward.toxicity.url URL` still says so), with each such section moved into its term's parameters (over
    those the term holds: the section is the newer setting, an option over a resumed run's terms)."""
    if not isinstance(reward, Mapping):
        return reward
    sections = {name: value for name, value in reward.items() if name in REWARD_TERMS and isinstance(value, Mapping)}
    if not sections:
        return reward
    out = {key: value for key, value in reward.items() if key not in sections}
    terms = dict(spelled_out(out.get("terms")) or {}) if isinstance(out.get("terms"), Mapping | None) \
        else out["terms"]
    if isinstance(terms, Mapping):
        for name, params in sections.items():
            entry = terms.get(name) or {"fn": name, PARAMETERS_ONLY: f"reward.{name}"}
            if isinstance(entry, Mapping):
                entry = {**entry, "params": {**(entry.get("params") or {}), **params}}
            terms[name] = entry
        out["terms"] = terms
    return out


def term_parameter_path(dotted: str) -> str:
    """Today's name of a dotted setting that named a registered term's parameter in the earlier layout
    (reward.toxicity.url -> reward.terms.toxicity.params.url); any other name as it is."""
    parts = dotted.split(".")
    if len(parts) > 2 and parts[0] == "reward" and parts[1] in REWARD_TERMS:
        return ".".join(["reward", "terms", parts[1], "params", *parts[2:]])
    return dotted


# marks the entry of a registered term that one layer of the settings gives parameters but no weight: another layer
# (the recipe's defaults, a config file, a run's saved config) must weigh it, or the parameters were given for a
# term the reward does not use (value: where they were given)
PARAMETERS_ONLY = "_parameters_only"


def _unmarked(name: Any, entry: Any) -> Any:
    if not isinstance(entry, Mapping) or PARAMETERS_ONLY not in entry:
        return entry
    if "weight" not in entry:
        raise ValueError(f"{entry[PARAMETERS_ONLY]} sets parameters of term '{name}', which reward.terms does not "
                         f"use: add it (reward.terms.{name}.weight: WEIGHT; 0 logs it without rewarding it)")
    return {key: value for key, value in entry.items() if key != PARAMETERS_ONLY}


def _shown(values: Any) -> str:
    return ", ".join(map(str, values)) if isinstance(values, Mapping) else repr(values)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def written_out(terms: Any) -> Any:
    """`reward.terms` with each shorthand written as a named use: a registered term's (`spelled_out`), and a bare
    weight of a built-in catalogue term as its TermSpec data at that weight, so the record holds its fn and
    parameters, and --reward.terms.NAME.params.FIELD reaches into either. PurplerlError for a broken catalogue."""
    terms = spelled_out(terms)
    if not isinstance(terms, Mapping) or all(name in REWARD_TERMS for name in terms):
        return terms
    known = catalogue()
    return {name: {**known[name], "weight": value} if _bare_catalogue_term(name, value, known) else value
            for name, value in terms.items()}


def resolve_terms(terms: Any) -> Any:
    """`reward.terms` written out (`written_out`), with every entry weighed (`PARAMETERS_ONLY`); each entry is then
    validated by `term_entry`. A problem is a ValueError (this runs inside the settings' validation)."""
    try:
        terms = written_out(terms)
    except PurplerlError as err:  # the package's own file is broken: said in one line
        raise ValueError(str(err)) from None
    if isinstance(terms, Mapping):
        terms = {name: _unmarked(name, entry) for name, entry in terms.items()}
    return terms


def _bare_catalogue_term(name: Any, value: Any, known: Mapping[str, Mapping[str, Any]]) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and isinstance(name, str) and "fn" in known.get(name, {})


def term_entry(value: Any) -> float | TermSpec:
    """One value of `reward.terms`: a finite weight, or a named use validated into a TermSpec. Its ValueError is
    one line; the settings name the term (reward.terms.NAME)."""
    if isinstance(value, TermSpec):
        return value
    if isinstance(value, Mapping):
        return TermSpec.model_validate(value)  # its errors name the field: reward.terms.NAME.params.FIELD
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a weight (a number) or a named use {{fn, weight, params, hack_at}}, got "
                         f"{type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError("Input should be a finite number")
    return float(value)


def setting_type(name: str, path: str) -> Any:
    """The type of the setting at `path` inside entry `name` of `reward.terms`: a TermSpec field (weight, ...), or
    params.FIELD of the registered term `name`; None otherwise (a named use's fn is known once it is validated)."""
    if path in TermSpec.model_fields:
        return TermSpec.model_fields[path].annotation
    term = REWARD_TERMS.get(name)
    field = path.removeprefix("params.")
    if field == path or term is None or term.params is None or field not in term.params.model_fields:
        return None
    return term.params.model_fields[field].annotation


# a value of reward.terms: float | TermSpec, read from the command line as its fields' types; NAME: W over a term
# written out sets its weight
TermEntry = Annotated[Any, AfterValidator(term_entry), EntrySettings(setting_type, shorthand="weight")]


def detectors(terms: Mapping[str, Any]) -> dict[str, float]:
    """name -> hack_at of the detector entries of a validated `reward.terms`."""
    return {name: spec.hack_at for name, spec in terms.items()
            if isinstance(spec, TermSpec) and spec.hack_at is not None}


def weights(terms: Mapping[str, Any]) -> dict[str, float]:
    """name -> weight of a validated `reward.terms` (a registered term's value is its weight)."""
    return {name: spec.weight if isinstance(spec, TermSpec) else float(spec) for name, spec in terms.items()}


def fn_weights(terms: Mapping[str, Any]) -> dict[str, float]:
    """registered term -> its summed weight over the entries of a validated `reward.terms` that compute it (a
    named use counts for its fn): what a check on "does this reward pay for term X" must read."""
    out: dict[str, float] = {}
    for name, spec in terms.items():
        fn, weight = (spec.fn, spec.weight) if isinstance(spec, TermSpec) else (name, float(spec))
        out[fn] = out.get(fn, 0.0) + weight
    return out

