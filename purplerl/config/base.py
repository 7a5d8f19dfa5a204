"""What every config section shares: strict fields, no YAML retyping, and choices read from registries."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator, model_validator

from purplerl.scalars import value_problem

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
# the reward server's API key comes from this env var only: a key must never land in a saved config.yaml
API_KEY_ENV = "PURPLERL_REWARD_API_KEY"

METADATA = "metadata, not a setting"  # how a recorded field's description starts: --help leaves it out
Template = Literal["chat", "base"]  # 'chat': the tokenizer's chat template; 'base': plain text


def item_type(annotation: Any) -> Any | None:
    """The element type of a `list[X]` annotation (X without its Annotated metadata), else None."""
    if get_origin(annotation) is not list:
        return None
    (item,) = get_args(annotation)
    return get_args(item)[0] if get_origin(item) is Annotated else item


def comma_list(value: Any) -> Any:
    """'a,b' and ['a,b', 'c'] -> ['a', 'b', 'c'] (a repeated flag or a comma list on the command line)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        value = [name.strip() if isinstance(name, str) else name  # null from a file: the field's type refuses it
                 for item in value for name in (item.split(",") if isinstance(item, str) else [item])]
    return value


@dataclass(frozen=True)
class ReadWhen:
    """Field metadata: the field is read only when `holds(section)` is true of the section it belongs to (e.g. the
    vLLM fields of `engine` when `engine.kind` is vllm). Where it is false, the field is left out of `--help` and
    of a run's config.yaml, and a value other than its default is refused: no setting is accepted that nothing
    reads."""

    holds: Callable[[Any], bool]
    says: str  # the condition in words, for the refusal: "engine.kind is vllm"


@dataclass(frozen=True)
class EntrySettings:
    """Field metadata of a mapping-valued setting whose entries hold settings of their own (a reward term's weight
    and parameters: purplerl.rewards.named): `annotation(key, path)` is the type of the setting at dotted `path`
    inside entry `key`, None where that names none. The command line reads a value given there as that type
    (`--reward.terms.toxicity.params.label yes` is the label 'yes', not the index True). A bare value given for an
    entry that is written out sets its `shorthand` field (`--reward.terms.toxicity 2`: the weight, the term keeping
    its parameters)."""

    annotation: Callable[[str, str], Any]
    shorthand: str | None = None


def read_when(annotation: Any, holds: Callable[[Any], bool], says: str) -> Any:
    """`annotation`, read only when `holds(section)`: `Annotated[annotation, ReadWhen(holds, says)]`."""
    return Annotated[annotation, ReadWhen(holds, says)]


def once_each(names: list[str], what: str) -> list[str]:
    """A list field's names, none repeated ('wandb,wandb' names one tracker twice: a mistake, not a no-op)."""
    if len(set(names)) != len(names):
        raise ValueError(f"repeats a {what}: {','.join(names)}")
    return names


class Section(BaseModel):
    # NaN and inf mean nothing in any setting here (null already says "never"), and a NaN threshold would
    # silently switch its check off: no float field takes them, new fields included. A section's validator is built
    # when it first validates (defer_build), not when its class is made: the CLI makes every recipe's tree and
    # `--help` validates one of them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_yaml_retyping(cls, value: Any, info: Any) -> Any:
        """`--steps yes` is an error, not one step (purplerl.scalars); list items are checked one by one."""
        annotation = cls.model_fields[info.field_name].annotation
        problem = value_problem(value, annotation)
        item = item_type(annotation)
        if problem is None and item is not None and isinstance(value, list):
            problem = next((f"item {i + 1}: {p}" for i, v in enumerate(value) if (p := value_problem(v, item))),
                           None)
        if problem:
            raise ValueError(problem)
        return value

    def unread_fields(self) -> set[str]:
        """The fields this section's own values make unread (their `ReadWhen` is false)."""
        return {name for name, info in type(self).model_fields.items()
                if (when := read_condition(info.metadata)) is not None and not when.holds(self)}

    @model_validator(mode="after")
    def _unread_refused(self) -> Any:
        for name in sorted(self.unread_fields()):
            info = type(self).model_fields[name]
            if name in self.model_fields_set and getattr(self, name) != info.get_default(call_default_factory=True):
                raise ValueError(f"{name} is read only when {read_condition(info.metadata).says}: "
                                 f"leave it out (got {getattr(self, name)!r})")
        return self

    def settings(self) -> dict[str, Any]:
        """The values in force as plain data (JSON types), without the fields nothing reads: what config.yaml
        holds and what a resume compares."""
        out: dict[str, Any] = {}
        unread = self.unread_fields()
        for name in type(self).model_fields:
            if name in unread:
                continue
            value = getattr(self, name)
            out[name] = value.settings() if isinstance(value, Section) else \
                type(self).__pydantic_serializer__.to_python(self, mode="json", include={name})[name]
        return out


class Spec(Section):
    """A setting made of a few fields that belong together (training.optimizer: its name, betas, epsilon and weight
    decay): --help lists it as one row and its fields below it. A bare value sets its `shorthand` field
    (`--training.optimizer adamw_8bit` is the name, the other fields keeping theirs); a field is set as
    `--training.optimizer.eps 1e-6`, and a file may write the whole mapping."""

    shorthand: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _bare_value(cls, value: Any) -> Any:
        return value if isinstance(value, (Mapping, BaseModel)) else {cls.shorthand: value}


def read_condition(metadata: Any) -> ReadWhen | None:
    return next((m for m in metadata if isinstance(m, ReadWhen)), None)


@dataclass(frozen=True)
class Registry:
    """The names a text field may hold: those of a registry, `module:NAME` (a tuple or dict of names). The
    registry is read when a value is checked (or --help lists the choices), not when the config is imported:
    its module may import torch."""

    ref: str
    what: str

    def names(self) -> tuple[str, ...]:
        module, _, attr = self.ref.partition(":")
        return tuple(getattr(importlib.import_module(module), attr))

    def check(self, value: str) -> str:
        names = self.names()
        if value not in names:
            raise ValueError(f"unknown {self.what} '{value}' (choose from {', '.join(names)})")
        return value

    def field(self) -> Any:
        """The annotation of a field holding one of the names."""
        return Annotated[str, AfterValidator(self.check), self]


@dataclass(frozen=True)
class Choices(Registry):
    """The names a text field may hold, listed here (where the settings are) because the module that implements
    them sits above config and checks that it covers them (eval's suites, data's datasets)."""

    listed: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return self.listed


def choices(names: tuple[str, ...], what: str) -> Any:
    """The annotation of a field holding one of `names`; another value is "unknown WHAT 'x' (choose from ...)"."""
    return Choices("", what, names).field()


def registry_of(annotation: Any, metadata: tuple[Any, ...] = ()) -> Registry | None:
    """The Registry behind a field (`registered` metadata, or inside `list[...]` / `... | None`), or None."""
    found = next((m for m in (*metadata, *getattr(annotation, "__metadata__", ())) if isinstance(m, Registry)), None)
    for arg in get_args(annotation) if found is None else ():
        found = found or registry_of(arg)
    return found
