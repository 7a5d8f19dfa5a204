"""Prompt data: loading from every supported source, and deterministic per-step batches."""

from purplerl.data.sampler import PromptSampler
from purplerl.data.sources import BUILTIN_SOURCES, load_prompts

__all__ = ["BUILTIN_SOURCES", "PromptSampler", "load_prompts"]
