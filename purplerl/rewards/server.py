"""The reward server: one scorer behind `POST /score`, so the trainer and the reward model can live in
different processes or on different machines (the red-team trainer's reward server, port 50050).

Run it with `purplerl serve-reward`, or as an ASGI app, `uvicorn purplerl.rewards.server:app`, which
reads its settings from `PURPLERL_REWARD_<FIELD>` env vars (MODEL, LABEL, DEVICE, API_KEY, MAX_TEXTS,
MAX_CHARS, ... : every field of `purplerl.config.RewardServerConfig`).

Endpoints (wire format in `purplerl.rewards.schema`):
  POST /score  {texts, prompts?} -> {scores, model, label, truncated}
  GET  /info   model, label, limits, version          GET /health  liveness and counters (never needs a key)

Bad input is answered, never crashes the server: malformed JSON or bad UTF-8 -> 400; a body that is not
{texts: [str, ...], prompts?: [str, ...]}, an empty batch, or prompts of another length -> 422; more than
`max_texts` texts or a body over `max_body_bytes` -> 413; a content type other than JSON -> 415; a
missing or wrong API key -> 401; the scorer failing -> 500 naming the error; too many queued requests -> 503.

Texts (and prompts) over `max_chars` characters are cut to their first `max_chars` characters, scored,
and their indices returned in `truncated`, rather than rejected. A long completion is an ordinary RL
outcome (policies drift to long outputs), not a client bug, and rejecting it would stop the training
run; classifiers cut their input anyway (an HF classifier keeps its first `max_length` tokens, far
fewer than the default 20,000 characters); and the response says exactly which texts were cut, so the
client logs it (`toxicity_truncated` in the attack's metrics) instead of it passing silently.

Micro-batching: each request becomes a job on an asyncio queue; one worker task takes the first job,
adds the jobs already queued up to `max_batch_texts` texts, and runs the scorer once in a worker thread,
so model work never blocks the event loop and one model call serves many small requests. When the batch
is not full and other requests are still being received, it first waits `batch_wait_ms` (default 2) for
them; a lone client never waits. (On 2 CPU cores a scorer call of the embedded model costs ~2.8 ms plus
~11 us per text, so merging 8 requests of 32 texts costs ~5.7 ms instead of ~26 ms: see bench/NOTES.md.)
A request is never split across batches. When a merged batch fails, its jobs are rescored one by one so
one bad request cannot fail its neighbours.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import ValidationError

import purplerl
from purplerl.config import RewardServerConfig, build_server_config
from purplerl.errors import UserError
from purplerl.rewards.base import Scorer, checked_values
from purplerl.rewards.schema import ErrorBody, Health, ScoreRequest, ScoreResponse, ServerInfo
from purplerl.rewards.toxicity import make_classifier

ENV_PREFIX = "PURPLERL_REWARD_"


@dataclass
class _Job:
    texts: list[str]
    prompts: list[str] | None
    future: asyncio.Future[list[float]]


@dataclass
class _Counters:
    requests: int = 0
    batches: int = 0
    texts: int = 0


class ScoringError(Exception):
    """The scorer failed on a request: answered with HTTP 500 and this message."""


@dataclass
class MicroBatcher:
    """Merges concurrent score requests into few scorer calls, run one at a time in a worker thread.

    One at a time on purpose: neither torch models nor scikit-learn pipelines promise thread safety, and
    a bigger batch is the cheaper way to use the hardware than several threads.
    """

    scorer: Scorer
    max_batch_texts: int
    wait_s: float
    max_pending: int
    counters: _Counters = field(default_factory=_Counters)
    arriving: int = 0  # requests whose body is being read or checked: they will join the queue shortly
    _queue: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)

    async def submit(self, texts: list[str], prompts: list[str] | None) -> list[float]:
        if self._queue.qsize() >= self.max_pending:
            raise HTTPException(503, f"server busy: {self.max_pending} requests already waiting; retry later")
        job = _Job(texts, prompts, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        return await job.future

    async def run(self) -> None:
        """The worker loop; runs until cancelled at shutdown."""
        carry: _Job | None = None
        while True:
            first = carry if carry is not None else await self._queue.get()
            jobs = [first]
            carry = self._gather(jobs)
            if carry is None and self.arriving and self.wait_s > 0 and self._size(jobs) < self.max_batch_texts:
                # requests already on their way join this scorer call; a lone client never waits
                await asyncio.sleep(self.wait_s)
                carry = self._gather(jobs)
            try:
                await self._score(jobs)
            except Exception as err:  # a bug here must fail these requests, not stop the worker for all later ones
                for job in jobs:
                    _settle(job, error=ScoringError(f"internal error: {type(err).__name__}: {err}"))

    def _size(self, jobs: list[_Job]) -> int:
        return sum(len(job.texts) for job in jobs)

    def _gather(self, jobs: list[_Job]) -> _Job | None:
        """Move queued jobs into `jobs` while they fit; return the first job that does not (or None)."""
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if job.future.done():  # its client went away (request cancelled)
                continue
            # texts with and without prompts are not mixed: a judge must not see made-up empty prompts
            fits = self._size(jobs) + len(job.texts) <= self.max_batch_texts
            if not fits or (job.prompts is None) != (jobs[0].prompts is None):
                return job
            jobs.append(job)
        return None

    async def _score(self, jobs: list[_Job]) -> None:
        jobs = [job for job in jobs if not job.future.done()]
        if not jobs:
            return
        try:
            scores = await self._call([t for job in jobs for t in job.texts],
                                      None if jobs[0].prompts is None else [p for job in jobs for p in job.prompts])
        except ScoringError as err:
            if len(jobs) > 1:  # find the culprit: rescore alone, so other requests still get their scores
                for job in jobs:
                    await self._score([job])
                return
            _settle(jobs[0], error=err)
            return
        start = 0
        for job in jobs:
            _settle(job, result=scores[start:start + len(job.texts)])
            start += len(job.texts)
            self.counters.requests += 1

    async def _call(self, texts: list[str], prompts: list[str] | None) -> list[float]:
        self.counters.batches += 1
        try:
            scores = await asyncio.to_thread(checked_values, self.scorer, texts, prompts)
        except Exception as err:  # any scorer failure becomes a 500 for its request; the server lives on
            first = (str(err).strip().splitlines() or [""])[0]
            raise ScoringError(f"scorer '{self.scorer.name}' failed: {type(err).__name__}: {first}") from err
        self.counters.texts += len(texts)
        return scores


def _settle(job: _Job, result: list[float] | None = None, error: Exception | None = None) -> None:
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result or [])


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
                f"the scorer (set --api-key or PURPLERL_REWARD_API_KEY)")
    return None


def load_scorer(settings: RewardServerConfig) -> tuple[Scorer, str | None]:
    """The scorer the settings name, and the name of the output it scores."""
    if settings.model == "embedded" and settings.label is not None:
        raise UserError(f"--label {settings.label} is for HF classifiers: the embedded scorer has one output")
    scorer = make_classifier(settings)
    label = getattr(scorer, "label_name", None)
    return scorer, None if label is None else str(label)


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    msg = first["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" + (f" (and {len(err.errors()) - 1} more errors)" if len(err.errors()) > 1 else "")


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


def parse_score_request(body: bytes, content_type: str, settings: RewardServerConfig) -> ScoreRequest:
    """Validate a /score body against the schema and the server's limits; HTTPException names the problem."""
    if content_type.split(";")[0].strip().lower() not in ("application/json", ""):
        raise HTTPException(415, f"content type must be application/json, got '{content_type}'")
    try:
        request = ScoreRequest.model_validate_json(body)
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
    prompts = request.prompts
    cut = [i for i, text in enumerate(request.texts)
           if len(text) > max_chars or (prompts is not None and len(prompts[i]) > max_chars)]
    if not cut:
        return request.texts, prompts, []
    texts = [text[:max_chars] for text in request.texts]
    return texts, None if prompts is None else [p[:max_chars] for p in prompts], cut


