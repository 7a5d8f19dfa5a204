"""The MATH answer rules: the last `\\boxed{}` of a text, each normalisation rule on hand-worked answers, and hostile
text that must neither crash nor take long."""

from __future__ import annotations

import time

import pytest

from purplerl.eval.math_answers import answers_match, last_boxed, normalize_answer


@pytest.mark.parametrize(("text", "expected"), [
    (r"so the answer is $\boxed{42}$.", "42"),
    (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),  # nested braces kept whole
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
    (r"first \boxed{1}, on second thought \boxed{2}", "2"),  # the last box is the answer
    (r"\boxed 5$ is it", "5"),  # `\boxed 5`: the token after the space
    (r"\boxed 7", "7"),
    (r"\boxed {8}", "8"),
    (r"\fbox{9}", "9"),
    (r"\boxed{1} and \fbox{3}", "3"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are content
    (r"\boxed{}", ""),  # an empty box: empty content (it matches nothing)
    (r"\boxed{1} then cut off \boxed{\frac{2", None),  # the last box never closes: no answer
    (r"\boxed{3", None),
    (r"\boxed", None),
    (r"\boxed$", None),
    (r"\boxedsymbol{4}", None),  # another command, not a box
    ("The answer is 12.", None),
    ("", None),
])
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(("answer", "normal"), [
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),  # \left, \right and spaces
    (r"10\!000", "10000"), (r"1\,000", "1000"), (r"3\;x", "3x"), (r"\quad 4", "4"),
    (r"\displaystyle\frac12", r"\frac{1}{2}"),
    (r"$5$", "5"), (r"\$40", "40"),  # dollar signs: math mode and money
    ("5.", "5"), (r"\frac{1}{2}.", r"\frac{1}{2}"),  # a trailing period
    (r"5\text{ cm}", "5"), (r"5 \text{ cm}^2", "5"), (r"12\mbox{ inches}", "12"), ("7 cm", "7"),
    ("6 square units", "6"), ("3 dollars", "3"),  # units
    (r"30^\circ", "30"), (r"30^{\circ}", "30"), ("30°", "30"), (r"\text{(B)}", "(B)"),  # degrees; a lone \text
    (r"\dfrac{3}{4}", r"\frac{3}{4}"), (r"\tfrac{3}{4}", r"\frac{3}{4}"),  # fraction variants
    (r"\frac12", r"\frac{1}{2}"), (r"\frac1{2}", r"\frac{1}{2}"), (r"\frac{1}2", r"\frac{1}{2}"),
    (r"\frac\pi2", r"\frac{\pi}{2}"), (r"\frac{\frac12}{3}", r"\frac{\frac{1}{2}}{3}"),
    (r"\sqrt2", r"\sqrt{2}"), (r"\frac{\sqrt3}2", r"\frac{\sqrt{3}}{2}"), (r"\sqrt[3]8", r"\sqrt[3]{8}"),
    ("0.5", "0.5"), (".5", "0.5"), ("0.50", "0.5"), ("007", "7"), ("-0.0", "0"), ("2.", "2"),  # decimals
    (r"\frac{.5}{2}", r"\frac{0.5}{2}"),
    ("3/4", r"\frac{3}{4}"), ("-3/4", r"-\frac{3}{4}"), ("x/4", "x/4"),  # a ratio of integers only
    ("x = 3", "3"), (r"\theta = 3", "3"), ("y_1 = -2", "-2"), ("x = y = 3", "x=y=3"),  # a named unknown
    ("1,000", "1000"), ("1,000,000.5", "1000000.5"), ("-12,345", "-12345"), (r"1{,}000", "1000"),
    ("(1,2)", "(1,2)"), ("1,2,3", "1,2,3"), ("12,34", "12,34"),  # lists stay lists
    (r"50\%", "50"), ("50%", "50"),  # percent
    ("\u22124", "-4"),  # a typeset minus sign
])
def test_normalize_answer(answer: str, normal: str) -> None:
    assert normalize_answer(answer) == normal


@pytest.mark.parametrize(("predicted", "reference"), [
    (r"\dfrac{1}{2}", r"\frac12"), ("x = 5", "5"), (".5", "0.5"), ("1/2", r"\frac{1}{2}"),
    (r"90^\circ", "90"), (r"\$1,000", "1000"), (r"12 \text{ cm}", "12"), (r"\left(1, 2\right)", "(1,2)"),
])
def test_equal_after_normalisation(predicted: str, reference: str) -> None:
    assert answers_match(predicted, reference)


@pytest.mark.parametrize(("predicted", "reference"), [
    ("0.5", r"\frac{1}{2}"),  # no algebra, as MATH's scorer
    ("-3", "3"), (r"\frac{2}{4}", r"\frac{1}{2}"), ("1,2", "12"),
    (None, "3"), ("", "3"), (r"\,", ""), ("", ""),  # no answer (or one that normalises to nothing) matches nothing
])
def test_different_after_normalisation(predicted: str | None, reference: str) -> None:
    assert not answers_match(predicted, reference)


HOSTILE = ["{" * 300_000, "}" * 300_000, r"\frac{" * 60_000, r"\boxed{" * 60_000, r"\sqrt[" * 60_000,
           r"\text{" * 60_000, r"\boxedx" * 60_000, "1" * 300_000 + "x", "1," * 150_000, "\\" * 300_000,
           r"\boxed{" + "a" * 300_000, r"\frac" * 60_000 + "1", r"x=" * 100_000, "\x00\ufffd" * 100_000,
           r"\boxed{\frac{\left(" + "}" * 1000, "$" * 300_000]


@pytest.mark.parametrize("text", HOSTILE, ids=[f"{t[:8]!r}x{len(t)}" for t in HOSTILE])
def test_hostile_text_neither_crashes_nor_hangs(text: str) -> None:
    began = time.perf_counter()
    boxed = last_boxed(text)
    assert boxed is None or isinstance(boxed, str)
    assert isinstance(normalize_answer(text), str)
    assert answers_match(text, "1") in (True, False)
    assert answers_match(boxed, text) in (True, False)
    # linear in the text: well under a second for ~300 KB (a quadratic scan would take minutes)
    assert time.perf_counter() - began < 5.0
