"""Generate from a trained adapter or a base model (`purplerl sample`). A command that trains nothing, so no recipe:
it is `resolve_policy` and `Policy.generate` (runs/policy.py) put together, below every layer that might call it."""

from __future__ import annotations

from collections.abc import Callable

from purplerl.config import SampleCommandConfig
from purplerl.errors import UserError
from purplerl.runs.policy import resolve_policy
from purplerl.types import PromptRecord, SamplingParams


def generate(cfg: SampleCommandConfig, announce: Callable[[str], None] = print) -> list[list[str]]:
    """`sample.n` completions for each prompt; a run checkpoint is prompted as its run was trained."""
    if not cfg.sample.prompts:
        raise UserError("give at least one --prompt (sample.prompts)")
    policy = resolve_policy(cfg.sample.checkpoint, cfg.model, cfg.data).checked("--checkpoint")
    if cfg.sample.checkpoint is not None:  # a routed checkpoint's adapters, at this mode's scales
        policy = policy.with_mode(cfg.sample.adapters)
    if policy.note:
        announce(policy.note)
    engine = policy.load()
    records = [PromptRecord(messages=({"role": "user", "content": p},)) for p in cfg.sample.prompts]
    s = cfg.sampling
    params = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                            top_k=s.top_k, seed=cfg.sample.seed)
    return policy.generate(engine, records, cfg.sample.n, params)
