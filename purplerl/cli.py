"""The `purplerl` command: parses options, builds a config, calls the library. No logic of its own."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from purplerl.config import (
    API_KEY_ENV,
    EMBEDDED_MODEL,
    FLAT_NAMES,
    Config,
    RewardServerConfig,
    build_server_config,
    field_help,
    load_config,
    read_config_file,
)
from purplerl.errors import PurplerlError, UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="purplerl: LLM safety research with reinforcement learning.")

OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True, "max_content_width": 120}


def _config_epilog() -> str:
    flat = {v: k for k, v in FLAT_NAMES.items()}
    lines = ["Config overrides (any field, as --section.field VALUE or by its flat name; values are YAML):"]
    for name, default, desc in field_help():
        alias = f" (--{flat[name]})" if name in flat else ""
        lines.append(f"  --{name}{alias} [default {default}]: {desc}")
    return "\b\n" + "\n".join(lines)  # \b keeps click from re-wrapping the table


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


def _recipe_config(recipe: str, args: list[str], config: Path | None, resume: Path | None,
                   defaults: dict[str, Any] | None = None) -> Config:
    """Recipe defaults <- config file <- overrides; or, when resuming, the run's saved config <- overrides."""
    if resume is not None:
        if config is not None:
            raise UserError("--resume uses the run's saved config; do not pass --config with it")
        if not (resume / "config.yaml").is_file():
            raise UserError(f"{resume} is not a run dir (no config.yaml)")
        cfg = load_config(None, args, base=read_config_file(resume / "config.yaml"))
    else:
        cfg = load_config(config, args, base=defaults)
    if cfg.recipe != recipe:
        raise UserError(f"config is for recipe '{cfg.recipe}', not '{recipe}'")
    return cfg


def _restart(restart: bool, resume: Path | None) -> bool:
    if restart and resume is None:
        raise UserError("--restart goes with --resume RUN_DIR (it starts that run again from step 1)")
    return restart


@app.command(context_settings=OVERRIDES, epilog=_config_epilog())
@reports_errors
def attack(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="YAML or JSON config file")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue this run dir from its latest intact checkpoint")] = None,
    restart: Annotated[bool, typer.Option(help="with --resume: start a run that has no intact checkpoint again "
                                               "from step 1 (its logs are replaced)")] = False,
) -> None:
    """Red-team a model by GRPO: reward toxicity, penalize repetition and KL to the base model."""
    from purplerl.recipes.attack import ATTACK_DEFAULTS, run_attack, summarize_attack

    cfg = _recipe_config("attack", ctx.args, config, resume, defaults=ATTACK_DEFAULTS)
    _quiet_libraries()
    summary = run_attack(cfg, resume_dir=resume, restart=_restart(restart, resume))
    typer.echo(summarize_attack(Path(summary["run_dir"]), summary))


@app.command(context_settings=OVERRIDES, epilog=_config_epilog())
@reports_errors
def defend(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="YAML or JSON config file")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue this run dir from its latest intact checkpoint")] = None,
    restart: Annotated[bool, typer.Option(help="with --resume: start a run that has no intact checkpoint again "
                                               "from step 1 (its logs are replaced)")] = False,
) -> None:
    """Token Buncher defense: reward low response entropy on harmful prompts, with Token Noiser steps.

    Defaults differ from attack's: training.noiser true, reward.kl_beta 0.001, no toxicity early stop.
    The last checkpoint is the defended adapter (use it with attack --init_adapter or tamper-test)."""
    from purplerl.recipes.defend import DEFEND_DEFAULTS, run_defend, summarize_defend

    cfg = _recipe_config("defend", ctx.args, config, resume, defaults=DEFEND_DEFAULTS)
    _quiet_libraries()
    summary = run_defend(cfg, resume_dir=resume, restart=_restart(restart, resume))
    typer.echo(summarize_defend(Path(summary["run_dir"]), summary))


