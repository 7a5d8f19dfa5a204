"""What a recipe declares, and the settings tree an RL recipe is built from.

A recipe is one folder, purplerl/recipes/NAME/, whose `__init__.py` holds one `Recipe`: its name and settings class,
its defaults, the fields its run name is made of, its summary metrics, its early stops and how it builds its loop
hooks. The runner, the loop and the engines take a `Recipe` and never ask which one it is; the CLI makes a command of
each row of the table (purplerl.recipes.RECIPES).

The CLI reads the whole table for `--help`, which must not load torch: a row's module imports its step (its folder's
step.py, the loop, the engines, the data) inside its `prepare` hook, or names it with `lazy("module:NAME")`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, field_validator

from purplerl.config.base import Section
from purplerl.config.commands import Command
from purplerl.config.loader import build
from purplerl.config.migrate import migrate_shared
from purplerl.config.sections import RewardBase, RunSettings
from purplerl.rewards.named import TermEntry, TermSpec, fold_term_sections, resolve_terms, written_out
from purplerl.rewards.registry import REWARD_TERMS
from purplerl.runs import process_reward as _process_reward  # noqa: F401 -- registers the prm term
from purplerl.runs import reward_model as _reward_model  # noqa: F401 -- registers the reward_model term
from purplerl.train.context import prompt_and_answer

if TYPE_CHECKING:  # the table of rows is read by --help without the engines and the loop, which load torch
    from purplerl.engines.base import Engine
    from purplerl.train.steps import EarlyStop, StepFn

# the engine and the run dir (which a new run creates only after binding: write into it from the steps on) -> the
# recipe's step function and early stop
Bind = Callable[["Engine", Path], "tuple[StepFn, EarlyStop]"]
Prepare = Callable[[Any], Bind]  # the config -> its data and hooks, loaded and checked before the engine exists
# older settings -> today's tree; `saved`: a run's own config.yaml, which may also drop what the recipe never read
Migrate = Callable[[dict[str, Any], bool], dict[str, Any]]

# Short option names of the shared sections (the red-team trainer's habit); dashes work too (--max-new-tokens).
FLAT = {
    "model": "model.name", "dtype": "model.dtype", "device": "model.device", "engine": "engine.kind",
    "lora_rank": "model.lora_rank", "lora_alpha": "model.lora_alpha", "init_adapter": "model.init_adapter",
    "steps": "training.steps", "batch_size": "training.batch_size", "lr": "training.lr", "seed": "training.seed",
    "max_grad_norm": "training.max_grad_norm",
    "micro_batch_tokens": "engine.micro_batch_tokens", "data": "data.source", "split": "data.split",
    "system_prompt": "data.system_prompt", "output_dir": "run.output_dir", "name": "run.name",
    "save_every": "run.save_every",
}
RL_FLAT = {
    **FLAT, **{name: f"sampling.{name}" for name in ("max_new_tokens", "temperature", "top_p", "top_k", "group_size")},
    "loss": "training.loss", "max_prompt_tokens": "data.max_prompt_tokens", "kl_beta": "reward.kl_beta",
    "zscore": "reward.zscore",
}

# Settings a resume may not change in any recipe: the checkpoints, data order and logs of the run were made with
# them, so a run continued with other values would be neither the old experiment nor a new one. A field a recipe
# does not have is skipped.
FIXED_ON_RESUME = frozenset({
    "recipe", "engine.kind", "model.name", "model.revision", "model.finetune", "model.lora_rank", "model.lora_alpha",
    "model.lora_targets", "model.init_adapter", "sampling.group_size", "training.batch_size", "training.seed",
    "data.source", "data.split", "data.prompt_field", "data.hf_config", "data.filters", "data.limit", "data.shuffle",
    "run.output_dir", "run.name",
})


def lazy(ref: str) -> Callable[..., Any]:
    """The function "module:NAME" names, imported when it is first called. A row names its step's functions this
    way (its `prepare`, ...): the CLI reads the whole table for --help, and a step's module loads torch."""
    module, _, name = ref.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


@dataclass(frozen=True)
class RunNamePart:
    """One piece of a run's directory name: `label` + the value `get(config)` (numbers as %g)."""

    label: str
    get: Callable[[Any], Any]

    def render(self, config: RunSettings) -> str:
        value = self.get(config)
        return f"{self.label}{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) \
            else f"{self.label}{value}"


