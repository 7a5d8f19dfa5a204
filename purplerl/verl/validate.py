"""Checking veRL overrides against veRL's own default config, read from its wheel.

veRL composes `verl/trainer/config/ppo_trainer.yaml` from per-component files with Hydra; the wheel also
ships the composed result, `_generated_ppo_trainer.yaml`, which is what is read here. An override must
name a key that exists there (Hydra refuses a new key unless it is written `+key`) and hold a value of
the default's type: a bool for a bool, a number for a number, a string for a string, a list for a list. The
YAML writes some float fields as integers (`top_p: 1`), so an int default takes any number; a bool is never
a number. A null, an interpolation (`${...}`) or a required `???` default takes any value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from purplerl.config.migrate import get_path
from purplerl.errors import UserError
from purplerl.files import parse_yaml

GENERATED_CONFIG = "verl/trainer/config/_generated_ppo_trainer.yaml"
_MISSING = object()


def read_defaults(path: Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UserError(f"cannot read veRL's default config {path}: {err}") from None
    data = parse_yaml(text, path)
    if not isinstance(data, dict):
        raise UserError(f"veRL's default config {path} is not a mapping")
    return data


def type_problem(default: Any, value: Any) -> str | None:
    """Why `value` cannot replace `default`, or None."""
    if default is None or default == "???" or (isinstance(default, str) and "${" in default):
        return None
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int | float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif isinstance(default, str):
        # Hydra's string fields also hold a list where veRL accepts either (e.g. target_modules: all-linear)
        ok = isinstance(value, str) or (isinstance(value, list) and default == "all-linear")
    elif isinstance(default, list):
        ok = isinstance(value, list)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    else:
        ok = True
    return None if ok else f"expects {type(default).__name__} like {default!r}, got {value!r}"


def override_problems(overrides: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """One line per override that veRL would refuse or misread, [] when all fit."""
    problems = []
    for key, value in overrides.items():
        new = key.startswith("+")
        default = get_path(defaults, key.lstrip("+"), _MISSING)
        if default is _MISSING and not new:
            problems.append(f"{key}: no such key in veRL's config (a new key needs '+{key}')")
        elif default is not _MISSING and new:
            problems.append(f"{key}: the key exists already; '+' would make Hydra refuse it")
        elif default is not _MISSING:
            problem = type_problem(default, value)
            if problem:
                problems.append(f"{key}: {problem}")
    return problems
