"""A client of any OpenAI-compatible chat-completions endpoint (`POST {base_url}/chat/completions`), as a Generator
of the iterative refiner (purplerl.experiments.refiner).

Each conversation is one request with `{model, messages, temperature, max_tokens, seed}`; the seed is the
sampling seed of the call, so an endpoint that honours it (vLLM, llama.cpp, OpenAI) gives the same text again.
The API key comes from an environment variable only (sent as a bearer token when that variable is set), so it
never lands in a saved settings file.

A dead endpoint stops the run with one ExperimentError naming the URL and the last error, never a made-up text:
connection errors, timeouts, HTTP 429 and 5xx are retried `retries` times with exponential backoff first (an
overloaded or restarting server is normal); any other non-2xx answer, and an answer that is not a chat completion
(not JSON, no `choices[0].message.content` text), is reported at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import httpx

from purplerl.config import RewardServerConfig
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.types import SamplingParams

MAX_BACKOFF_S = 30.0
RETRIED_STATUS = 429  # too many requests: the server asks to come back later, as a 5xx does


class ChatEndpoint:
    """Texts from an OpenAI-compatible chat endpoint; implements the refiner's Generator protocol.

    `sleep` waits between retries (tests pass one that does not wait); `transport` replaces httpx's network."""

    def __init__(self, base_url: str, model: str, key_env: str | None = None, timeout_s: float = 60.0,
                 retries: int = 2, backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise UserError(f"chat endpoint URL must start with http:// or https://, got '{base_url}'")
        if not model.strip():
            raise UserError(f"chat endpoint {base_url} needs the name of the model it serves")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise UserError(f"chat endpoint client needs timeout_s > 0, retries >= 0 and backoff_s >= 0, got "
                            f"{timeout_s}, {retries}, {backoff_s}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.key_env = key_env
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep
        key = os.environ.get(key_env) if key_env else None
        problem = None if key is None else RewardServerConfig.key_problem(key)
        if problem is not None:  # httpx would refuse it only at the first request, with a raw error
            raise UserError(f"chat endpoint API key (env {key_env}): {problem}")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)

    @property
    def name(self) -> str:
        """What answers: the endpoint and the model it is asked for (recorded with the refiner's outputs)."""
        return f"{self.url} ({self.model})"

    def generate(self, conversations: list[list[dict[str, str]]], sampling: SamplingParams) -> list[str]:
        """The endpoint's answer to each conversation, one request each, in order."""
        return [self.complete(messages, sampling) for messages in conversations]

    def complete(self, messages: list[dict[str, str]], sampling: SamplingParams) -> str:
        """The assistant text the endpoint answers `messages` with."""
        body = {"model": self.model, "messages": messages, "temperature": sampling.temperature,
                "max_tokens": sampling.max_new_tokens, "seed": sampling.seed}
        data = self._post(body)
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            raise ExperimentError(f"chat endpoint {self.url} sent no chat completion (no choices[0].message.content "
                                  f"text): {first_line(str(data))[:200]}")
        return content

    def close(self) -> None:
        self._client.close()

    def _post(self, body: dict[str, Any]) -> Any:
        """The JSON of a 2xx answer, after retrying connection errors, 429 and 5xx; ExperimentError otherwise."""
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                response = self._client.post(self.url, json=body)
            except httpx.TransportError as err:  # refused, reset, timed out: the server may be restarting
                last_error = f"{type(err).__name__}: {first_line(str(err)) or 'no detail'}"
                continue
            except httpx.HTTPError as err:  # e.g. a body that cannot be decoded: retrying will not help
                raise ExperimentError(f"chat endpoint {self.url}: {type(err).__name__}: {first_line(err)}") from None
            if response.status_code >= 500 or response.status_code == RETRIED_STATUS:
                last_error = f"HTTP {response.status_code}: {_detail(response)}"
                continue
            if not 200 <= response.status_code < 300:
                hint = f" (the API key is read from env {self.key_env})" if response.status_code in (401, 403) \
                    and self.key_env else ""
                raise ExperimentError(f"chat endpoint {self.url} refused the request with HTTP "
                                      f"{response.status_code}: {_detail(response)}{hint}")
            try:
                return response.json()
            except ValueError:
                raise ExperimentError(f"chat endpoint {self.url} answered with something other than JSON: "
                                      f"{response.text[:80]!r}") from None
        raise ExperimentError(f"chat endpoint {self.url} did not answer after {self.retries + 1} attempts; last "
                              f"error: {last_error}")


def _detail(response: httpx.Response) -> str:
    """The server's one-line reason: OpenAI's `error.message` or a `detail` text, else the start of the body."""
    try:
        data = response.json()
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    detail = error.get("message") if isinstance(error, dict) else data.get("detail") if isinstance(data, dict) \
        else None
    text = detail if isinstance(detail, str) else response.text[:200]
    return first_line(text) or response.reason_phrase
