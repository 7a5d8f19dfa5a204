"""Every `purplerl ...` command line in a fenced block of the README and the docs is parsed by the real CLI and its
settings validated, without running the work (issue 38): a renamed option, a bad value or an in-repo file that moved
fails here, not for the reader. What a reader must supply (RUN_DIR, M, <run>, their own data file) is a placeholder:
its value is checked as the setting's type, not as a file."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from purplerl.cli import app
from purplerl.cli.base import with_named_reward
from purplerl.config import load_command_config

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
PROGRAM = re.compile(r"^(?:\$ )?(?:\.venv/bin/)?purplerl(?:\s|$)")
FENCE = re.compile(r"^\s*```")
# the in-repo folders a documented file must exist in (what the reader is told is there)
IN_REPO = ("examples/", "docs/", "purplerl/", "bench/", "scripts/")


def documented_commands() -> list[tuple[str, list[str]]]:
    """(file:line, argv after `purplerl`) of every command line in a fenced block, continuations joined."""
    found = []
    for doc in DOCS:
        fenced, pending, start = False, "", 0
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                continue
            if pending:
                pending += " " + line.strip()
            elif PROGRAM.match(line.strip()):
                pending, start = line.strip(), number
            if pending and not pending.endswith("\\"):
                found.append((f"{doc.relative_to(ROOT)}:{start}", _words(pending)))
                pending = ""
            pending = pending[:-1] if pending.endswith("\\") else pending
    return found


def _words(line: str) -> list[str]:
    line = re.sub(r"<[^<>]*>", "RUN", line)  # runs/<defend run>/...: a placeholder path
    words = shlex.split(line, comments=True)
    return words[1:]


def _command(words: list[str]) -> tuple[Any, list[str], str]:
    """(the click command `words` name, the words after its name, its name); typer's click is its own copy, so a
    group is what has subcommands."""
    group: Any = typer.main.get_command(app)
    path = []
    while hasattr(group, "commands") and words and words[0] in group.commands:
        path.append(words[0])
        group, words = group.commands[words[0]], words[1:]
    return group, words, " ".join(path)


COMMANDS = documented_commands()


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 40, COMMANDS  # the README and the site's pages show ~65


@pytest.mark.parametrize(("where", "words"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_parses_and_validates(where: str, words: list[str]) -> None:
    command, rest, name = _command(words)
    assert name, f"{where}: `purplerl {' '.join(words)}` names no command"
    if "--help" in rest or not rest and hasattr(command, "commands"):
        return
    settings = getattr(command, "settings", None)
    ctx = command.make_context(name, list(rest), resilient_parsing=False)
    for value in ctx.params.values():
        if isinstance(value, Path) and str(value).startswith(IN_REPO):
            assert (ROOT / value).exists(), f"{where}: {value} does not exist"
    if settings is None:  # a command without settings of its own (doctor, data prepare's subcommands' own parser)
        return
    config, args = ctx.params.get("config"), list(ctx.args)
    if name in LOADERS and args and not args[0].startswith("--"):  # the file as the first argument
        config = Path(args.pop(0))
    if config is not None and str(config).startswith(IN_REPO):
        config = ROOT / config
    elif config is not None:
        config = None  # the reader's own file
    if name in LOADERS:
        LOADERS[name](config, args)
    else:
        load_command_config(settings(), config, with_named_reward(args))


def _load_pipeline(config: Path | None, args: list[str]) -> None:
    from purplerl.experiments.pipeline import load_pipeline

    load_pipeline(config, args)


def _load_sweep(config: Path | None, args: list[str]) -> None:
    from purplerl.experiments.sweep.plan import plan_sweep
    from purplerl.experiments.sweep.settings import load_sweep

    plan_sweep(load_sweep(config, args))


# commands whose settings are a file of stages or a grid, read by their own loader (as the command reads them)
LOADERS = {"pipeline": _load_pipeline, "sweep": _load_sweep}
