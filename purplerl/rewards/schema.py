"""The wire format of the reward server: one set of pydantic models used by the server and its client.

Errors are `{"detail": "one line"}` with a 4xx/5xx status (FastAPI's convention), so any HTTP client can
show the server's reason as it is.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Message(BaseModel):
    # strict: a number where a text belongs is a client bug, not something to coerce into "3"
    model_config = ConfigDict(extra="forbid", strict=True)


class ScoreRequest(Message):
    texts: list[str] = Field(min_length=1, description="responses to score")
    prompts: list[str] | None = Field(None, description="the prompt each text answers (same length), for judges")

    @model_validator(mode="after")
    def _same_length(self) -> ScoreRequest:
        if self.prompts is not None and len(self.prompts) != len(self.texts):
            raise ValueError(f"prompts has {len(self.prompts)} items but texts has {len(self.texts)}")
        return self


class ScoreResponse(Message):
    scores: list[float] = Field(description="one score per text, in order")
    model: str = Field(description="the model that scored them")
    label: str | None = Field(description="the classifier output scored")
    truncated: list[int] = Field(default_factory=list,
                                 description="indices whose text or prompt was cut to max_chars before scoring")


class ServerInfo(Message):
    model: str
    label: str | None
    version: str = Field(description="purplerl version of the server")
    max_texts: int = Field(description="most texts per request")
    max_chars: int = Field(description="characters per text or prompt kept for scoring")
    max_batch_texts: int = Field(description="most texts per scorer call (micro-batch)")
    max_body_bytes: int = Field(description="largest request body")


class Health(Message):
    status: Literal["ok"] = "ok"
    requests: int = Field(0, description="score requests answered with scores since start")
    batches: int = Field(0, description="scorer calls since start (fewer than requests: micro-batching merged some)")
    texts: int = Field(0, description="texts scored since start")


class ErrorBody(Message):
    detail: str
