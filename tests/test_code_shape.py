"""The size bar of the package's code (STYLE.md: functions short, split by responsibility): every function's body,
its docstring left out, is at most FUNCTION_LINES lines. Modules are not held to a line count: a bar on files is met
by long lines or arbitrary cuts, a bar on functions by naming what each part does."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "purplerl"
FUNCTION_LINES = 60


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the function's end."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str) and len(body) > 1:
        body = body[1:]
    return node.end_lineno - body[0].lineno + 1


def test_every_function_is_short() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and body_lines(node) > FUNCTION_LINES:
                long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {body_lines(node)} lines")
    assert not long, f"functions over {FUNCTION_LINES} lines (split them by what each part does): {long}"


def test_the_bar_sees_a_long_function() -> None:
    source = "def f():\n    '''doc'''\n" + "    x = 1\n" * (FUNCTION_LINES + 1)
    (node,) = ast.parse(source).body
    assert body_lines(node) == FUNCTION_LINES + 1
