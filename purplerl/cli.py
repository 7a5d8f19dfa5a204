"""The `purplerl` command: parses options, builds a config, calls the library. No logic of its own."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand

from purplerl.config import (
    ALIGN,
    API_KEY_ENV,
    EMBEDDED_MODEL,
    EVAL,
    EXPORT,
    PREPARE,
    REPORT,
    SAMPLE,
    Command,
    RewardServerConfig,
    build_server_config,
    field_help,
    load_command_config,
    read_config_file,
    section_descriptions,
)
from purplerl.errors import PurplerlError, UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="purplerl: LLM safety research with reinforcement learning.")

OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True, "max_content_width": 120}
ConfigFile = Annotated[Path | None, typer.Option(help="YAML or JSON config file (the sections listed below)")]
Resume = Annotated[Path | None, typer.Option(help="continue this run dir from its latest intact checkpoint")]
Restart = Annotated[bool, typer.Option(help="with --resume: start a run that has no intact checkpoint again from "
                                            "step 1 (its logs are replaced)")]


def _settings_in_force(command: Command) -> Any:
    """The settings the command line in force gives (so --help lists what they make read: `--engine vllm --help`
    shows the vLLM fields), or None when they do not validate."""
    args = [a for a in sys.argv[2:] if a not in ("--help", "-h")]
    args = args[1:] if args[:1] == ["export"] or args[:1] == ["prepare"] else args
    try:
        return load_command_config(command, None, [a for a in args if not a.startswith("--config")])
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


def config_help(command: Command) -> list[str]:
    """The settings of `command`, a header line per section: what `--help` shows below the options."""
    flat = {dotted: short for short, dotted in command.flat.items() if "." in dotted}
    headers = section_descriptions(command.schema)
    lines = ["Settings: --section.field VALUE or the short name in parentheses (dashes work too); values are "
             "YAML; a --config file holds the same sections. Settings that others switch on (e.g. engine.kind's "
             "own fields) are listed once they are on: --engine vllm --help."]
    by_section: dict[str, list[str]] = {where: [] for where in ["", *headers]}
    settings = _settings_in_force(command)
    if settings is None:
        settings = load_command_config(command)
    for dotted, default, desc in field_help(command.schema, command.defaults, with_choices=True, settings=settings):
        alias = f" (--{flat[dotted]})" if dotted in flat else ""
        by_section[dotted.rpartition(".")[0]].append(f"  --{dotted}{alias} [default {default}]: {desc}")
    for where, rows in sorted(by_section.items(), key=lambda item: _section_rank(item[0])):
        if rows:
            lines += [f"{where}: {headers[where]}" if where else "(top level)", *rows]
    return lines


def config_command(command: Callable[[], Command]) -> type[TyperCommand]:
    """A command class whose --help ends with the command's settings, built only when help is asked for (listing a
    registry's choices imports it)."""

    class ConfigCommand(TyperCommand):
        def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            super().format_epilog(ctx, formatter)
            formatter.write_paragraph()
            for line in config_help(command()):
                formatter.write(line + "\n")

    return ConfigCommand


def _say(line: str) -> None:
    typer.echo(line, err=True)


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # library deprecation notices say nothing about the experiment and bury the progress output
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def reports_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """User mistakes and failed experiments print one line and exit non-zero, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PurplerlError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(err.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("interrupted: the last checkpoint is kept; continue with --resume RUN_DIR", err=True)
            raise typer.Exit(130) from None

    return wrapper


def _recipe_config(recipe: Any, args: list[str], config: Path | None, resume: Path | None) -> Any:
    """Recipe defaults <- config file <- overrides; or, when resuming, the run's saved config <- overrides."""
    if resume is None:
        cfg = load_command_config(recipe.command(), config, args)
    else:
        if config is not None:
            raise UserError("--resume uses the run's saved config; do not pass --config with it")
        if not (resume / "config.yaml").is_file():
            raise UserError(f"{resume} is not a run dir (no config.yaml)")
        saved = read_config_file(resume / "config.yaml")
        if saved.get("recipe", recipe.name) != recipe.name:
            raise UserError(f"config is for recipe '{saved.get('recipe')}', not '{recipe.name}'")
        cfg = load_command_config(recipe.command(), None, args, base=recipe.migrated(saved, saved=True))
    if cfg.recipe != recipe.name:
        raise UserError(f"config is for recipe '{cfg.recipe}', not '{recipe.name}'")
    return cfg


