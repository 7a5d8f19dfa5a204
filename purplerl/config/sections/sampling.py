"""How completions are drawn: by every sampler (RL rollouts, `sample`, `eval`), and as a group per prompt in RL."""

from __future__ import annotations

from pydantic import Field, field_validator

from purplerl.config.base import Section


class GenerationConfig(Section):
    """How completions are drawn: shared by RL rollouts, `sample` and `eval`, so each default is written once."""

    max_new_tokens: int = Field(48, ge=1, le=32768, description="maximum tokens per completion")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="sampling temperature (0: greedy; RL needs > 0)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling threshold (1 disables)")
    top_k: int = Field(0, ge=0, description="top-k truncation (0 disables)")


class SamplingConfig(GenerationConfig):
    """Rollout sampling of an RL recipe: a group of completions per prompt."""

    group_size: int = Field(4, ge=2, le=256, description="completions per prompt (G); GRPO needs >= 2")

    @field_validator("temperature")
    @classmethod
    def _sampled(cls, temperature: float) -> float:
        # greedy decoding gives a group G identical completions: every advantage would be zero
        if temperature <= 0.0:
            raise ValueError("must be > 0 for RL rollouts (0 would make every completion of a group the same)")
        return temperature
