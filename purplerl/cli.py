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

from purplerl.config import EMBEDDED_MODEL, FLAT_NAMES, field_help, load_config, read_config_file
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


@app.command(context_settings=OVERRIDES, epilog=_config_epilog())
@reports_errors
def attack(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="YAML or JSON config file")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue this run dir from its latest checkpoint")] = None,
) -> None:
    """Red-team a model by GRPO: reward toxicity, penalize repetition and KL to the base model."""
    from purplerl.recipes.attack import run_attack, summarize_attack

    if resume is not None:
        if config is not None:
            raise UserError("--resume uses the run's saved config; do not pass --config with it")
        if not (resume / "config.yaml").is_file():
            raise UserError(f"{resume} is not a run dir (no config.yaml)")
        cfg = load_config(None, ctx.args, base=read_config_file(resume / "config.yaml"))
    else:
        cfg = load_config(config, ctx.args)
    if cfg.recipe != "attack":
        raise UserError(f"config is for recipe '{cfg.recipe}', not 'attack'")
    _quiet_libraries()
    summary = run_attack(cfg, resume_dir=resume)
    typer.echo(summarize_attack(Path(summary["run_dir"]), summary))


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


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()

__all__ = ["app", "main", "EMBEDDED_MODEL"]
