"""The `purplerl` command: parses options, builds a config, calls the library. No logic of its own. A recipe's
command comes from its row of the recipe table; what every command shares is in cli/base.py, the commands around
runs in cli/serving.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from purplerl import __version__
from purplerl.cli.base import (
    OVERRIDES,
    ConfigFile,
    Restart,
    Resume,
    app,
    config_command,
    quiet_libraries,
    reports_errors,
    say,
    split_named_reward,
    with_named_reward,
)
from purplerl.config import ALIGN, EMBEDDED_MODEL, EVAL, PREPARE, SAMPLE, Command, load_command_config, read_config_file
from purplerl.errors import PurplerlError, UserError
from purplerl.outputs import check_output_dir
from purplerl.recipes import RECIPES


def _recipe_config(recipe: Any, args: list[str], config: Path | None, resume: Path | None) -> Any:
    """Recipe defaults <- config file <- overrides; or, when resuming, the run's saved config <- overrides
    (purplerl.launch)."""
    from purplerl.launch import run_settings

    options, reward, rewards_file = split_named_reward(args)
    saved = None
    if resume is not None:
        if config is not None:
            raise UserError("--resume uses the run's saved config; do not pass --config with it")
        from purplerl.train.runner import saved_settings  # lazily, like the runner: --help stays fast

        saved = saved_settings(recipe, resume)
    return run_settings(recipe, file=config, options=options, saved=saved, reward=reward, rewards_file=rewards_file)


def _restart(restart: bool, resume: Path | None) -> bool:
    if restart and resume is None:
        raise UserError("--restart goes with --resume RUN_DIR (it starts that run again from step 1)")
    return restart


def _run_recipe(recipe: Any, cfg: Any, resume: Path | None, restart: bool) -> None:
    """Run a training recipe, print its summary, and exit non-zero with one line when the run collapsed."""
    from purplerl.engines.distributed import under_torchrun
    from purplerl.recipes.summary import finished_run_summary
    from purplerl.train.runner import run_recipe
    from purplerl.train.stops import collapse_error

    _restart(restart, resume)
    _check_run_paths(recipe, cfg, resume)
    if cfg.engine.procs > 1 and not under_torchrun():
        _run_workers(recipe, cfg, resume)
        return
    quiet_libraries()
    if under_torchrun():
        from purplerl.engines.launch import stop_quietly_on_sigterm, stop_silently_on_sigterm

        stop_quietly_on_sigterm()
        try:
            summary = run_recipe(recipe, cfg, resume_dir=resume, restart=restart)
        except BaseException:
            stop_silently_on_sigterm()  # this rank's own error line follows; the agent's stop adds none
            raise
    else:
        summary = run_recipe(recipe, cfg, resume_dir=resume, restart=restart)
    if os.environ.get("RANK", "0") != "0":  # rank 0 reports for the run
        return
    typer.echo(finished_run_summary(recipe, summary, cfg))
    error = collapse_error(recipe.name, summary)
    if error is not None:
        raise error


def _check_run_paths(recipe: Any, cfg: Any, resume: Path | None) -> None:
    """The run dir, the init adapter and a quantized base, checked before any work starts (and before torchrun
    starts workers)."""
    from purplerl.engines import check_init_adapter, check_quantize
    from purplerl.launch import run_dir

    if resume is None:
        check_output_dir(run_dir(recipe, cfg), "run dir (run.output_dir/run.name)")
    else:
        check_output_dir(resume, "--resume")
    from purplerl.runs.policy import ROUTED_ONE_ADAPTER, routed_checkpoint

    check_quantize(cfg.model, cfg.engine)
    recipe.check_engine(cfg)
    note = check_init_adapter(cfg.model, cfg.engine)
    if cfg.model.init_adapter is not None and routed_checkpoint(cfg.model.init_adapter):
        note = "\n".join(line for line in (note, ROUTED_ONE_ADAPTER.format(cfg.model.init_adapter)) if line)
    if note and os.environ.get("RANK", "0") == "0":  # rank 0 speaks for the run
        say(note)


def _run_workers(recipe: Any, cfg: Any, resume: Path | None) -> None:
    """--engine.procs N: this command again in N processes under torchrun (see purplerl.engines.launch)."""
    from purplerl.engines.launch import run_workers
    from purplerl.launch import run_dir

    procs, batch = cfg.engine.procs, cfg.training.batch_size
    if batch % procs:
        raise UserError(f"training.batch_size={batch} does not divide by engine.procs={procs}")
    run_workers(procs, sys.argv[1:], str(resume or run_dir(recipe, cfg)))


def _register_recipe(name: str, help_text: str) -> None:
    """The command of one row of the recipe table."""

    def command(ctx: typer.Context, config: ConfigFile = None, resume: Resume = None,
                restart: Restart = False) -> None:
        recipe = RECIPES[name]
        _run_recipe(recipe, _recipe_config(recipe, ctx.args, config, resume), resume, restart)

    command.__doc__ = help_text
    app.command(name, context_settings=OVERRIDES,
                cls=config_command(lambda: RECIPES[name].command()))(reports_errors(command))


for _row in RECIPES.values():
    _register_recipe(_row.name, _row.help)


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: ALIGN))
@reports_errors
def align(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Build embedded:smollm2-135m-safe: SmolLM2-135M-Instruct fine-tuned to refuse harmful requests (refusals
    written by this project) while answering benign ones as before (its own answers). Cached after the first run.
    With --eval true, measure refusal and utility of the base and the aligned model on held-out requests."""
    from purplerl.engines.loading import cache_dir
    from purplerl.experiments.align import BASE_MODEL, SAFE_MODEL, aligned_model_dir

    cfg = load_command_config(ALIGN, config, ctx.args).align
    check_output_dir(cache_dir(), "the model cache (PURPLERL_CACHE)")  # where the aligned model is built
    out = check_output_dir(cfg.out, "--out", files=("align.json", "summary.txt")) if cfg.eval else None
    quiet_libraries()
    typer.echo(f"embedded:{SAFE_MODEL} is {aligned_model_dir(notify=say)}")
    if out is not None:
        import json

        from purplerl.eval.alignment import alignment_table, evaluate_alignment

        result = evaluate_alignment(BASE_MODEL, f"embedded:{SAFE_MODEL}", limit=cfg.limit, notify=say)
        out.mkdir(parents=True, exist_ok=True)
        (out / "align.json").write_text(json.dumps(result, indent=1))
        table = alignment_table(result)
        (out / "summary.txt").write_text(table + "\n")
        typer.echo(table)
        typer.echo(f"wrote {out / 'align.json'} and {out / 'summary.txt'}")


