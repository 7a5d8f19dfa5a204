"""What every `purplerl` command shares: the app, the option style (`--section.field VALUE`, short names, `--config`),
the settings table at the end of each --help, and one-line errors."""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand

from purplerl.config import Command, field_help, load_command_config, section_descriptions, specs_in_force
from purplerl.errors import PurplerlError, UserError
from purplerl.rewards.named import expand_named
from purplerl.rewards.registry import term_params

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="purplerl: LLM safety research with reinforcement learning.")

OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True, "max_content_width": 120}
ConfigFile = Annotated[Path | None, typer.Option(help="YAML or JSON config file (the sections listed below)")]
Resume = Annotated[Path | None, typer.Option(help="continue this run dir from its latest intact checkpoint")]
Restart = Annotated[bool, typer.Option(help="with --resume: start a run that has no intact checkpoint again from "
                                            "step 1 (its logs are replaced)")]


REWARD_OPTIONS = ("reward", "rewards_file")  # --reward NAME, --rewards-file FILE: they expand into reward.terms


def split_named_reward(args: list[str]) -> tuple[list[str], str | None, str | None]:
    """(`args` without `--reward NAME` and `--rewards-file FILE`, the named reward, the rewards file it may be
    chosen from); UserError for an option given twice or without its value."""
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        key, eq, value = args[i][2:].partition("=") if args[i].startswith("--") else ("", "", "")
        key = key.replace("-", "_")
        if key not in REWARD_OPTIONS:
            rest.append(args[i])
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise UserError(f"option --{key.replace('_', '-')} needs a value")
            value, i = args[i + 1], i + 1
        if key in found:
            raise UserError(f"--{key.replace('_', '-')} is given twice: '{found[key]}' and '{value}'")
        found[key] = value
        i += 1
    return rest, found.get("reward"), found.get("rewards_file")


def with_named_reward(args: list[str]) -> list[str]:
    """`args` with `--reward NAME` (and `--rewards-file FILE`, whose named rewards it may choose from) replaced by
    the `--reward.terms` they expand into (purplerl.rewards.named), so the settings hold the terms themselves, not
    a name or a file that may change. Without --reward, args are returned as they are. A recipe's run reads them
    through purplerl.launch instead."""
    rest, reward, rewards_file = split_named_reward(args)
    if reward is None and rewards_file is None:
        return args
    if reward is None:
        raise UserError("--rewards-file FILE adds named rewards to choose from: choose one with --reward NAME")
    if any(a.startswith("--") and a[2:].split("=")[0].replace("-", "_") == "reward.terms" for a in rest):
        raise UserError("give --reward NAME or --reward.terms, not both")
    return [*rest, "--reward.terms", json.dumps(expand_named(reward, rewards_file))]


def _settings_in_force(command: Command) -> Any:
    """The settings the command line in force gives (so --help lists what they make read: `--engine vllm --help`
    shows the vLLM fields), or None when they do not validate."""
    args = [a for a in sys.argv[2:] if a not in ("--help", "-h")]
    args = args[1:] if args[:1] == ["export"] or args[:1] == ["prepare"] else args
    try:
        args = with_named_reward([a for a in args if not a.startswith("--config")])
        return load_command_config(command, None, args)
    except (PurplerlError, ValueError):
        return None


# --help lists the sections in the order a run uses them; a recipe's own sections after the reward, and the shared
# bookkeeping last
SECTION_ORDER = ("", "engine", "model", "sampling", "training", "data", "reward")
LAST_SECTIONS = ("logging", "run")


def _section_rank(where: str) -> int:
    top = where.split(".")[0]
    if top in LAST_SECTIONS:
        return len(SECTION_ORDER) + 1 + LAST_SECTIONS.index(top)
    return SECTION_ORDER.index(top) if top in SECTION_ORDER else len(SECTION_ORDER)


# --reward NAME is no setting of its own: a spelling of reward.terms, said in the reward section's header
NAMED_REWARD = ("; --reward NAME writes a named reward (purplerl/rewards/named_rewards.yaml, e.g. "
                "sentence_length_5_with_happy) or a registered term into reward.terms, and --rewards-file FILE adds "
                "your own named rewards to choose from")


Row = tuple[str, str, str, str]  # (dotted name, short name or "", value in force, description)


