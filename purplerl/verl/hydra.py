"""Writing and reading Hydra command-line overrides (`key=value`) for the values the export produces.

Only the grammar subset needed here: null, booleans, numbers, plain or single-quoted strings, and flat lists.
A string that Hydra would read as another type ('true', '1e-3', 'null') or that holds a character of its
grammar is quoted, so every value reads back as exactly what was written (`parse_override`).
"""

from __future__ import annotations

import re
from typing import Any

from purplerl.errors import UserError

_PLAIN = re.compile(r"[A-Za-z0-9_./:+-]+\Z")  # no @: the export-dir placeholder is quoted, so a path with spaces works
_KEY = re.compile(r"\+?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def format_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(format_value(item) for item in value) + "]"
    if isinstance(value, str):
        if _PLAIN.match(value) and _scalar(value) == value:
            return value
        return quote(value)
    raise UserError(f"cannot write {type(value).__name__} value {value!r} as a Hydra override")


def quote(text: str) -> str:
    """`text` as a single-quoted Hydra value that reaches the composed config as itself. Two readers unescape it:
    Hydra's override parser halves a run of backslashes just before a quote (an escaped one or the closing one),
    and OmegaConf reads `${` as an interpolation and halves a run of backslashes just before one; elsewhere a
    backslash is literal (Hydra's override grammar, "Quoted values"; OmegaConf's "Escaping in interpolations")."""
    text = re.sub(r"(\\*)\$\{", lambda m: m[1] * 2 + "\\${", text)
    text = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", text)
    return "'" + re.sub(r"(\\+)\Z", lambda m: m[1] * 2, text) + "'"


def _halve(match: re.Match[str]) -> str:
    return match[1][: len(match[1]) // 2]


def unquote(text: str) -> str:
    """The inverse of `quote`: what a single-quoted Hydra value stands for in the composed config."""
    body = re.sub(r"(\\*)\\'", lambda m: _halve(m) + "'", text[1:-1])
    body = re.sub(r"(\\+)\Z", _halve, body)
    return re.sub(r"(\\*)\\\$\{", lambda m: _halve(m) + "${", body)


def format_override(key: str, value: Any) -> str:
    return f"{key}={format_value(value)}"


def _scalar(text: str) -> Any:
    """An unquoted Hydra scalar: null, bool, int, float, else the text itself."""
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _split_list(body: str) -> list[str]:
    items, current, quoted = [], "", False
    for i, ch in enumerate(body):
        backslashes = len(body[:i]) - len(body[:i].rstrip("\\"))
        if ch == "'" and backslashes % 2 == 0:  # an odd run before a quote escapes it
            quoted = not quoted
        if ch == "," and not quoted:
            items.append(current)
            current = ""
        else:
            current += ch
    return [*items, current] if body else []


def parse_value(text: str) -> Any:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [parse_value(item) for item in _split_list(text[1:-1])]
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return unquote(text)
    return _scalar(text)


def parse_override(line: str) -> tuple[str, Any]:
    """('a.b', value) of 'a.b=value'; UserError naming the line when it is not an override."""
    key, eq, value = line.partition("=")
    if not eq or not _KEY.match(key):
        raise UserError(f"not a veRL override KEY=VALUE: {line!r}")
    return key, parse_value(value)
