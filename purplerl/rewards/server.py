"""The reward server: one scorer behind `POST /score`, so the trainer and the reward model can live in
different processes or on different machines (the red-team trainer's reward server, port 50050). It serves the
toxicity classifier its settings name, or any registered "text" reward term (`serve(settings, term=NAME,
params=...)`, built by purplerl.rewards.served.make_server_scorer); /info and every answer say which.

Run it with `purplerl serve-reward`, or as an ASGI app, `uvicorn purplerl.rewards.server:app`, which
reads its settings from `PURPLERL_REWARD_<FIELD>` env vars (MODEL, LABEL, DEVICE, API_KEY, MAX_TEXTS,
MAX_CHARS, ... : every field of `purplerl.config.RewardServerConfig`). Under plain uvicorn the
connection settings (header_timeout_s, keep_alive_s, max_connections, max_header_bytes) are uvicorn's
own options instead, which bound less (`purplerl.rewards.connection`); everything else applies.

Endpoints (wire format in `purplerl.rewards.schema`):
  POST /score  {texts, prompts?} -> {scores, model, label, truncated}
  GET  /info   model, label, limits, version
  GET  /health status ok/degraded, why, counters (never needs a key)

Bad input is answered, never crashes the server: malformed JSON or bad UTF-8 -> 400; a body that is not
{texts: [str, ...], prompts?: [str, ...]}, an empty batch, prompts of another length, or no prompts for a judge
that reads them (a scorer with `needs_prompts`, e.g. the guard judge) -> 422; more than
`max_texts` texts or a body over `max_body_bytes` -> 413; a content type other than JSON -> 415; a
missing or wrong API key -> 401; the scorer failing -> 500 naming the error; too many queued requests, a
wedged scorer (see `purplerl.rewards.batcher`) or too many connections -> 503.

Slow or vanishing clients cost a bounded amount: headers must arrive within `header_timeout_s` (else the
connection is closed) and the request line plus headers may not exceed `max_header_bytes`, however the bytes
arrive (else 400 and the connection is closed), a body within `body_timeout_s` (else 408), idle connections
close after `keep_alive_s`, and at most `max_connections` are served at once. Each such event, and a client that
disconnects mid-body, is one log line, never a traceback: anyone who can reach the port could otherwise
flood the log.

Texts (and prompts) over `max_chars` characters are cut to their first `max_chars` characters, scored,
and their indices returned in `truncated`, rather than rejected. A long completion is an ordinary RL
outcome (policies drift to long outputs), not a client bug, and rejecting it would stop the training
run; classifiers cut their input anyway (an HF classifier keeps its first `max_length` tokens, far
fewer than the default 20,000 characters); and the response says exactly which texts were cut, so the
client logs it (`toxicity_truncated` in the attack's metrics) instead of it passing silently.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

import purplerl
from purplerl.config import ClassifierConfig, RewardServerConfig, build_server_config
from purplerl.config.base import Section
from purplerl.errors import UserError
from purplerl.rewards.base import Scorer
from purplerl.rewards.batcher import MicroBatcher, ScorerStalled, ScoringError
from purplerl.rewards.connection import HeaderDeadlineProtocol
from purplerl.rewards.schema import (
    ErrorBody,
    Health,
    ScoreRequest,
    ScoreResponse,
    ServerInfo,
    cut_to_max_chars,
    scrub_surrogates,
)
from purplerl.rewards.served import load_scorer, make_server_scorer

ENV_PREFIX = "PURPLERL_REWARD_"
log = logging.getLogger("uvicorn.error")  # uvicorn gives it a stderr handler; a server line belongs there
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


def exposure_warning(settings: RewardServerConfig) -> str | None:
    """The warning to print when the server listens beyond this machine without an API key."""
    if settings.api_key is None and not is_loopback(settings.host):
        return (f"warning: serving on {settings.host} without an API key: anyone who can reach this port can use "
                f"the scorer (set PURPLERL_REWARD_API_KEY)")
    return None


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    msg = first["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" + (f" (and {len(err.errors()) - 1} more errors)" if len(err.errors()) > 1 else "")


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "a client"


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past `limit` bytes without reading the rest."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body of {declared} bytes is over max_body_bytes={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"request body is over max_body_bytes={limit}")
        chunks.append(chunk)
    return b"".join(chunks)


async def receive_body(request: Request, settings: RewardServerConfig) -> bytes:
    """`_read_body` within `body_timeout_s` (else 408, and the connection is closed); a client gone mid-body
    is one log line (starlette's ClientDisconnect would otherwise reach uvicorn as a 60-line traceback)."""
    try:
        return await asyncio.wait_for(_read_body(request, settings.max_body_bytes), settings.body_timeout_s)
    except TimeoutError:
        log.warning("%s sent no complete request body within body_timeout_s=%g s: answered 408",
                    _client(request), settings.body_timeout_s)
        raise HTTPException(408, f"request body not received within body_timeout_s={settings.body_timeout_s:g} s",
                            headers={"Connection": "close"}) from None
    except ClientDisconnect:
        declared = request.headers.get("content-length", "unknown")
        log.warning("%s disconnected before sending its whole request body (%s bytes declared): request dropped",
                    _client(request), declared)
        raise HTTPException(400, "client disconnected") from None  # an answer nobody reads


def _scrubbed_json(body: bytes) -> bytes | None:
    """`body` with lone surrogate escapes replaced by U+FFFD (see `schema`), or None if it is no JSON at all.

    pydantic's parser refuses a lone surrogate escape ("unexpected end of hex escape"), Python's accepts it.
    """
    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            return scrub_surrogates(value)
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {scrub(k): scrub(v) for k, v in value.items()}
        return value

    def refuse_constant(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.dumps(scrub(json.loads(body.decode("utf-8"), parse_constant=refuse_constant)),
                          ensure_ascii=False).encode()
    except (ValueError, RecursionError):  # bad UTF-8, malformed JSON, NaN, nesting past the stack: the first
        return None  # parser's error says it better


def parse_score_request(body: bytes, content_type: str, settings: RewardServerConfig) -> ScoreRequest:
    """Validate a /score body against the schema and the server's limits; HTTPException names the problem."""
    if content_type.split(";")[0].strip().lower() not in ("application/json", ""):
        raise HTTPException(415, f"content type must be application/json, got '{content_type}'")
    try:
        try:
            request = ScoreRequest.model_validate_json(body)
        except ValidationError as err:
            rescued = _scrubbed_json(body) if SURROGATE_ESCAPE.search(body) else None
            if err.errors()[0]["type"] != "json_invalid" or rescued is None:
                raise
            request = ScoreRequest.model_validate_json(rescued)
    except ValidationError as err:
        if err.errors()[0]["type"] == "json_invalid":
            raise HTTPException(400, f"malformed JSON: {err.errors()[0]['msg']}") from None
        raise HTTPException(422, _one_line(err)) from None
    if len(request.texts) > settings.max_texts:
        raise HTTPException(413, f"{len(request.texts)} texts in one request is over max_texts={settings.max_texts}; "
                                 "split the batch")
    return request


def truncate(request: ScoreRequest, max_chars: int) -> tuple[list[str], list[str] | None, list[int]]:
    """Texts and prompts cut to max_chars, and the indices where either was cut."""
    return cut_to_max_chars(request.texts, request.prompts, max_chars)


# the body is parsed by hand (see `parse_score_request`), so OpenAPI learns its schema from here
SCORE_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": ScoreRequest.model_json_schema()}}}}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 408, 413, 415, 422, 500, 503)}


def _key_checker(settings: RewardServerConfig) -> Callable[[Request], None]:
    def require_key(request: Request) -> None:
        if settings.api_key is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {settings.api_key.get_secret_value()}"
        # constant time: the comparison must not tell an attacker how many leading characters were right
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise HTTPException(401, "missing or wrong API key (header 'Authorization: Bearer KEY')",
                                headers={"WWW-Authenticate": "Bearer"})

    return require_key


def create_app(settings: RewardServerConfig, scorer: Scorer | None = None, label: str | None = None,
               model: str | None = None) -> FastAPI:
    """The ASGI app serving `scorer` (default: the classifier `settings` names, loaded now, so a bad model fails
    before the port opens). `label` and `model` (default settings.model) are what /info reports for an injected
    scorer; `make_server_scorer` gives all three for a registered reward term."""
    if scorer is None:
        served = load_scorer(settings)
        scorer, label, model = served.scorer, served.label, served.model
    batcher = MicroBatcher(scorer, settings.max_batch_texts, settings.batch_wait_ms / 1000, settings.max_pending,
                           settings.score_timeout_s)
    info = ServerInfo(model=settings.model if model is None else model, label=label, version=purplerl.__version__,
                      max_texts=settings.max_texts, max_chars=settings.max_chars,
                      max_batch_texts=settings.max_batch_texts, max_body_bytes=settings.max_body_bytes)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()

    app = FastAPI(title="purplerl reward server", version=purplerl.__version__, lifespan=lifespan)
    app.state.info = info
    require_key = Depends(_key_checker(settings))

    @app.post("/score", response_model=ScoreResponse, responses=ERROR_RESPONSES, dependencies=[require_key],
              openapi_extra=SCORE_BODY)
    async def score(request: Request) -> ScoreResponse:
        # the body is parsed here rather than by FastAPI so every bad input gets a status and message we chose
        batcher.arriving += 1
        try:
            body = await receive_body(request, settings)
            parsed = parse_score_request(body, request.headers.get("content-type", ""), settings)
        finally:
            batcher.arriving -= 1
        if parsed.prompts is None and getattr(scorer, "needs_prompts", False):
            raise HTTPException(422, f"scorer '{scorer.name}' judges each text with the prompt it answers: send "
                                     "prompts (one per text)")
        texts, prompts, cut = truncate(parsed, settings.max_chars)
        try:
            scores = await batcher.submit(texts, prompts)
        except ScoringError as err:
            raise HTTPException(500, str(err)) from None
        except ScorerStalled as err:
            raise HTTPException(503, str(err)) from None
        return ScoreResponse(scores=scores, model=info.model, label=info.label, truncated=cut)

    @app.get("/info", response_model=ServerInfo, responses=ERROR_RESPONSES, dependencies=[require_key])
    async def get_info() -> ServerInfo:
        return info

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        c, trouble = batcher.counters, batcher.trouble()
        return Health(status="ok" if trouble is None else "degraded", reason=trouble, pending=batcher.pending,
                      requests=c.requests, batches=c.batches, texts=c.texts)

    return app


def settings_from_env(environ: dict[str, str] | None = None) -> RewardServerConfig:
    """RewardServerConfig from PURPLERL_REWARD_<FIELD> env vars (unset ones keep their defaults)."""
    environ = dict(os.environ if environ is None else environ)
    # an empty variable counts as unset, as it does for the CLI's --api-key
    values = {name: environ[ENV_PREFIX + name.upper()] for name in RewardServerConfig.model_fields
              if environ.get(ENV_PREFIX + name.upper())}
    return build_server_config(values, lambda field: ENV_PREFIX + field.upper())


def uvicorn_config(app: FastAPI, settings: RewardServerConfig) -> uvicorn.Config:
    """uvicorn's settings for `app`: the connection limits of `settings`, access logs off (at thousands of
    requests a second they cost more than the scoring)."""
    return uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
        # h11 always, with the head's deadline and exact size cap (purplerl.rewards.connection): uvicorn's
        # default, httptools where installed, has neither
        http=functools.partial(HeaderDeadlineProtocol, header_timeout_s=settings.header_timeout_s,
                               max_header_bytes=settings.max_header_bytes),
        timeout_keep_alive=settings.keep_alive_s,  # typed int, but a float works: it goes to call_later
        # uvicorn refuses when the open connections, this one included, reach the limit
        limit_concurrency=settings.max_connections + 1)


def _bind(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) socket: a taken port fails in a second, before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it Nagle's algorithm and delayed ACKs add ~40 ms to every keep-alive request
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # a restarted server must get its port back while the old connections sit in TIME_WAIT
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


def serve(settings: RewardServerConfig, *, term: str | None = None, params: Mapping[str, Any] | Section | None = None,
          announce: Callable[[str], None] = print) -> None:
    """Load the scorer, then serve it with uvicorn until SIGINT/SIGTERM: the classifier `settings` names, or the
    registered text reward term `term` built with `params` (purplerl.rewards.served.make_server_scorer)."""
    if term is not None:
        _no_classifier_settings(settings)
    sock = _bind(settings.host, settings.port)
    with sock:
        served = load_scorer(settings) if term is None else make_server_scorer(term, params)
        app = create_app(settings, served.scorer, served.label, served.model)
        info = app.state.info
        announce(f"reward server: model '{info.model}' label '{info.label}' on "
                 f"http://{settings.host}:{settings.port} (POST /score, GET /info, GET /health)")
        try:
            uvicorn.Server(uvicorn_config(app, settings)).run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn raises the signal again after its graceful shutdown; Ctrl-C is how to stop
            pass
        announce("reward server stopped")


def _no_classifier_settings(settings: RewardServerConfig) -> None:
    """A served term takes its parameters from the term: a classifier setting beside it would be ignored."""
    changed = [name for name in ClassifierConfig.model_fields
               if getattr(settings, name) != RewardServerConfig.model_fields[name].default]
    if changed:
        raise UserError(f"--{changed[0].replace('_', '-')} chooses the toxicity classifier; a served reward term "
                        "takes its parameters from the term instead")


_env_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    # `uvicorn purplerl.rewards.server:app` builds the app on first access, not at import: importing this
    # module (tests, the CLI) must not load a model
    global _env_app
    if name == "app":
        if _env_app is None:
            _env_app = create_app(settings_from_env())
        return _env_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
