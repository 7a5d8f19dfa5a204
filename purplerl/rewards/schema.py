"""The wire format of the reward server: one set of pydantic models used by the server and its client.

Errors are `{"detail": "one line"}` with a 4xx/5xx status (FastAPI's convention), so any HTTP client can
show the server's reason as it is.

Texts are Unicode scalar values. A Python string can also hold lone surrogates (U+D800..U+DFFF, e.g. from
JSON's "\\ud800" escape), which UTF-8 cannot carry: both sides replace them with U+FFFD (`scrub_surrogates`),
the character a decoder writes for what it cannot decode. The embedded scorer, which scores such text
in-process, gives the same score for either (neither is a word character), so a text scores the same
in-process and over HTTP.
"""

from __future__ import annotations

import re
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
    status: Literal["ok", "degraded"] = "ok"
    reason: str | None = Field(None, description="why the status is 'degraded' (None when ok)")
    pending: int = Field(0, description="score requests waiting for the scorer")
    requests: int = Field(0, description="score requests answered with scores since start")
    batches: int = Field(0, description="scorer calls since start (fewer than requests: micro-batching merged some)")
    texts: int = Field(0, description="texts scored since start")


class ErrorBody(Message):
    detail: str


SURROGATES = re.compile("[\ud800-\udfff]")


def scrub_surrogates(text: str) -> str:
    """`text` with each surrogate code point replaced by U+FFFD (same length, so max_chars cuts the same)."""
    return SURROGATES.sub("\ufffd", text)


def cut_to_max_chars(texts: list[str], prompts: list[str] | None, max_chars: int,
                     ) -> tuple[list[str], list[str] | None, list[int]]:
    """Texts and prompts cut to their first `max_chars` characters, and the indices where either was cut.
    The client cuts with it before sending and the server again on receipt, so a cut counts the same on both."""
    cut = [i for i, text in enumerate(texts)
           if len(text) > max_chars or (prompts is not None and len(prompts[i]) > max_chars)]
    if not cut:
        return texts, prompts, []
    return [t[:max_chars] for t in texts], None if prompts is None else [p[:max_chars] for p in prompts], cut