def settings_sections(command: Command, settings: Any) -> list[tuple[str, str, list[Row], bool]]:
    """(section, its description, its rows, whether they are fields listed under one setting) of `command`'s
    settings that `settings` (the values in force) make read, in --help's order. The parameters of each reward term
    in use follow as a section of their own, `reward.terms.NAME.params`, and the fields of a Spec setting
    (training.optimizer) as theirs: fields listed under their setting. What --help lists and what the documentation
    site's settings tables show (docs/hooks.py)."""
    flat = {dotted: short for short, dotted in command.flat.items() if "." in dotted}
    headers = section_descriptions(command.schema)
    by_section: dict[str, list[tuple[str, str, str, str]]] = {where: [] for where in ["", *headers]}
    for dotted, default, desc in field_help(command.schema, command.defaults, with_choices=True, settings=settings):
        value = _terms_shown(settings) if dotted == "reward.terms" else default
        by_section[dotted.rpartition(".")[0]].append((dotted, flat.get(dotted, ""), value, desc))
    # a term's parameters are the term's, not the recipe's settings (issue 35): listed under their term, each
    # set as --reward.terms.NAME.params.KEY VALUE
    under = set()
    for where, header, parameters in term_parameters(settings):
        headers[where] = f"{header}, each set as --{where}.KEY VALUE"
        by_section[where] = [(dotted, flat.get(dotted, ""), default, desc) for dotted, default, desc in parameters]
        under.add(where)
    # a setting of a few fields (training.optimizer, adversarial.judge) is one row, its fields listed below it
    for where, spec in specs_in_force(settings):
        headers[where] = f"the fields of {where}, each set as --{where}.KEY VALUE"
        by_section[where] = [(dotted, flat.get(dotted, ""), default, desc) for dotted, default, desc in
                             field_help(type(spec), with_choices=True, settings=spec, prefix=f"{where}.")]
        under.add(where)
    return [(where, headers.get(where, ""), rows, where in under)
            for where, rows in sorted(by_section.items(), key=lambda item: _section_rank(item[0])) if rows]


def config_help(command: Command) -> list[str]:
    """The settings of `command`, a header line per section: what `--help` shows below the options."""
    lines = ["Settings: --section.field VALUE or the short name in parentheses (dashes work too); values are "
             "YAML; a --config file holds the same sections. Settings that others switch on (e.g. engine.kind's "
             "own fields) are listed once they are on: --engine vllm --help."]
    settings = _settings_in_force(command)
    if settings is None:
        settings = load_command_config(command)
    for where, header, rows, under in settings_sections(command, settings):
        # fields listed under their setting are named by key: --WHERE.KEY
        body = [f"{'    ' + dotted.removeprefix(where + '.') if under else '  --' + dotted}"
                f"{f' (--{short})' if short else ''} [default {value}]: {desc}" for dotted, short, value, desc in rows]
        if where == "reward" and any(dotted == "reward.terms" for dotted, *_ in rows):
            header += NAMED_REWARD
        lines += [f"{where}: {header}" if where else "(top level)", *body]
    return lines


def _terms_shown(settings: Any) -> str:
    """reward.terms in force as --help shows it: each term's weight (and its fn, detector where they are not its
    name's); its parameters are listed below, under reward.terms.NAME.params."""
    shown = {}
    for name, spec in settings.reward.terms.items():
        extra = {"fn": spec.fn} if spec.fn != name else {}
        extra |= {"hack_at": spec.hack_at} if spec.hack_at is not None else {}
        shown[name] = {**extra, "weight": spec.weight} if extra else spec.weight
    return json.dumps(shown)


def term_parameters(settings: Any) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(where, header, rows) of the parameters of each reward term in force: what --help lists below the recipe's
    settings. A term carries its parameters (purplerl.rewards.named), so they are its settings, not the recipe's:
    they are listed for the terms in use, with the values these settings give them."""
    reward = getattr(settings, "reward", None)
    out = []
    for name, spec in (getattr(reward, "terms", None) or {}).items():
        values = term_params(spec.fn, spec.params or None)
        if values is None:
            continue
        where = f"reward.terms.{name}.params"
        use = f"'{name}'" if spec.fn == name else f"'{name}' (fn {spec.fn})"
        out.append((where, f"parameters of the reward term {use}",
                    field_help(type(values), with_choices=True, settings=values, prefix=f"{where}.")))
    return out


def config_command(command: Callable[[], Command]) -> type[TyperCommand]:
    """A command class whose --help ends with the command's settings, built only when help is asked for (listing a
    registry's choices imports it)."""

    class ConfigCommand(TyperCommand):
        settings = staticmethod(command)  # the settings it reads: what a check of documented commands validates

        def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            super().format_epilog(ctx, formatter)
            formatter.write_paragraph()
            for line in config_help(command()):
                formatter.write(line + "\n")

    return ConfigCommand


def say(line: str) -> None:
    typer.echo(line, err=True)


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # library deprecation notices say nothing about the experiment and bury the progress output
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def register_built_models() -> None:
    """Make the models purplerl builds on first use loadable by name in every command: importing
    purplerl.experiments.align registers embedded:smollm2-135m-safe, the attack's default target. Done when a command
    runs, not when the CLI is imported: the builder imports torch and the alignment data, which --help does not."""
    from purplerl.experiments import align  # noqa: F401


def reports_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command's body, run with the built models registered (`register_built_models`): user mistakes and failed
    experiments print one line and exit non-zero, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        register_built_models()
        try:
            return fn(*args, **kwargs)
        except PurplerlError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(err.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("interrupted: the last checkpoint is kept; continue with --resume RUN_DIR", err=True)
            raise typer.Exit(130) from None

    return wrapper


