"""The reward server's client: a Scorer that scores over HTTP (`purplerl serve-reward`).

A dead or failing server stops the run with an ExperimentError that names the URL and the last error:
a reward of zero (or of anything made up) would train the policy on noise. Connection errors, timeouts
and HTTP 5xx are retried `retries` times with exponential backoff first, since a server restart or a
brief overload is normal; a 4xx is the client's fault, so it is reported at once with the server's
message. The server's model and label are checked on every answer, so a server swapped for another
model in the middle of a run stops it too.

A healthy run must never meet a 413: before the first batch the client reads the server's limits from
/info, cuts texts and prompts to `max_chars` itself (reported in `last_truncated` exactly like a cut made
by the server), and splits each batch into requests of at most `max_texts` texts whose JSON body, as
encoded and sent, fits `max_body_bytes`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from purplerl.config import API_KEY_ENV, RewardServerConfig, ToxicityConfig
from purplerl.errors import ExperimentError, UserError, first_line
from purplerl.rewards.schema import ScoreResponse, ServerInfo, cut_to_max_chars, scrub_surrogates

MAX_BACKOFF_S = 30.0
M = TypeVar("M", bound=BaseModel)


class HTTPScorer:
    """Scores texts with a reward server; implements the Scorer protocol.

    One pooled `httpx.Client` (keep-alive connections) per scorer. The first `score` calls `info()` unless
    it was called already; batches are then cut and split to the server's limits, and answers from
    another model than the one `info()` saw are refused. `truncated_total` counts texts cut to the
    server's `max_chars` (here or by the server); `last_truncated` holds the indices cut in the last
    `score` call. `sleep` waits between retries (tests record it instead of waiting).
    """

    name = "toxicity"

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not url.startswith(("http://", "https://")):
            raise UserError(f"reward server URL must start with http:// or https://, got '{url}'")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise UserError(f"reward server client needs timeout_s > 0, retries >= 0 and backoff_s >= 0, "
                            f"got {timeout_s}, {retries}, {backoff_s}")
        key_problem = None if api_key is None else RewardServerConfig.key_problem(api_key)
        if key_problem is not None:  # caught here: httpx would refuse it only at the first request, with a raw error
            raise UserError(f"reward server API key (env {API_KEY_ENV}): {key_problem}")
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep
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
        self.last_truncated = []
        if not texts:
            return []
        info = self.server_info if self.server_info is not None else self.info()
        texts, prompts, cut = cut_to_max_chars(texts, prompts, info.max_chars)
        truncated = set(cut)
        scores: list[float] = []
        for start, stop, body in self._bodies(texts, prompts, info):
            answer = self._parse(ScoreResponse, self._request(
                "POST", "/score", content=body, headers={"content-type": "application/json"}), "/score")
            if len(answer.scores) != stop - start:
                raise ExperimentError(f"reward server {self.url} returned {len(answer.scores)} scores "
                                      f"for {stop - start} texts")
            self._check_identity(answer)
            scores.extend(answer.scores)
            truncated.update(start + i for i in answer.truncated)
        self.last_truncated = sorted(truncated)
        self.truncated_total += len(self.last_truncated)
        return scores

    def _bodies(self, texts: list[str], prompts: list[str] | None,
                info: ServerInfo) -> list[tuple[int, int, bytes]]:
        """(start, stop, JSON body) of each request: at most max_texts texts, at most max_body_bytes each."""
        texts_enc = [encode_string(t) for t in texts]
        prompts_enc = None if prompts is None else [encode_string(p) for p in prompts]
        frame = len(score_body([], None if prompts_enc is None else []))
        sizes = [len(t) + (0 if prompts_enc is None else len(prompts_enc[i])) for i, t in enumerate(texts_enc)]
        for i, size in enumerate(sizes):
            if frame + size > info.max_body_bytes:
                raise ExperimentError(
                    f"text {i}{'' if prompts is None else ' with its prompt'} cannot be sent to reward server "
                    f"{self.url}: cut to max_chars={info.max_chars} "
                    f"characters, its request body is still {frame + size} bytes, over max_body_bytes="
                    f"{info.max_body_bytes}; start the server with a larger --max-body-bytes or a smaller --max-chars")
        separators = 1 if prompts_enc is None else 2  # one comma per list between neighbouring items
        ranges = split_ranges(sizes, frame, separators, info.max_texts, info.max_body_bytes)
        return [(start, stop, score_body(texts_enc[start:stop],
                                         None if prompts_enc is None else prompts_enc[start:stop]))
                for start, stop in ranges]

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
                                  f"(another purplerl version?): {first_line(str(err))}") from None

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON of a 2xx answer, after retrying connection errors and 5xx; ExperimentError otherwise."""
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.TransportError as err:  # refused, reset, timed out: the server may be restarting
                last_error = f"{type(err).__name__}: {first_line(str(err)) or 'no detail'}"
                continue
            except httpx.HTTPError as err:  # e.g. a body that cannot be decoded: retrying will not help
                raise ExperimentError(f"reward server {self.url}{path}: {type(err).__name__}: "
                                      f"{first_line(str(err))}") from None
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


def encode_string(text: str) -> bytes:
    """`text` as a JSON string in UTF-8, exactly as sent (lone surrogates, which UTF-8 cannot carry, as U+FFFD:
    see `purplerl.rewards.schema`)."""
    return json.dumps(scrub_surrogates(text), ensure_ascii=False).encode()


def score_body(texts_enc: list[bytes], prompts_enc: list[bytes] | None) -> bytes:
    """The /score request body from encoded strings (`encode_string`)."""
    body = b'{"texts":[' + b",".join(texts_enc) + b"]"
    if prompts_enc is not None:
        body += b',"prompts":[' + b",".join(prompts_enc) + b"]"
    return body + b"}"


def split_ranges(sizes: list[int], frame: int, separator: int, max_items: int, max_bytes: int,
                 ) -> list[tuple[int, int]]:
    """Consecutive [start, stop) ranges of items, greedily as long as possible, each of at most `max_items`
    items and at most `max_bytes` bytes: `frame` bytes, plus the items' `sizes`, plus `separator` bytes
    between neighbours. An item that does not fit alone gets a range of its own (the caller refuses it)."""
    ranges: list[tuple[int, int]] = []
    start, used = 0, frame
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_items or used + separator + size > max_bytes):
            ranges.append((start, i))
            start, used = i, frame
        used += size + (separator if i > start else 0)
    if sizes:
        ranges.append((start, len(sizes)))
    return ranges


def _detail(response: httpx.Response) -> str:
    """The server's one-line reason: `detail` of a JSON error body, else the start of the body."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = detail if isinstance(detail, str) else response.text[:200]
    return first_line(text) or response.reason_phrase


def record_server(cfg: ToxicityConfig, info: ServerInfo) -> None:
    """Write the server's model and label into the run's config (saved in config.yaml). A config that
    already names them (a resumed run) must match: its reward came from that model."""
    if cfg.server_model is not None and (cfg.server_model, cfg.server_label) != (info.model, info.label):
        raise ExperimentError(f"reward server {cfg.url} serves model '{info.model}' label '{info.label}', but this "
                              f"run was scored by model '{cfg.server_model}' label '{cfg.server_label}': start "
                              f"the server with that model to resume")
    cfg.server_model, cfg.server_label = info.model, info.label