def _tamper() -> Command:
    from purplerl.experiments.tamper_settings import TAMPER

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
    quiet_libraries()
    result = run_tamper_test(cfg, announce=say)
    out = Path(cfg.tamper.out)
    typer.echo(tamper_summary(result))
    typer.echo(f"wrote {out / 'tamper.json'}, {out / 'tamper.png'}, {out / 'summary.txt'}")


def _pipeline() -> Command:
    from purplerl.experiments.pipeline import PIPELINE

    return PIPELINE


@app.command(context_settings=OVERRIDES, cls=config_command(_pipeline), options_metavar="PIPELINE_FILE [OPTIONS]")
@reports_errors
def pipeline(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="the pipeline YAML or JSON file (or its first argument)")] = None,
) -> None:
    """Run the stages of PIPELINE_FILE in order (e.g. sft -> reward-model -> prefs -> eval): each policy stage starts
    from the last passing stage's model, is merged, evaluated (refusal, utility, win rate against the model before
    it, the adversarial validator) and rolled back when a gate fails. A later stage names an earlier one's output as
    ${stages.NAME}.

    Writes OUT/history.json (each stage's config, metrics, gates and decision), OUT/runs/, OUT/models/ and
    OUT/evals/. Running it again resumes: decided stages are kept, an interrupted one continues from its run dir.
    `purplerl report OUT` draws the stages side by side."""
    from purplerl.experiments.pipeline import HISTORY_FILE, load_pipeline, run_pipeline
    from purplerl.experiments.pipeline.report import pipeline_summary

    args = list(ctx.args)
    if args and not args[0].startswith("--"):
        if config is not None:
            raise UserError(f"give the pipeline file once: '{args[0]}' and --config {config}")
        config = Path(args.pop(0))
    if config is None:
        raise UserError("name the pipeline file: purplerl pipeline PIPELINE_FILE [--out DIR]")
    settings = load_pipeline(config, args)
    quiet_libraries()
    history = run_pipeline(settings, announce=say)
    out = Path(settings.out)
    typer.echo(pipeline_summary(history))
    typer.echo(f"wrote {out / HISTORY_FILE}; `purplerl report {out}` draws the stages")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"purplerl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="print purplerl's version and exit")] = False) -> None:
    """purplerl: LLM safety research with reinforcement learning."""


