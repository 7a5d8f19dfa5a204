"""Generate from a trained adapter or a base model (`purplerl sample`)."""

from __future__ import annotations

import math
from pathlib import Path

from purplerl.config import EMBEDDED_MODEL, Config, build_config, read_config_file
from purplerl.engines import make_engine
from purplerl.engines.loading import read_adapter_config
from purplerl.errors import UserError
from purplerl.files import unicode_problem
from purplerl.prompting import render_prompt
from purplerl.types import PromptRecord, SamplingParams


def _run_config_of(checkpoint: Path) -> Config | None:
    path = checkpoint.parent.parent / "config.yaml"  # runs/<name>/checkpoints/step_NNNNNN
    return build_config(read_config_file(path)) if path.is_file() else None


def generate(prompts: list[str], *, checkpoint: Path | None, model: str | None, n: int, max_new_tokens: int,
             temperature: float, top_p: float, system_prompt: str | None, seed: int, device: str) -> list[list[str]]:
    """n completions for each prompt; the run's template and system prompt apply to a run checkpoint."""
    if not prompts:
        raise UserError("give at least one --prompt")
    if not (math.isfinite(temperature) and math.isfinite(top_p)):
        raise UserError("--temperature and --top-p must be finite numbers")
    for text in prompts:
        if unicode_problem(text):
            raise UserError(f"--prompt {text!r} {unicode_problem(text)}")
    run_cfg = None
    if checkpoint is not None:
        adapter_base = read_adapter_config(checkpoint, "checkpoint").get("base_model_name_or_path")
        run_cfg = _run_config_of(checkpoint)
        base = model or (run_cfg.model.name if run_cfg else adapter_base)
        if not base:
            raise UserError(f"{checkpoint} names no base model (no run config.yaml, no base_model_name_or_path): "
                            "give --model")
    else:
        base = model or EMBEDDED_MODEL
    # validated like a config file, so a bad --device is a one-line UserError naming the field
    engine = make_engine(build_config({"model": {
        "name": base, "device": device, "dtype": run_cfg.model.dtype if run_cfg else "float32",
        "init_adapter": str(checkpoint) if checkpoint else None}}).model)
    data = run_cfg.data if run_cfg else Config().data
    tokens = [render_prompt(engine.tokenizer, PromptRecord(messages=({"role": "user", "content": p},)),
                            template=data.template, system_prompt=system_prompt or data.system_prompt,
                            max_prompt_tokens=data.max_prompt_tokens) for p in prompts]
    groups = engine.sample(tokens, n, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                                     top_p=top_p, seed=seed))
    return [[c.text for c in group] for group in groups]
