"""The two kinds of failure purplerl raises on purpose.

`UserError` is a mistake in what the user asked for (a bad config value, a missing file, an unknown
model): the CLI prints it as one line and exits with status 2. `ExperimentError` is a run that can no
longer be trusted (NaN in a reward, an empty group, a scorer returning the wrong number of scores): the
CLI prints it as one line and exits with status 1. Both stop the run; neither is ever swallowed.
"""


class PurplerlError(Exception):
    """Base class of the errors the CLI reports as one line."""

    exit_code = 1


class UserError(PurplerlError):
    """Bad input from the user: config, paths, model names, CLI options."""

    exit_code = 2


class ExperimentError(PurplerlError):
    """A run produced values that make its results meaningless (NaN, empty batch, wrong shapes)."""

    exit_code = 1


def first_line(what: BaseException | str) -> str:
    """The first line of an error's message (its type name when the message is empty), or of a text ('' when
    blank). A one-line error quotes only this: library messages often go on for a page."""
    text = str(what).strip()
    if text:
        return text.splitlines()[0]
    return type(what).__name__ if isinstance(what, BaseException) else ""