@app.command()
def doctor(verify: Annotated[bool, typer.Option(
        help="hash every cached model against its manifest, as loading it does (seconds)")] = False) -> None:
    """One screen on what this machine can run: versions, engines and backends, the CPU's kind and bf16 speed, the
    GPUs, the model cache. Paste it into a bug report."""
    from purplerl.engines.environment import report

    try:
        lines = report(verify=verify)
    except PurplerlError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(err.exit_code) from None
    typer.echo("\n".join(lines))


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: SAMPLE))
@reports_errors
def sample(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Generate from a trained adapter (--checkpoint) or from a base model (--model) for each --prompt.

    A run's checkpoint is prompted as its run was trained (template, system prompt, base model)."""
    from purplerl.runs.sample import generate

    cfg = load_command_config(SAMPLE, config, ctx.args)
    quiet_libraries()
    for prompt, texts in zip(cfg.sample.prompts, generate(cfg, announce=say), strict=True):
        typer.echo(f"### {prompt}")
        for text in texts:
            typer.echo(text.strip() or "(empty)")
            typer.echo("---")


@app.command(name="eval", context_settings=OVERRIDES, cls=config_command(lambda: EVAL))
@reports_errors
def evaluate(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Evaluate the base model and each --checkpoint: harm, utility and diversity with 95% bootstrap CIs.

    Each checkpoint of a run is prompted as its run was trained; the base model is the checkpoints' own. With
    --attacker, a learned attacker writes the prompts from goals (OUT/attacks.json) and every row keeps its goal.
    Writes OUT/generations/<label>.jsonl (resumable), OUT/eval.json and OUT/report.html; prints a table and, for
    each checkpoint, three lines reading it against the base model (refusal, compliance, degenerate answers)."""
    from purplerl.eval.reading import readings
    from purplerl.eval.run import eval_table, run_eval

    cfg = load_command_config(EVAL, config, ctx.args)
    quiet_libraries()
    result = run_eval(cfg, announce=say)
    out = Path(cfg.eval.out)
    typer.echo(eval_table(result))
    for line in readings(result):  # what the numbers mean: each checkpoint against the base model
        typer.echo(line)
    typer.echo(f"wrote {out / 'eval.json'} and {out / 'report.html'}")


data_app = typer.Typer(no_args_is_help=True, help="Datasets: prepare hub datasets as veRL-schema parquet.")
app.add_typer(data_app, name="data")


@data_app.command("prepare", context_settings=OVERRIDES, cls=config_command(lambda: PREPARE),
                  options_metavar="DATASET [OPTIONS]")
@reports_errors
def data_prepare(ctx: typer.Context,
                 config: ConfigFile = None) -> None:
    """Write DATASET's train.parquet and test.parquet in veRL's schema (prompt, data_source, reward_model, ...);
    safety-prefs: train.jsonl and test.jsonl of preference pairs built from the alignment data with --model;
    attack-prompts: train.jsonl and test.jsonl of goal -> attack prompt chats, an attacker's SFT data."""
    from purplerl.data.prepare import SAFETY_PREFS, prepare_dataset

    cfg = load_command_config(PREPARE, config, ctx.args)
    if cfg.prepare.dataset == SAFETY_PREFS:
        from purplerl.experiments.safety_prefs import prepare_command

        typer.echo(prepare_command(cfg.prepare).describe())
        return
    typer.echo(prepare_dataset(cfg.prepare).describe())


verl_app = typer.Typer(no_args_is_help=True, help="veRL: run purplerl's recipes on a GPU cluster with veRL.")
app.add_typer(verl_app, name="verl")


def _verl_command(recipe_name: str = "attack") -> Command:
    """A recipe's settings plus the veRL run's own section."""
    from pydantic import Field, create_model

    from purplerl.config import VerlConfig

    recipe = RECIPES.get(recipe_name)
    if recipe is None:
        raise UserError(f"unknown recipe '{recipe_name}' (known: {', '.join(RECIPES)})")
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
    cfg = load_command_config(_verl_command(recipe), config, with_named_reward(ctx.args))
    if cfg.recipe != recipe:
        raise UserError(f"config is for recipe '{cfg.recipe}', not '{recipe}'")
    if cfg.verl.out is not None:  # unset, the export names what is missing
        check_output_dir(cfg.verl.out, "--out", fresh=True)
    typer.echo(export_verl(cfg, announce=say).describe())


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


# registers export, report and serve-reward (serving), and sweep, after the commands above
from purplerl.cli import serving, sweep  # noqa: E402,F401


def main() -> None:
    sys.exit(app())

__all__ = ["EMBEDDED_MODEL", "app", "main"]
