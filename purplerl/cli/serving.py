"""The commands around runs rather than training: `export` (merge an adapter), `report` (a run's page) and
`serve-reward` (a reward term over HTTP). Each reads its settings as every command does; its older flags are its
short names."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from purplerl.cli.base import OVERRIDES, ConfigFile, app, config_command, quiet_libraries, reports_errors
from purplerl.config import (
    API_KEY_ENV,
    EXPORT,
    REPORT,
    Command,
    RewardServerConfig,
    build_server_config,
    load_command_config,
)
from purplerl.errors import UserError
from purplerl.outputs import check_output_dir


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: EXPORT))
@reports_errors
def export(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Merge an adapter (--merge) into its base model's weights: OUT (--out) is a standard model dir
    (AutoModelForCausalLM loads it with its tokenizer) computing what the adapter-on model computes;
    OUT/purplerl_export.json says how to prompt it."""
    from purplerl.config import ModelLoadConfig, PromptFormatConfig
    from purplerl.engines.merge import merge_adapter
    from purplerl.runs.policy import ROUTED_ONE_ADAPTER, resolve_policy

    cfg = load_command_config(EXPORT, config, ctx.args).export
    if cfg.merge is None or cfg.out is None:
        raise UserError("name the adapter and the output dir: --merge CHECKPOINT --out DIR (export.merge, export.out)")
    merge = Path(cfg.merge)
    out = check_output_dir(cfg.out, "--out", fresh=True, inputs=[merge])
    policy = resolve_policy(merge, ModelLoadConfig(name=cfg.model) if cfg.model else ModelLoadConfig(),
                            PromptFormatConfig())
    if policy.model.init_adapter is None:
        raise UserError(f"{merge} is already a full model dir (a full-parameter checkpoint): load it as it is")
    policy = policy.checked("--merge")  # before the base model loads for the merge
    if policy.note:
        typer.echo(policy.note, err=True)
    info = {"adapter": str(merge.resolve()), "base_model": policy.model.name, "revision": policy.model.revision,
            "prompt": policy.prompt.model_dump(mode="json")}
    if policy.mode is not None:  # merge_adapter merges the checkpoint's top adapter: the retain one
        typer.echo(ROUTED_ONE_ADAPTER.format(merge), err=True)
        info["adapters"] = "retain_only"
    typer.echo(f"wrote {merge_adapter(merge, out, policy.model.name, metadata={'purplerl_export.json': info})}")


@app.command(context_settings=OVERRIDES, cls=config_command(lambda: REPORT), options_metavar="RUN_DIR [OPTIONS]")
@reports_errors
def report(ctx: typer.Context, config: ConfigFile = None) -> None:
    """Write RUN_DIR/report.html (curves, first-vs-last summary, samples) and RUN_DIR/plots/*.png; for a pipeline's
    dir (purplerl pipeline), its stages side by side: decisions, metrics, gate plots with their bounds."""
    from purplerl.eval.report import training_report
    from purplerl.experiments.pipeline.report import is_pipeline_dir, pipeline_report
    from purplerl.runs.layout import PLOTS_DIR, REPORT_FILE

    cfg = load_command_config(REPORT, config, ctx.args).report
    if cfg.run_dir is None:
        raise UserError("name the run: purplerl report RUN_DIR (report.run_dir)")
    run_dir = check_output_dir(cfg.run_dir, "RUN_DIR", files=(REPORT_FILE,), dirs=(PLOTS_DIR,))
    typer.echo(f"wrote {pipeline_report(run_dir) if is_pipeline_dir(run_dir) else training_report(run_dir)}")


def _server_option(field: str, **kwargs: Any) -> Any:
    """A serve-reward option whose help text is the RewardServerConfig field's description."""
    return typer.Option(help=RewardServerConfig.model_fields[field].description, **kwargs)


def _server_default(field: str) -> Any:
    return RewardServerConfig.model_fields[field].default


def _server_option_name(field: str) -> str:
    name = "--" + field.replace("_", "-")
    return f"{name} (or env {API_KEY_ENV})" if field == "api_key" else name


def _key_on_command_line(ctx: typer.Context) -> bool:
    """Whether the API key is an argument (--api-key KEY, --server.api_key KEY): every user of the machine can read
    a process's arguments (ps, /proc/PID/cmdline), unlike its environment."""
    if ctx.get_parameter_source("api_key").name == "COMMANDLINE":  # by name: typer carries its own copy of click
        return True
    names = (arg[2:].partition("=")[0].replace("-", "_") for arg in ctx.args if arg.startswith("--"))
    return "server.api_key" in names


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
    """Serve a toxicity scorer over HTTP (POST /score) for runs with --reward.terms.toxicity.params.url URL, a
    reward model (--model RUN_DIR of purplerl reward-model or prm, or a checkpoint of it), or any registered text
    reward term (--term NAME --params '{...}'). Settings: the options below, or --server.FIELD / --serve.FIELD and
    --config FILE as for every command."""
    options = {k: v for k, v in locals().items() if k in RewardServerConfig.model_fields and v is not None}
    if _key_on_command_line(ctx):  # first: the key has leaked even if it is then refused
        typer.echo(f"warning: an API key on the command line is visible to every user of this machine (ps): "
                   f"set it by env {API_KEY_ENV} instead", err=True)
    settings = build_server_config(options, _server_option_name)  # before the server's imports: a typo fails fast
    served = None
    if ctx.args or config is not None:
        given = {k: v for k, v in options.items() if k == "api_key" or ctx.get_parameter_source(k).name != "DEFAULT"}
        cfg = load_command_config(_serve_command(), config, ctx.args, base={"server": given})
        settings, served = cfg.server, cfg.serve
    from purplerl.launch import scorer_term
    from purplerl.rewards.server import exposure_warning, serve
    from purplerl.runs.reward_model import looks_like_run

    warning = exposure_warning(settings)
    if warning:
        typer.echo(warning, err=True)
    quiet_libraries()
    term, params = (served.term, served.params) if served is not None else (None, None)
    if term is None and looks_like_run(settings.model):  # a reward model's run (reward-model, prm) or checkpoint
        term = scorer_term(settings.model)  # the term of the recipe the run's config names
        params = {"run": settings.model, "device": settings.device, "batch_size": settings.batch_size}
        settings = settings.model_copy(update={name: RewardServerConfig.model_fields[name].default
                                               for name in ("model", "device", "batch_size")})
    serve(settings, term=term, params=params, announce=lambda line: typer.echo(line, err=True))
