"""Final answers of MATH-style solutions: the last `\\boxed{}` of a text, and the normal form two answers are
compared in.

The normal form follows the answer normalisation of the MATH benchmark (Hendrycks et al. 2021, "Measuring
Mathematical Problem Solving With the MATH Dataset"), written for this project: two answers are equal when
their normal forms are equal strings. It removes what does not change the value as MATH writes answers
(LaTeX spacing, `\\left`/`\\right`, `$`, `\\%`, degree marks, a trailing unit, a trailing period, `x =`
before the value, thousands commas) and writes what may be written several ways in one way (`\\dfrac` and
`\\tfrac` as `\\frac`, `\\frac12` as `\\frac{1}{2}`, `3/4` as `\\frac{3}{4}`, `.5` as `0.5`, `2.50` as
`2.5`). It does no algebra: `0.5` and `\\frac{1}{2}` stay different, as in the benchmark's own scorer.

Every function here reads any string, however malformed (unbalanced braces, an empty box, megabytes of
text), in time linear in its length, and never raises on its content.
"""

from __future__ import annotations

import re
from collections import deque

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_SPACE = re.compile(r"\s*")
_TOKEN = re.compile(r"[^\s$]+")
_BRACE_OR_ESCAPE = re.compile(r"\\[\s\S]|[{}]")
_COMMAND = re.compile(r"\\(?:[A-Za-z]+|[\s\S])?")
_ROOT_DEGREE = re.compile(r"\[[^\[\]]*\]")
# LaTeX spacing commands and the `\displaystyle` switch: they change the look, never the value.
_SPACING = re.compile(r"\\(?:[!,;:> ]|q?quad(?![A-Za-z])|displaystyle(?![A-Za-z]))")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_FRAC_VARIANTS = re.compile(r"\\[dtc]frac")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°")
_TEXT_COMMANDS = r"\\(?:text|textbf|textrm|mbox|mathrm)"
# A unit written as text after the value ("5\text{ cm}", "12 \mbox{ inches}^2"); the value is kept.
_TRAILING_TEXT = re.compile(_TEXT_COMMANDS + r"\s*\{[^{}]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*$")
_TEXT_WRAPPED = re.compile(_TEXT_COMMANDS + r"\s*\{([^{}]*)\}")
# A unit as a plain word after a number ("5 cm", "12 square units").
_NUMBER_THEN_UNIT = re.compile(
    r"^(-?[\d.,]+)\s*(?:(?:square|sq\.?|cubic)\s+)?(?:units?|cm|mm|km|m|meters?|inch(?:es)?|in|feet|foot|ft|"
    r"miles?|mph|degrees?|dollars?|cents?|hours?|minutes?|seconds?|days?|years?|pounds?|grams?|kg|g)"
    r"(?:\^\{?[23]\}?)?$")