@app.command(context_settings=OVERRIDES, epilog=_config_epilog())
@reports_errors
def sft(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="YAML or JSON config file")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue this run dir from its latest intact checkpoint")] = None,
    restart: Annotated[bool, typer.Option(help="with --resume: start a run that has no intact checkpoint again "
                                               "from step 1 (its logs are replaced)")] = False,
) -> None:
    """Supervised fine-tuning of a LoRA adapter on chat data (messages ending with the assistant's turn, or
    prompt/completion pairs); the loss covers only the assistant's tokens. --data names the data."""
    from purplerl.recipes.sft import SFT_DEFAULTS, run_sft, summarize_sft

    cfg = _recipe_config("sft", ctx.args, config, resume, defaults=SFT_DEFAULTS)
    _quiet_libraries()
    summary = run_sft(cfg, resume_dir=resume, restart=_restart(restart, resume))
    typer.echo(summarize_sft(Path(summary["run_dir"]), summary))


@app.command()
@reports_errors
def align(
    evaluate: Annotated[bool, typer.Option("--eval", help="measure refusal and utility, base vs aligned")] = False,
    limit: Annotated[int, typer.Option(min=10, help="held-out harmful and benign requests each, for --eval")] = 150,
    out: Annotated[Path, typer.Option(help="where --eval writes align.json and summary.txt")] = Path("runs/align"),
) -> None:
    """Build embedded:smollm2-135m-safe: SmolLM2-135M-Instruct fine-tuned to refuse harmful requests (refusals
    written by this project) while answering benign ones as before (its own answers). Cached after the first run."""
    from purplerl.recipes.align import BASE_MODEL, SAFE_MODEL, aligned_model_dir

    _quiet_libraries()
    path = aligned_model_dir(notify=lambda line: typer.echo(line, err=True))
    typer.echo(f"embedded:{SAFE_MODEL} is {path}")
    if evaluate:
        import json

        from purplerl.eval.alignment import alignment_table, evaluate_alignment

        result = evaluate_alignment(BASE_MODEL, f"embedded:{SAFE_MODEL}", limit=limit,
                                    notify=lambda line: typer.echo(line, err=True))
        out.mkdir(parents=True, exist_ok=True)
        (out / "align.json").write_text(json.dumps(result, indent=1))
        table = alignment_table(result)
        (out / "summary.txt").write_text(table + "\n")
        typer.echo(table)
        typer.echo(f"wrote {out / 'align.json'} and {out / 'summary.txt'}")


@app.command("tamper-test", context_settings=OVERRIDES, epilog=_config_epilog())
@reports_errors
def tamper_test(
    ctx: typer.Context,
    adapter: Annotated[Path, typer.Option(help="the defended adapter (a checkpoint dir of a defend run)")],
    config: Annotated[Path | None, typer.Option(help="attack config file (YAML or JSON)")] = None,
    out: Annotated[Path, typer.Option(help="directory for both attack runs and the comparison")] = Path("runs/tamper"),
    threshold: Annotated[float, typer.Option(min=0.0, max=1.0, help="harm level counted as 'attack succeeded'")] = 0.5,
    utility_limit: Annotated[int, typer.Option(min=1, help="arithmetic problems in the utility check")] = 40,
    utility_tokens: Annotated[int, typer.Option(min=8, help="greedy tokens per utility answer")] = 128,
) -> None:
    """Run the same attack on the base model and on a defended adapter; compare harm curves and utility.

    Writes OUT/tamper.json, OUT/tamper.png and OUT/summary.txt. Running it again resumes unfinished attacks."""
    from purplerl.recipes.tamper import run_tamper_test, tamper_summary

    cfg = _recipe_config("attack", ctx.args, config, None)
    _quiet_libraries()
    result = run_tamper_test(cfg, adapter, out, threshold=threshold, utility_limit=utility_limit,
                             utility_tokens=utility_tokens)
    typer.echo(tamper_summary(result))
    typer.echo(f"wrote {out / 'tamper.json'}, {out / 'tamper.png'}, {out / 'summary.txt'}")


@app.command()
@reports_errors
def report(run_dir: Annotated[Path, typer.Argument(help="a run dir with metrics.jsonl (and samples.jsonl)")]) -> None:
    """Write RUN_DIR/report.html (curves, first-vs-last summary, samples) and RUN_DIR/plots/*.png."""
    from purplerl.eval.report import training_report

    typer.echo(f"wrote {training_report(run_dir)}")


