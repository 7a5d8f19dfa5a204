"""What a config field admits, and the values that YAML would silently retype into it.

YAML reads `yes`/`no`/`on`/`off`/`true` as booleans and `007` as a number. pydantic then takes True as
the integer 1 (`--steps yes` ran one step) and refuses a number for a text field without saying why.
A lone surrogate (bytes that are not UTF-8 on a command line) could never be written to config.yaml
nor tokenized. `value_problem` names each of these in one line; `config.Section` applies it to every field.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from purplerl.files import unicode_problem


def admitted_types(annotation: Any) -> set[Any]:
    """The value types a field admits: `int | None` -> {int, NoneType}; anything else (a Literal, a section,
    a dict, Any) stands for itself, and pydantic's own message for it is clear."""
    if get_origin(annotation) in (Union, types.UnionType):
        return set().union(*(admitted_types(arg) for arg in get_args(annotation)))
    return {annotation}


def value_problem(value: Any, annotation: Any) -> str | None:
    """Why `value` must not reach a field of type `annotation` (see the module docstring), or None."""
    admitted = admitted_types(annotation)
    if isinstance(value, bool) and bool not in admitted and admitted & {int, float, str}:
        hint = "; quote text that YAML reads as a boolean ('yes')" if str in admitted else ""
        return f"expected {_kind_of(admitted)}, got a boolean (YAML reads yes/no/on/off/true/false as booleans){hint}"
    if isinstance(value, int | float) and not isinstance(value, bool) and admitted <= {str, type(None)}:
        return f"expected text, got the number {value!r}: quote the value in YAML"
    if isinstance(value, str) and str in admitted and unicode_problem(value):
        return f"the text {unicode_problem(value)}"
    return None


def _kind_of(admitted: set[Any]) -> str:
    if str in admitted:
        return "text or a number" if admitted & {int, float} else "text"
    return "a number" if float in admitted else "an integer"