# `x = 3`, `y_1 = 3`, `\theta = 3`: a single named unknown before the value.
_VARIABLE_IS = re.compile(r"^(?:[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)=([^=]+)$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_BARE_DECIMAL = re.compile(r"(?<![\d}])\.(\d)")
_PLAIN_NUMBER = re.compile(r"^(-?)(\d*)(?:\.(\d*))?$")
_INTEGER_RATIO = re.compile(r"^(-?)(\d+)/(\d+)$")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) in `text`, None when there is
    none or the last one never closes its brace (a cut-off answer is no answer). Nested braces are kept
    whole: `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`; an escaped `\\{` or `\\}` is content, not a brace."""
    found = deque(_BOX.finditer(text), maxlen=1)
    if not found:
        return None
    last = found[0]
    at = _SPACE.match(text, last.end()).end()
    if text.startswith("{", at):
        end = _closing_brace(text, at)
        return None if end is None else text[at + 1:end]
    token = _TOKEN.match(text, at) if at > last.end() else None  # `\boxed 5`: up to a `$` or whitespace
    return token.group(0) if token else None


def _closing_brace(text: str, open_at: int) -> int | None:
    """The index of the `}` that closes the `{` at `open_at`, None when it is never closed."""
    depth = 0
    for mark in _BRACE_OR_ESCAPE.finditer(text, open_at):  # `\{`, `\}` and `\\` are content, not braces
        char = mark.group(0)
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return mark.start()
    return None


def normalize_answer(answer: str) -> str:
    """`answer` in the normal form of the module doc: equal normal forms are the same answer."""
    s = answer.replace("\n", " ").replace("\u2212", "-").strip()  # a typeset minus sign is a minus
    s = _SPACING.sub("", s)
    s = _LEFT_RIGHT.sub("", s)
    s = _FRAC_VARIANTS.sub(r"\\frac", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = _DEGREES.sub("", s).strip().rstrip(".").strip()
    s = _drop_unit(s)
    s = _TEXT_WRAPPED.sub(r"\1", s)  # `\text{(B)}` is the answer `(B)`
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = s.replace("{,}", "")  # LaTeX's thousands separator `1{,}000`
    variable = _VARIABLE_IS.match(s)
    if variable:
        s = variable.group(1)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = _BARE_DECIMAL.sub(r"0.\1", s)
    s = _braced_arguments(_braced_arguments(s, "\\sqrt", 1), "\\frac", 2)
    ratio = _INTEGER_RATIO.match(s)
    if ratio:
        sign, numerator, denominator = ratio.groups()
        s = f"{sign}\\frac{{{numerator}}}{{{denominator}}}"
    return _plain_number(s)


def _plain_number(s: str) -> str:
    """A plain decimal number without leading or trailing zeros (`007.50` -> `7.5`, `-0.0` -> `0`), digit for
    digit (no rounding, however long); anything else as it is."""
    number = _PLAIN_NUMBER.match(s)
    if number is None or not (number.group(2) or number.group(3)):
        return s
    sign, whole, fraction = number.group(1), number.group(2).lstrip("0") or "0", (number.group(3) or "").rstrip("0")
    written = whole + (f".{fraction}" if fraction else "")
    return "0" if written == "0" else sign + written


def _drop_unit(s: str) -> str:
    """`s` without a unit after its value: a trailing `\\text{...}` when something precedes it, or a unit word
    after a plain number."""
    unit = _TRAILING_TEXT.search(s)
    if unit and s[:unit.start()].strip():
        return s[:unit.start()].strip()
    number = _NUMBER_THEN_UNIT.match(s)
    return number.group(1) if number else s


def _braced_arguments(s: str, command: str, count: int) -> str:
    """`s` with the first `count` arguments of every `command` in braces: `\\frac12` -> `\\frac{1}{2}`,
    `\\frac\\pi2` -> `\\frac{\\pi}{2}`, `\\sqrt3` -> `\\sqrt{3}`; a command whose argument is missing or never
    closes its brace is left as it is. Braces are only inserted, so commands nested in arguments are reached
    too, and matching braces are found once for the whole string (linear however deep the nesting)."""
    closes = _brace_pairs(s)
    inserts: list[tuple[int, str]] = []
    for found in re.finditer(re.escape(command), s):
        at = found.end()
        degree = _ROOT_DEGREE.match(s, at) if command == "\\sqrt" else None
        at = degree.end() if degree else at  # `\\sqrt[3]8`: the root's degree stays as it is
        for _ in range(count):
            if at >= len(s) or s[at] == "}":
                break
            if s[at] == "{":
                if at not in closes:
                    break
                at = closes[at] + 1
                continue
            name = _COMMAND.match(s, at) if s[at] == "\\" else None
            end = name.end() if name else at + 1
            inserts += [(at, "{"), (end, "}")]
            at = end
    pieces, done = [], 0
    for at, brace in sorted(inserts, key=lambda insert: insert[0]):  # stable: `}{` between two arguments
        pieces += [s[done:at], brace]
        done = at
    return "".join(pieces) + s[done:]


def _brace_pairs(s: str) -> dict[int, int]:
    """For each `{` of `s` that is closed, the index of its `}` (escaped braces are not braces)."""
    pairs, opened = {}, []
    for mark in _BRACE_OR_ESCAPE.finditer(s):
        if mark.group(0) == "{":
            opened.append(mark.start())
        elif mark.group(0) == "}" and opened:
            pairs[opened.pop()] = mark.start()
    return pairs


def answers_match(predicted: str | None, reference: str) -> bool:
    """Whether a predicted answer (None: the completion had none) equals `reference` after normalisation; an
    answer that normalises to nothing matches nothing."""
    if predicted is None:
        return False
    normal = normalize_answer(predicted)
    return normal != "" and normal == normalize_answer(reference)