@app.command()
@reports_errors
def sample(
    prompt: Annotated[list[str], typer.Option(help="user message; repeat for several prompts")],
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint dir (a PEFT adapter) of a run")] = None,
    model: Annotated[str | None, typer.Option(help="base model (default: the checkpoint's, else embedded)")] = None,
    n: Annotated[int, typer.Option(min=1, help="completions per prompt")] = 1,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="tokens per completion")] = 64,
    temperature: Annotated[float, typer.Option(min=0.0, help="sampling temperature (0: greedy)")] = 1.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="nucleus threshold")] = 1.0,
    system_prompt: Annotated[str | None, typer.Option(help="system message (default: the run's)")] = None,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
) -> None:
    """Generate from a trained adapter (--checkpoint) or from a base model (--model)."""
    from purplerl.recipes.sample import generate

    _quiet_libraries()
    for p, outs in zip(prompt, generate(prompt, checkpoint=checkpoint, model=model, n=n, max_new_tokens=max_new_tokens,
                                        temperature=temperature, top_p=top_p, system_prompt=system_prompt,
                                        seed=seed, device=device), strict=True):
        typer.echo(f"### {p}")
        for text in outs:
            typer.echo(text.strip() or "(empty)")
            typer.echo("---")


@app.command(name="eval")
@reports_errors
def evaluate(
    model: Annotated[str, typer.Option(help="base model: embedded:..., an HF id or a local path")] = EMBEDDED_MODEL,
    checkpoint: Annotated[list[str] | None, typer.Option(help="PEFT adapter dir to evaluate; repeatable")] = None,
    suite: Annotated[str, typer.Option(help="comma-separated: harm, utility, diversity")] = "harm,utility,diversity",
    prompts: Annotated[str, typer.Option(help="prompts: builtin:redteam, a file, hf:ORG/NAME")] = "builtin:redteam",
    split: Annotated[str, typer.Option(help="split of the prompt source")] = "test",
    limit: Annotated[int | None, typer.Option(help="at most this many prompts")] = None,
    n: Annotated[int, typer.Option(help="completions per prompt")] = 1,
    max_new_tokens: Annotated[int, typer.Option(help="tokens per completion and per utility answer")] = 128,
    temperature: Annotated[float, typer.Option(help="sampling temperature")] = 1.0,
    top_p: Annotated[float, typer.Option(help="nucleus threshold")] = 0.95,
    seed: Annotated[int, typer.Option(help="sampling and bootstrap seed")] = 0,
    batch_size: Annotated[int, typer.Option(help="prompts per sampling call")] = 16,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    harm_model: Annotated[str | None, typer.Option(help="HF harm classifier, response only; with --harm-label")] = None,
    harm_label: Annotated[str | None, typer.Option(help="the harm classifier's harmful label (name or index)")] = None,
    harm_threshold: Annotated[float, typer.Option(help="P(harmful) at which a response is flagged")] = 0.5,
    prompt_field: Annotated[str, typer.Option(
        help="prompt field of --prompts (default 'prompt', else a benchmark's own: forbidden_prompt, question, "
             "Behavior, behavior, goal)")] = "prompt",
    guard_model: Annotated[str | None, typer.Option(
        help="Llama-Guard-style causal LM judge (HF id or path): per-sample guard_unsafe = P(unsafe); "
             "without --harm-model its verdict is the harm verdict")] = None,
    guard_unsafe_token: Annotated[str, typer.Option(help="the guard's verdict word for unsafe")] = "unsafe",
    strongreject_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible base URL (http(s)://.../v1) of the StrongREJECT rubric judge")] = None,
    strongreject_model: Annotated[str | None, typer.Option(help="model name for --strongreject-url")] = None,
    strongreject_key_env: Annotated[str | None, typer.Option(
        help="environment variable holding the StrongREJECT endpoint's API key")] = None,
    utility_source: Annotated[str, typer.Option(help="math set of the utility suite")] = "builtin:arithmetic",
    utility_limit: Annotated[int | None, typer.Option(help="at most this many utility problems")] = None,
    choice_source: Annotated[str, typer.Option(
        help="multiple-choice set of the utility suite: builtin:choice, a file/dir, hf:ORG/NAME[:CONFIG]; "
             "none skips it")] = "builtin:choice",
    choice_limit: Annotated[int | None, typer.Option(help="at most this many multiple-choice questions")] = None,
    out: Annotated[Path, typer.Option(help="output dir; a rerun into it resumes the generations")] = Path("runs/eval"),
) -> None:
    """Evaluate the base model and each --checkpoint: harm, utility and diversity with 95% bootstrap CIs.

    Writes OUT/generations/<label>.jsonl (resumable), OUT/eval.json and OUT/report.html; prints a table."""
    from purplerl.eval.run import EvalSettings, eval_table, run_eval
    from purplerl.eval.suites import parse_suites

    settings = EvalSettings(
        model=model, checkpoints=tuple(checkpoint or ()), suites=parse_suites(suite), prompts=prompts, split=split,
        limit=limit, n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
        batch_size=batch_size, device=device, out=str(out), harm_model=harm_model, harm_label=harm_label,
        harm_threshold=harm_threshold, prompt_field=prompt_field, guard_model=guard_model,
        guard_unsafe_token=guard_unsafe_token, strongreject_url=strongreject_url,
        strongreject_model=strongreject_model, strongreject_key_env=strongreject_key_env,
        utility_source=utility_source, utility_limit=utility_limit,
        choice_source=choice_source, choice_limit=choice_limit)
    _quiet_libraries()
    result = run_eval(settings)
    typer.echo(eval_table(result))
    typer.echo(f"wrote {out / 'eval.json'} and {out / 'report.html'}")


data_app = typer.Typer(no_args_is_help=True, help="Datasets: prepare hub datasets as veRL-schema parquet.")
app.add_typer(data_app, name="data")


@data_app.command("prepare")
@reports_errors
def data_prepare(
    dataset: Annotated[str, typer.Argument(help="beavertails, wmdp, gsm8k or merge")],
    out: Annotated[Path | None, typer.Option(help="output dir (default: data/<name>, data/<name>-base)")] = None,
    subset: Annotated[str | None, typer.Option(help="wmdp: bio, chem or cyber")] = None,
    template: Annotated[str | None, typer.Option(help="chat (default) or base: plain 'Question: ...' text")] = None,
    source: Annotated[Path | None, typer.Option(help="local copy of the hub dataset instead of the hub")] = None,
    seed: Annotated[int | None, typer.Option(help="wmdp split / merge shuffle seed (default 42)")] = None,
    wmdp: Annotated[Path | None, typer.Option(help="merge: a prepared WMDP dir")] = None,
    beavertails: Annotated[Path | None, typer.Option(help="merge: a prepared BeaverTails dir")] = None,
    ratio: Annotated[float | None, typer.Option(help="merge: BeaverTails rows per WMDP row (default all)")] = None,
    limit: Annotated[int | None, typer.Option(help="merge: at most this many rows per split")] = None,
) -> None:
    """Write train.parquet and test.parquet in veRL's schema (prompt, data_source, reward_model, ...)."""
    from purplerl.data.prepare import prepare_dataset

    prepared = prepare_dataset(dataset, out, subset=subset, template=template, source=source, seed=seed, wmdp=wmdp,
                               beavertails=beavertails, ratio=ratio, limit=limit)
    typer.echo(prepared.describe())


def _server_option(field: str, **kwargs: Any) -> Any:
    """A serve-reward option whose help text is the RewardServerConfig field's description."""
    return typer.Option(help=RewardServerConfig.model_fields[field].description, **kwargs)


def _server_default(field: str) -> Any:
    return RewardServerConfig.model_fields[field].default


def _server_option_name(field: str) -> str:
    name = "--" + field.replace("_", "-")
    return f"{name} (or env {API_KEY_ENV})" if field == "api_key" else name


@app.command(name="serve-reward")
@reports_errors
def serve_reward(
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
    """Serve a toxicity scorer over HTTP (POST /score) for runs with --reward.toxicity.url URL."""
    options = {k: v for k, v in locals().items() if k in RewardServerConfig.model_fields and v is not None}
    settings = build_server_config(options, _server_option_name)  # before the server's imports: a typo fails fast
    from purplerl.rewards.server import exposure_warning, serve

    warning = exposure_warning(settings)
    if warning:
        typer.echo(warning, err=True)
    _quiet_libraries()
    serve(settings, announce=lambda line: typer.echo(line, err=True))


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()

__all__ = ["app", "main", "EMBEDDED_MODEL"]