@dataclass(frozen=True)
class Recipe:
    """One row of the recipe table."""

    name: str
    settings: type[Section]  # the whole settings tree of the recipe's runs
    help: str  # the command's --help text (first line: its summary)
    prepare: Prepare
    defaults: Mapping[str, Any] = field(default_factory=dict)  # where this recipe's defaults differ, and why
    run_name: tuple[RunNamePart, ...] = ()  # recipe_model_<parts>_sSEED
    summary_metrics: Mapping[str, str] = field(default_factory=dict)  # metrics.jsonl key -> label, first vs last
    flat: Mapping[str, str] = field(default_factory=dict)  # short option names -> dotted fields
    migrate: Migrate | None = None  # the recipe's own part of reading an older config.yaml
    # lines led by the recipe's own verdict; None: first vs last steps of summary_metrics (recipes.summary)
    summarize: Callable[[Path, dict[str, Any], Any], str] | None = None
    fixed_on_resume: frozenset[str] = FIXED_ON_RESUME
    # the model section the engine is built with, when the recipe's own settings shape it (route's baseline: one
    # adapter of the rank of both routed adapters); None: config.model
    engine_model: Callable[[Any], Any] | None = None
    # (the longest sequence a run builds, the settings that bound it), checked against the model's context before
    # the model loads (train.context); None: the settings bound none
    longest_sequence: Callable[[Any], tuple[int, str] | None] = prompt_and_answer
    # the engine capabilities (purplerl.engines.capabilities) a run of these settings needs beyond the core
    # protocol, refused in one line before anything loads when its engine lacks one
    needs: Callable[[Any], frozenset[str]] = lambda config: frozenset()
    # what a run makes: a policy (an adapter the next stage of a pipeline starts from) or a scorer (a reward
    # model that judges other stages)
    produces: Literal["policy", "scorer"] = "policy"
    # a scorer's registered reward term, whose `run` parameter names a run of this recipe: what `serve-reward --model
    # RUN_DIR` serves and a pipeline's judge stage scores with (purplerl.launch.scorer_term); None for a policy
    scorer_term: str | None = None

    def __post_init__(self) -> None:
        if (self.produces == "scorer") != (self.scorer_term is not None):
            raise ValueError(f"recipe {self.name}: a scorer names its reward term (scorer_term), and only a scorer")

    def check_engine(self, config: RunSettings) -> None:
        """Refuse, in one line and before anything loads, an engine without a capability this run needs."""
        from purplerl.engines.capabilities import check_capabilities

        model = self.engine_model(config) if self.engine_model is not None else config.model
        check_capabilities(self.needs(config), model, config.engine, f"recipe {self.name}")

    def migrated(self, data: dict[str, Any], saved: bool = False) -> dict[str, Any]:
        """`data` (a config file, overrides, or a run's saved config.yaml) with older names moved to today's: a
        registered term's parameters of the earlier `reward.<term>` section folded into the term, and the terms
        written out, so that `--reward.terms.NAME.params.FIELD` reaches into them (purplerl.rewards.named)."""
        data = migrate_shared(data, saved)
        data = self.migrate(data, saved) if self.migrate is not None else data
        if isinstance(data.get("reward"), dict):
            reward = data["reward"]
            if saved and "terms" not in reward and "terms" in self.defaults.get("reward", {}):
                # a run's config of the earliest layout (defend's, whose terms were fixed) ran the default terms
                reward = {**reward, "terms": self.defaults["reward"]["terms"]}
            reward = fold_term_sections(reward)
            data = {**data, "reward": {**reward, "terms": written_out(reward["terms"])} if "terms" in reward
                    else reward}
        return data

    def build(self, data: dict[str, Any], saved: bool = False) -> Any:
        """The recipe's settings from nested data (older names migrated); UserError names a bad field."""
        return build(self.settings, self.migrated(data, saved))

    def command(self) -> Command:
        """How the CLI reads this recipe's settings."""
        return Command(self.settings, dict(self.flat), self.migrated(json.loads(json.dumps(dict(self.defaults)))),
                       migrate=self.migrated)


def reward_section(name: str, terms: Mapping[str, float]) -> type[RewardBase]:
    """An RL recipe's `reward` section: `terms` (reward term -> its use, the way TRL takes reward_funcs and
    reward_weights; a weight-0 term is logged, not rewarded) with the recipe's defaults.

    Each term carries its own weight, parameters and detector threshold (purplerl.rewards.named.TermSpec: {fn,
    weight, params, hack_at}): `toxicity: 1.0` is the registered term at its default parameters, `toxicity:
    {weight: 1.0, params: {url: ...}}` with its own, and `--reward NAME` writes a named reward here. A new term
    adds no setting to any recipe. So the run's config.yaml says every fn, parameter, weight and detector it was
    rewarded with."""
    fields: dict[str, Any] = {
        "terms": (dict[str, TermEntry], Field(default_factory=lambda: dict(terms), validate_default=True, description=(
            "reward terms: reward = sum of weight x term, minus kl_beta x KL when kl_in is reward; a weight-0 term "
            "is logged only. NAME: weight (a registered term at its default parameters) or NAME: {fn, weight, "
            "params, hack_at} (hack_at: a detector); e.g. --reward.terms.toxicity.params.url URL; --reward NAME "
            "writes a named reward")))}

    def resolve(cls: type, value: Any) -> Any:
        return resolve_terms(value)

    validators = {"_resolve_terms": field_validator("terms", mode="before")(classmethod(resolve)),
                  "_check_terms": field_validator("terms")(classmethod(_check_terms))}
    return create_model(f"{name.capitalize()}RewardConfig", __base__=RewardBase, __validators__=validators,
                        **fields)


def _check_terms(cls: type, value: dict[str, float | TermSpec]) -> dict[str, float | TermSpec]:
    for term, entry in value.items():
        if term == "kl":
            raise ValueError("the KL term's weight is reward.kl_beta (it may act in the reward or the loss)")
        if not isinstance(entry, TermSpec):
            raise ValueError(f"unknown reward term '{term}' (registered: {', '.join(REWARD_TERMS)}; a named "
                             "combination is chosen with --reward NAME)")
        if term in REWARD_TERMS and entry.fn != term:
            raise ValueError(f"'{term}' is a registered term's name, used here for fn '{entry.fn}': give this use "
                             "another name")
    if not value:
        raise ValueError("name at least one reward term")
    return value


def recipe_field(name: str) -> Any:
    """The `recipe` field of a recipe's settings class: which recipe a config is for."""
    return Field(name, description="metadata, not a setting: the recipe this config is for")