def _restart(restart: bool, resume: Path | None) -> bool:
    if restart and resume is None:
        raise UserError("--restart goes with --resume RUN_DIR (it starts that run again from step 1)")
    return restart


def _run_recipe(recipe: Any, cfg: Any, resume: Path | None, restart: bool) -> None:
    """Run a training recipe, print its summary, and exit non-zero with one line when the run collapsed."""
    from purplerl.engines.distributed import under_torchrun
    from purplerl.train.runner import run_recipe
    from purplerl.train.stops import collapse_error

    _restart(restart, resume)
    if cfg.engine.procs > 1 and not under_torchrun():
        _run_workers(recipe, cfg, resume)
        return
    _quiet_libraries()
    if under_torchrun():
        from purplerl.engines.launch import stop_quietly_on_sigterm

        stop_quietly_on_sigterm()
    summary = run_recipe(recipe, cfg, resume_dir=resume, restart=restart)
    if os.environ.get("RANK", "0") != "0":  # rank 0 reports for the run
        return
    typer.echo(recipe.summarize(Path(summary["run_dir"]), summary, cfg))
    error = collapse_error(recipe.name, summary)
    if error is not None:
        raise error


def _run_workers(recipe: Any, cfg: Any, resume: Path | None) -> None:
    """--engine.procs N: this command again in N processes under torchrun (see purplerl.engines.launch)."""
    from purplerl.engines.launch import run_workers
    from purplerl.train.runner import run_dir_of

    procs, batch = cfg.engine.procs, cfg.training.batch_size
    if batch % procs:
        raise UserError(f"training.batch_size={batch} does not divide by engine.procs={procs}")
    run_workers(procs, sys.argv[1:], str(resume or run_dir_of(recipe, cfg)))


def _recipe_rows() -> dict[str, Any]:
    from purplerl.experiments import align  # noqa: F401 -- registers embedded:smollm2-135m-safe, the default target
    from purplerl.recipes import RECIPES

    return RECIPES


def _register_recipe(name: str, help_text: str) -> None:
    """The command of one row of the recipe table."""

    def command(ctx: typer.Context, config: ConfigFile = None, resume: Resume = None,
                restart: Restart = False) -> None:
        recipe = _recipe_rows()[name]
        _run_recipe(recipe, _recipe_config(recipe, ctx.args, config, resume), resume, restart)

    command.__doc__ = help_text
    app.command(name, context_settings=OVERRIDES,
                cls=config_command(lambda: _recipe_rows()[name].command()))(reports_errors(command))


