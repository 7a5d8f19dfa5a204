"""The longest sequence a run builds, checked against the model's context before the model loads.

A run whose prompts and answers may grow past what the model reads (its config's max_position_embeddings) trains
and samples on positions the model never saw, silently; the settings that allow it are one line instead. Each
recipe declares its bound (`Recipe.longest_sequence`): by default a prompt (data.max_prompt_tokens) and its answer
(sampling.max_new_tokens sampled, or data.max_answer_tokens read from the data).
"""

from __future__ import annotations

from purplerl.config.sections import RunSettings
from purplerl.errors import UserError


def prompt_and_answer(config: RunSettings) -> tuple[int, str] | None:
    """(the longest prompt and answer a run of the shared sections builds, the settings that bound it); None where
    its settings bound no prompt."""
    data, sampling = getattr(config, "data", None), getattr(config, "sampling", None)
    prompt = getattr(data, "max_prompt_tokens", None)
    if prompt is None:
        return None
    if hasattr(sampling, "max_new_tokens"):
        return prompt + sampling.max_new_tokens, "data.max_prompt_tokens + sampling.max_new_tokens"
    if hasattr(data, "max_answer_tokens"):
        return prompt + data.max_answer_tokens, "data.max_prompt_tokens + data.max_answer_tokens"
    return None


def check_context(longest: tuple[int, str] | None, config: RunSettings) -> None:
    """One UserError when the run's longest sequence `longest` is past the context of `config.model`, read from
    the model's config alone. A Tinker model is served remotely: its context is the service's to check."""
    if longest is None or config.engine.kind == "tinker":
        return
    from purplerl.engines.loading import context_size  # transformers: when a run starts, not for --help

    tokens, settings = longest
    size = context_size(config.model.name, config.model.revision)
    if size is not None and tokens > size:
        raise UserError(f"{settings} is {tokens} tokens, more than model '{config.model.name}' reads (its "
                        f"max_position_embeddings is {size}): lower them")
