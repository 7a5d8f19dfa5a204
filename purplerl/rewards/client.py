"""The reward server's client: a Scorer that scores over HTTP (`purplerl serve-reward`).

A dead or failing server stops the run with an ExperimentError that names the URL and the last error:
a reward of zero (or of anything made up) would train the policy on noise. Connection errors, timeouts
and HTTP 5xx are retried `retries` times with exponential backoff first, since a server restart or a
brief overload is normal; a 4xx is the client's fault, so it is reported at once with the server's
message. The server's model and label are checked on every answer, so a server swapped for another
model in the middle of a run stops it too.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from purplerl.config import API_KEY_ENV, ToxicityConfig
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.schema import ScoreRequest, ScoreResponse, ServerInfo

MAX_BACKOFF_S = 30.0
M = TypeVar("M", bound=BaseModel)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


class HTTPScorer:
    """Scores texts with a reward server; implements the Scorer protocol.

    One pooled `httpx.Client` (keep-alive connections) per scorer. After `info()` the scorer splits
    batches to the server's `max_texts`, and refuses answers from another model than the one `info()`
    saw. `truncated_total` counts texts the server cut to its `max_chars`; `last_truncated` holds the
    indices cut in the last `score` call.
    """

    name = "toxicity"

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise UserError(f"reward server URL must start with http:// or https://, got '{url}'")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise UserError(f"reward server client needs timeout_s > 0, retries >= 0 and backoff_s >= 0, "
                            f"got {timeout_s}, {retries}, {backoff_s}")
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)
        self.server_info: ServerInfo | None = None
        self.last_truncated: list[int] = []
        self.truncated_total = 0

    def info(self) -> ServerInfo:
        """The server's model, label and limits (GET /info); remembered for checking later answers."""
        self.server_info = self._parse(ServerInfo, self._request("GET", "/info"), "/info")
        return self.server_info

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        if prompts is not None and len(prompts) != len(texts):
            raise ExperimentError(f"reward server client was given {len(prompts)} prompts for {len(texts)} texts")
        chunk = self.server_info.max_texts if self.server_info is not None else max(len(texts), 1)
        scores: list[float] = []
        self.last_truncated = []
        for start in range(0, len(texts), chunk):
            part = texts[start:start + chunk]
            request = ScoreRequest(texts=part, prompts=None if prompts is None else prompts[start:start + chunk])
            answer = self._parse(ScoreResponse, self._request(
                "POST", "/score", json=request.model_dump(mode="json", exclude_none=True)), "/score")
            if len(answer.scores) != len(part):
                raise ExperimentError(f"reward server {self.url} returned {len(answer.scores)} scores "
                                      f"for {len(part)} texts")
            self._check_identity(answer)
            scores.extend(answer.scores)
            self.last_truncated.extend(start + i for i in answer.truncated)
        self.truncated_total += len(self.last_truncated)
        return scores

    def close(self) -> None:
        self._client.close()

    def _check_identity(self, answer: ScoreResponse) -> None:
        info = self.server_info
        if info is not None and (answer.model, answer.label) != (info.model, info.label):
            raise ExperimentError(f"reward server {self.url} now scores with model '{answer.model}' label "
                                  f"'{answer.label}', but this run started with model '{info.model}' label "
                                  f"'{info.label}'")

    def _parse(self, model: type[M], data: Any, path: str) -> M:
        try:
            return model.model_validate(data)
        except ValidationError as err:
            raise ExperimentError(f"reward server {self.url}{path} sent an answer this client does not understand "
                                  f"(another purplerl version?): {_first_line(str(err))}") from None

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON of a 2xx answer, after retrying connection errors and 5xx; ExperimentError otherwise."""
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.TransportError as err:  # refused, reset, timed out: the server may be restarting
                last_error = f"{type(err).__name__}: {_first_line(str(err)) or 'no detail'}"
                continue
            except httpx.HTTPError as err:  # e.g. a body that cannot be decoded: retrying will not help
                raise ExperimentError(f"reward server {self.url}{path}: {type(err).__name__}: "
                                      f"{_first_line(str(err))}") from None
            if response.status_code >= 500:
                last_error = f"HTTP {response.status_code}: {_detail(response)}"
                continue
            if response.status_code >= 400:
                hint = f" (the client reads the key from env {API_KEY_ENV})" if response.status_code == 401 else ""
                raise ExperimentError(f"reward server {self.url}{path} refused the request with HTTP "
                                      f"{response.status_code}: {_detail(response)}{hint}")
            try:
                return response.json()
            except ValueError:
                raise ExperimentError(f"reward server {self.url}{path} answered with something other than JSON: "
                                      f"{response.text[:80]!r}") from None
        raise ExperimentError(f"reward server {self.url} did not answer {method} {path} after "
                              f"{self.retries + 1} attempts; last error: {last_error}")


def _detail(response: httpx.Response) -> str:
    """The server's one-line reason: `detail` of a JSON error body, else the start of the body."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = detail if isinstance(detail, str) else response.text[:200]
    return _first_line(text) or response.reason_phrase


def record_server(cfg: ToxicityConfig, info: ServerInfo) -> None:
    """Write the server's model and label into the run's config (saved in config.yaml). A config that
    already names them (a resumed run) must match: its reward came from that model."""
    if cfg.server_model is not None and (cfg.server_model, cfg.server_label) != (info.model, info.label):
        raise ExperimentError(f"reward server {cfg.url} serves model '{info.model}' label '{info.label}', but this "
                              f"run was scored by model '{cfg.server_model}' label '{cfg.server_label}': start "
                              f"the server with that model to resume")
    cfg.server_model, cfg.server_label = info.model, info.label