for _row in _recipe_rows().values():
    _register_recipe(_row.name, _row.help)


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: ALIGN))
@reports_errors
def align(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Build embedded:smollm2-135m-safe: SmolLM2-135M-Instruct fine-tuned to refuse harmful requests (refusals
    written by this project) while answering benign ones as before (its own answers). Cached after the first run.
    With --eval true, measure refusal and utility of the base and the aligned model on held-out requests."""
    from purplerl.experiments.align import BASE_MODEL, SAFE_MODEL, aligned_model_dir

    cfg = load_command_config(ALIGN, config, ctx.args).align
    _quiet_libraries()
    typer.echo(f"embedded:{SAFE_MODEL} is {aligned_model_dir(notify=_say)}")
    if cfg.eval:
        import json

        from purplerl.eval.alignment import alignment_table, evaluate_alignment

        result = evaluate_alignment(BASE_MODEL, f"embedded:{SAFE_MODEL}", limit=cfg.limit, notify=_say)
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "align.json").write_text(json.dumps(result, indent=1))
        table = alignment_table(result)
        (out / "summary.txt").write_text(table + "\n")
        typer.echo(table)
        typer.echo(f"wrote {out / 'align.json'} and {out / 'summary.txt'}")


def _tamper() -> Command:
    from purplerl.experiments.tamper.settings import TAMPER

    return TAMPER


@app.command("tamper-test", context_settings=OVERRIDES, cls=config_command(_tamper))
@reports_errors
def tamper_test(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="YAML or JSON file: an attack config, plus the tamper, "
                                                     "utility and judges sections")] = None,
) -> None:
    """Attack a defended adapter (--adapter) and its base model under each threat model (--threats
    merged,adapter,sft,adaptive) for --seeds seeds; judge every attack on held-out prompts; verdict per threat.

    Writes OUT/tamper.json, OUT/tamper.png and OUT/summary.txt. Running it again resumes: finished attacks are
    reused, an unfinished one continues."""
    from purplerl.experiments.tamper import run_tamper_test, tamper_summary

    cfg = load_command_config(_tamper(), config, ctx.args)
    if cfg.recipe != "attack":
        raise UserError(f"config is for recipe '{cfg.recipe}', not 'attack'")
    _quiet_libraries()
    result = run_tamper_test(cfg, announce=_say)
    out = Path(cfg.tamper.out)
    typer.echo(tamper_summary(result))
    typer.echo(f"wrote {out / 'tamper.json'}, {out / 'tamper.png'}, {out / 'summary.txt'}")


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: EXPORT))
@reports_errors
def export(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Merge an adapter (--merge) into its base model's weights: OUT (--out) is a standard model dir
    (AutoModelForCausalLM loads it with its tokenizer) computing what the adapter-on model computes;
    OUT/purplerl_export.json says how to prompt it."""
    from purplerl.config import ModelLoadConfig, PromptFormatConfig
    from purplerl.engines.merge import merge_adapter
    from purplerl.runs.policy import resolve_policy

    cfg = load_command_config(EXPORT, config, ctx.args).export
    if cfg.merge is None or cfg.out is None:
        raise UserError("name the adapter and the output dir: --merge CHECKPOINT --out DIR (export.merge, export.out)")
    merge, out = Path(cfg.merge), Path(cfg.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not an empty dir: choose a new one")
    policy = resolve_policy(merge, ModelLoadConfig(name=cfg.model) if cfg.model else ModelLoadConfig(),
                            PromptFormatConfig())
    if policy.model.init_adapter is None:
        raise UserError(f"{merge} is already a full model dir (a full-parameter checkpoint): load it as it is")
    if policy.note:
        typer.echo(policy.note, err=True)
    info = {"adapter": str(merge.resolve()), "base_model": policy.model.name, "revision": policy.model.revision,
            "prompt": policy.prompt.model_dump(mode="json")}
    typer.echo(f"wrote {merge_adapter(merge, out, policy.model.name, metadata={'purplerl_export.json': info})}")


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: REPORT), options_metavar="RUN_DIR [OPTIONS]")
@reports_errors
def report(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Write RUN_DIR/report.html (curves, first-vs-last summary, samples) and RUN_DIR/plots/*.png."""
    from purplerl.eval.report import training_report

    cfg = load_command_config(REPORT, config, ctx.args).report
    if cfg.run_dir is None:
        raise UserError("name the run: purplerl report RUN_DIR (report.run_dir)")
    typer.echo(f"wrote {training_report(Path(cfg.run_dir))}")


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: SAMPLE))
@reports_errors
def sample(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Generate from a trained adapter (--checkpoint) or from a base model (--model) for each --prompt.

    A run's checkpoint is prompted as its run was trained (template, system prompt, base model)."""
    from purplerl.recipes.sample import generate

    cfg = load_command_config(SAMPLE, config, ctx.args)
    _quiet_libraries()
    for prompt, texts in zip(cfg.sample.prompts, generate(cfg, announce=_say), strict=True):
        typer.echo(f"### {prompt}")
        for text in texts:
            typer.echo(text.strip() or "(empty)")
            typer.echo("---")


@app.command(name="eval", context_settings=OVERRIDES, cls=config_command(lambda: EVAL))
@reports_errors
def evaluate(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Evaluate the base model and each --checkpoint: harm, utility and diversity with 95% bootstrap CIs.

    Each checkpoint of a run is prompted as its run was trained; the base model is the checkpoints' own.
    Writes OUT/generations/<label>.jsonl (resumable), OUT/eval.json and OUT/report.html; prints a table."""
    from purplerl.eval.run import eval_table, run_eval

    cfg = load_command_config(EVAL, config, ctx.args)
    _quiet_libraries()
    result = run_eval(cfg, announce=_say)
    out = Path(cfg.eval.out)
    typer.echo(eval_table(result))
    typer.echo(f"wrote {out / 'eval.json'} and {out / 'report.html'}")


data_app = typer.Typer(no_args_is_help=True, help="Datasets: prepare hub datasets as veRL-schema parquet.")
app.add_typer(data_app, name="data")


@data_app.command("prepare", context_settings=OVERRIDES, cls=config_command(lambda: PREPARE),
                  options_metavar="DATASET [OPTIONS]")
@reports_errors
def data_prepare(ctx: typer.Context,
                 config: ConfigFile = None) -> None:
    """Write DATASET's train.parquet and test.parquet in veRL's schema (prompt, data_source, reward_model, ...)."""
    from purplerl.data.prepare import prepare_dataset

    cfg = load_command_config(PREPARE, config, ctx.args)
    typer.echo(prepare_dataset(cfg.prepare).describe())


verl_app = typer.Typer(no_args_is_help=True, help="veRL: run purplerl's recipes on a GPU cluster with veRL.")
app.add_typer(verl_app, name="verl")


def _verl_command(recipe_name: str = "attack") -> Command:
    """A recipe's settings plus the veRL run's own section."""
    from pydantic import Field, create_model

    from purplerl.config import VerlConfig

    recipe = _recipe_rows().get(recipe_name)
    if recipe is None:
        raise UserError(f"unknown recipe '{recipe_name}' (known: {', '.join(_recipe_rows())})")
    schema = create_model(f"{recipe.settings.__name__}Verl", __base__=recipe.settings, verl=(VerlConfig, Field(
        default_factory=VerlConfig, description="the veRL run: cluster shape, rollout engine, output dir")))
    command = recipe.command()
    return Command(schema, {**command.flat, **{name: f"verl.{name}" for name in VerlConfig.model_fields}},
                   command.defaults, migrate=command.migrate)


@verl_app.command("export", context_settings=OVERRIDES, cls=config_command(_verl_command))
@reports_errors
def verl_export(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Write --out DIR for a veRL 0.9 run of an RL recipe's config (attack by default): prompts as veRL parquet,
    purplerl's reward behind veRL's custom-reward hook, the settings as Hydra overrides (run_verl.sh), and every
    setting veRL cannot honour named. A reward that needs the policy's token entropies (defend's) is refused:
    veRL's reward hook sees only the decoded response."""
    from purplerl.verl.export import export_verl

    recipe = _export_recipe(ctx.args, config)
    cfg = load_command_config(_verl_command(recipe), config, ctx.args)
    if cfg.recipe != recipe:
        raise UserError(f"config is for recipe '{cfg.recipe}', not '{recipe}'")
    typer.echo(export_verl(cfg, announce=_say).describe())


def _export_recipe(args: list[str], config: Path | None) -> str:
    """The recipe whose settings a veRL export reads: --recipe NAME, else the config file's, else attack (the
    settings tree is the recipe's own, so it is chosen before the settings are read)."""
    for i, arg in enumerate(args):
        if arg == "--recipe" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--recipe="):
            return arg.partition("=")[2]
    recipe = read_config_file(config).get("recipe", "attack") if config is not None else "attack"
    return recipe if isinstance(recipe, str) else "attack"


def _server_option(field: str, **kwargs: Any) -> Any:
    """A serve-reward option whose help text is the RewardServerConfig field's description."""
    return typer.Option(help=RewardServerConfig.model_fields[field].description, **kwargs)


def _server_default(field: str) -> Any:
    return RewardServerConfig.model_fields[field].default


def _server_option_name(field: str) -> str:
    name = "--" + field.replace("_", "-")
    return f"{name} (or env {API_KEY_ENV})" if field == "api_key" else name


def _serve_command() -> Command:
    from purplerl.config.commands import SERVE_REWARD

    return SERVE_REWARD


@app.command(name="serve-reward", context_settings=OVERRIDES, cls=config_command(_serve_command))
@reports_errors
def serve_reward(
    ctx: typer.Context,
    config: ConfigFile = None,
    model: Annotated[str, _server_option("model")] = _server_default("model"),
    label: Annotated[str | None, _server_option("label")] = None,
    host: Annotated[str, _server_option("host")] = _server_default("host"),
    port: Annotated[int, _server_option("port")] = _server_default("port"),
    device: Annotated[str, _server_option("device")] = _server_default("device"),
    api_key: Annotated[str | None, _server_option("api_key", envvar=API_KEY_ENV, show_default=False)] = None,
    max_texts: Annotated[int, _server_option("max_texts")] = _server_default("max_texts"),
    max_chars: Annotated[int, _server_option("max_chars")] = _server_default("max_chars"),
    max_batch_texts: Annotated[int, _server_option("max_batch_texts")] = _server_default("max_batch_texts"),
    batch_wait_ms: Annotated[float, _server_option("batch_wait_ms")] = _server_default("batch_wait_ms"),
    max_pending: Annotated[int, _server_option("max_pending")] = _server_default("max_pending"),
    max_body_bytes: Annotated[int, _server_option("max_body_bytes")] = _server_default("max_body_bytes"),
    score_timeout_s: Annotated[float, _server_option("score_timeout_s")] = _server_default("score_timeout_s"),
    header_timeout_s: Annotated[float, _server_option("header_timeout_s")] = _server_default("header_timeout_s"),
    body_timeout_s: Annotated[float, _server_option("body_timeout_s")] = _server_default("body_timeout_s"),
    keep_alive_s: Annotated[float, _server_option("keep_alive_s")] = _server_default("keep_alive_s"),
    max_connections: Annotated[int, _server_option("max_connections")] = _server_default("max_connections"),
    max_header_bytes: Annotated[int, _server_option("max_header_bytes")] = _server_default("max_header_bytes"),
    batch_size: Annotated[int, _server_option("batch_size")] = _server_default("batch_size"),
    max_length: Annotated[int, _server_option("max_length")] = _server_default("max_length"),
) -> None:
    """Serve a toxicity scorer over HTTP (POST /score) for runs with --reward.toxicity.url URL, or any registered
    text reward term (--term NAME --params '{...}'). Settings: the options below, or --server.FIELD / --serve.FIELD
    and --config FILE as for every command."""
    options = {k: v for k, v in locals().items() if k in RewardServerConfig.model_fields and v is not None}
    settings = build_server_config(options, _server_option_name)  # before the server's imports: a typo fails fast
    served = None
    if ctx.args or config is not None:
        given = {k: v for k, v in options.items() if k == "api_key" or ctx.get_parameter_source(k).name != "DEFAULT"}
        cfg = load_command_config(_serve_command(), config, ctx.args, base={"server": given})
        settings, served = cfg.server, cfg.serve
    from purplerl.rewards.server import exposure_warning, serve

    warning = exposure_warning(settings)
    if warning:
        typer.echo(warning, err=True)
    _quiet_libraries()
    if served is not None and served.term is not None:
        serve(settings, term=served.term, params=served.params, announce=lambda line: typer.echo(line, err=True))
        return
    serve(settings, announce=lambda line: typer.echo(line, err=True))


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()

__all__ = ["app", "main", "EMBEDDED_MODEL", "config_help"]
