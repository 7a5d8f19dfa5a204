"""`purplerl --help` and every `purplerl CMD --help` stay fast: they import neither torch and the model libraries nor
purplerl's data and engines, which the commands import when they run (issue 33, point 4). Checked in a fresh
process: this one has imported them all already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).parents[1]

# Runs in the child: records which module imported each module first, then asks every command for its --help (in
# the order `purplerl --help` lists them) and reports, per command, the forbidden modules it imported and their
# chain of importers.
CHILD = r'''
import json
import sys

FORBIDDEN = ("torch", "transformers", "peft", "datasets", "purplerl.data", "purplerl.engines")
# the engine capabilities a recipe row declares, and the package that holds them: torch-free (the import contract
# capabilities-torch-free), so a row may name them
ALLOWED = ("purplerl.engines", "purplerl.engines.capabilities")
importer_of = {}


class Recorder:
    """Not a finder: notes the module whose code asks for each module (the first time it is asked for)."""

    def find_spec(self, name, path=None, target=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
            frame = frame.f_back
        importer_of.setdefault(name, frame.f_globals.get("__name__", "?") if frame is not None else "?")
        return None


def forbidden(name):
    return name not in ALLOWED and any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def chain(name):
    links = [name]
    while links[-1] in importer_of and importer_of[links[-1]] not in links:
        links.append(importer_of[links[-1]])
    return " <- ".join(links)


def imported(before):
    """The forbidden modules imported since `before`: the libraries by name, and the chain to each one that a
    module of the CLI's own imported."""
    new = sorted(name for name in set(sys.modules) - before if forbidden(name))
    if not new:
        return None
    libraries = sorted({f for name in new for f in FORBIDDEN if name == f or name.startswith(f + ".")})
    first = [name for name in new if name in importer_of and not forbidden(importer_of[name])]
    return {"libraries": libraries, "chains": [chain(name) for name in first or new]}


sys.meta_path.insert(0, Recorder())
import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

before = set(sys.modules)
from purplerl.cli import app  # noqa: E402  (what importing the CLI loads counts against `purplerl --help`)

group = typer.main.get_command(app)
commands = [[]]
for name, command in group.commands.items():
    commands.append([name])
    commands += [[name, sub] for sub in getattr(command, "commands", {})]
report = {"commands": [" ".join(c) for c in commands], "failed": {}, "imported": {}}
for command in commands:
    result = CliRunner().invoke(app, [*command, "--help"])
    where = " ".join(["purplerl", *command, "--help"])
    if result.exit_code != 0:
        report["failed"][where] = f"exit {result.exit_code}: {result.output[-500:]}"
    if (found := imported(before)) is not None:
        report["imported"][where] = found
    before = set(sys.modules)
print(json.dumps(report))
'''


def test_help_of_every_command_imports_no_torch_data_or_engines() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the child failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"attack", "defend", "sft", "tamper-test", "pipeline", "sweep", "data prepare", "verl export"} <= \
        set(report["commands"]), f"the app lists other commands: {report['commands']}"
    assert report["failed"] == {}, f"--help failed: {report['failed']}"
    lines = [f"`{command}` imports {', '.join(found['libraries'])}:\n    " + "\n    ".join(found["chains"])
             for command, found in report["imported"].items()]
    assert lines == [], "--help must not load what only a run needs (import it where the command runs):\n" + \
        "\n".join(lines)