# the body is parsed by hand (see `parse_score_request`), so OpenAPI learns its schema from here
SCORE_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": ScoreRequest.model_json_schema()}}}}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 413, 415, 422, 500, 503)}


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


def create_app(settings: RewardServerConfig, scorer: Scorer | None = None, label: str | None = None) -> FastAPI:
    """The ASGI app serving `scorer` (default: the one `settings` names, loaded now, so a bad model fails
    before the port opens). `label` is what /info reports for an injected scorer."""
    if scorer is None:
        scorer, label = load_scorer(settings)
    batcher = MicroBatcher(scorer, settings.max_batch_texts, settings.batch_wait_ms / 1000, settings.max_pending)
    info = ServerInfo(model=settings.model, label=label, version=purplerl.__version__, max_texts=settings.max_texts,
                      max_chars=settings.max_chars, max_batch_texts=settings.max_batch_texts,
                      max_body_bytes=settings.max_body_bytes)

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
            body = await _read_body(request, settings.max_body_bytes)
            parsed = parse_score_request(body, request.headers.get("content-type", ""), settings)
        finally:
            batcher.arriving -= 1
        texts, prompts, cut = truncate(parsed, settings.max_chars)
        try:
            scores = await batcher.submit(texts, prompts)
        except ScoringError as err:
            raise HTTPException(500, str(err)) from None
        return ScoreResponse(scores=scores, model=info.model, label=info.label, truncated=cut)

    @app.get("/info", response_model=ServerInfo, responses=ERROR_RESPONSES, dependencies=[require_key])
    async def get_info() -> ServerInfo:
        return info

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        c = batcher.counters
        return Health(requests=c.requests, batches=c.batches, texts=c.texts)

    return app


def settings_from_env(environ: dict[str, str] | None = None) -> RewardServerConfig:
    """RewardServerConfig from PURPLERL_REWARD_<FIELD> env vars (unset ones keep their defaults)."""
    environ = dict(os.environ if environ is None else environ)
    # an empty variable counts as unset, as it does for the CLI's --api-key
    values = {name: environ[ENV_PREFIX + name.upper()] for name in RewardServerConfig.model_fields
              if environ.get(ENV_PREFIX + name.upper())}
    return build_server_config(values, lambda field: ENV_PREFIX + field.upper())


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


def serve(settings: RewardServerConfig, announce: Callable[[str], None] = print) -> None:
    """Load the scorer, then serve it with uvicorn until SIGINT/SIGTERM."""
    import uvicorn

    sock = _bind(settings.host, settings.port)
    with sock:
        app = create_app(settings)
        info = app.state.info
        announce(f"reward server: model '{info.model}' label '{info.label}' on "
                 f"http://{settings.host}:{settings.port} (POST /score, GET /info, GET /health)")
        # access logs off: at thousands of requests a second they cost more than the scoring
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        uvicorn.Server(config).run(sockets=[sock])


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
