"""What every config section shares: strict fields, no YAML retyping, and choices read from registries."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator

from purplerl.scalars import value_problem

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
# the reward server's API key comes from this env var only: a key must never land in a saved config.yaml
API_KEY_ENV = "PURPLERL_REWARD_API_KEY"

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
        value = [name.strip() for item in value for name in (item.split(",") if isinstance(item, str) else [item])]
    return value


class Section(BaseModel):
    # NaN and inf mean nothing in any setting here (null already says "never"), and a NaN threshold would
    # silently switch its check off: no float field takes them, new fields included.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

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


def registry_of(annotation: Any, metadata: tuple[Any, ...] = ()) -> Registry | None:
    """The Registry behind a field (`registered` metadata, or inside `list[...]` / `... | None`), or None."""
    found = next((m for m in (*metadata, *getattr(annotation, "__metadata__", ())) if isinstance(m, Registry)), None)
    for arg in get_args(annotation) if found is None else ():
        found = found or registry_of(arg)
    return found
