"""The reward server's micro-batcher: concurrent score requests merged into few scorer calls, run one at a
time on one thread, each call with a time limit.

Each request becomes a job on an asyncio queue; one worker task takes the first job, adds the jobs already
queued up to `max_batch_texts` texts, and runs the scorer once on the scorer thread, so model work never
blocks the event loop and one model call serves many small requests. When the batch is not full and other
requests are still being received, it first waits `batch_wait_ms` (default 2) for them; a lone client
never waits. (On 2 CPU cores a scorer call of the embedded model costs ~2.8 ms plus ~11 us per text, so
merging 8 requests of 32 texts costs ~5.7 ms instead of ~26 ms: see bench/NOTES.md.) A request is never
split across batches. When a merged batch fails, its jobs are rescored one by one so one bad request
cannot fail its neighbours.

A scorer call that has not answered within `score_timeout_s` is wedged (a hung GPU, a deadlock in a
tokenizer): its requests, those queued behind it and any that arrive while it runs get HTTP 503 at once,
and `trouble()` (shown by /health) says why. A thread cannot be stopped, so no other call starts until it
returns; then the server serves again by itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException

from purplerl.errors import first_line
from purplerl.rewards.base import Scorer, checked_values

log = logging.getLogger("uvicorn.error")  # uvicorn gives it a stderr handler; a server line belongs there


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


class ScorerStalled(Exception):
    """The scorer did not answer in time, or an earlier call still holds it: answered with HTTP 503."""


class ScorerThread:
    """Runs calls one at a time on one daemon thread.

    Not asyncio's default executor: its threads are joined when the server exits, so one wedged scorer
    call would keep a stopped server from ever exiting. One thread on purpose: neither torch models nor
    scikit-learn pipelines promise thread safety, and a bigger batch is the cheaper way to use the hardware.
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple]] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="purplerl-scorer", daemon=True)
            self._thread.start()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((done, fn, args))
        return asyncio.wrap_future(done)

    def _serve(self) -> None:
        while True:
            done, fn, args = self._calls.get()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn(*args))
            except BaseException as err:  # handed to the awaiting request, which turns it into an HTTP answer
                done.set_exception(err)


@dataclass
class MicroBatcher:
    """Merges concurrent score requests into few scorer calls (see the module docstring)."""

    scorer: Scorer
    max_batch_texts: int
    wait_s: float
    max_pending: int
    timeout_s: float = 60.0
    counters: _Counters = field(default_factory=_Counters)
    arriving: int = 0  # requests whose body is being read or checked: they will join the queue shortly
    _queue: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)
    _thread: ScorerThread = field(default_factory=ScorerThread)
    _call: asyncio.Future[list[float]] | None = None  # the latest scorer call
    _call_since: float = 0.0  # event-loop time it started
    _stalled: bool = False  # the latest call outlived timeout_s

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def trouble(self) -> str | None:
        """Why the server cannot score now (a wedged scorer call), or None."""
        if self._call is None or self._call.done():
            return None
        running_s = asyncio.get_running_loop().time() - self._call_since
        if not self._stalled and running_s < self.timeout_s:
            return None
        return (f"scorer '{self.scorer.name}' has not answered a call for {running_s:.1f} s "
                f"(score_timeout_s={self.timeout_s:g})")

    async def submit(self, texts: list[str], prompts: list[str] | None) -> list[float]:
        trouble = self.trouble()
        if trouble is not None:
            raise ScorerStalled(f"{trouble}; retry later")
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
        texts = [t for job in jobs for t in job.texts]
        prompts = None if jobs[0].prompts is None else [p for job in jobs for p in job.prompts]
        try:
            scores = await self._call_scorer(texts, prompts)
        except ScorerStalled as err:
            while not self._queue.empty():  # queued jobs would wait for the wedged call: they are answered now
                jobs.append(self._queue.get_nowait())
            for job in jobs:
                _settle(job, error=err)
            return
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

    async def _call_scorer(self, texts: list[str], prompts: list[str] | None) -> list[float]:
        if self._call is not None and not self._call.done():  # only a wedged call can still run here
            raise ScorerStalled(f"{self.trouble()}; retry later")
        self.counters.batches += 1
        loop = asyncio.get_running_loop()
        self._call = self._thread.run(checked_values, self.scorer, texts, prompts)
        self._call_since, self._stalled = loop.time(), False
        done, _ = await asyncio.wait({self._call}, timeout=self.timeout_s)
        if not done:
            self._stalled = True
            self._call.add_done_callback(self._unwedged)
            log.warning("%s; its requests get HTTP 503 until it returns", self.trouble())
            raise ScorerStalled(f"scorer '{self.scorer.name}' did not answer within score_timeout_s="
                                f"{self.timeout_s:g} s; retry later")
        try:
            scores = self._call.result()
        except Exception as err:  # any scorer failure becomes a 500 for its request; the server lives on
            raise ScoringError(f"scorer '{self.scorer.name}' failed: {type(err).__name__}: "
                               f"{first_line(str(err))}") from err
        self.counters.texts += len(texts)
        return scores

    def _unwedged(self, call: asyncio.Future[list[float]]) -> None:
        # the answer went to nobody (its requests got 503); retrieving the error keeps asyncio from logging it
        error = None if call.cancelled() else call.exception()
        outcome = "failed" if error is not None else "answered"
        running_s = asyncio.get_running_loop().time() - self._call_since
        log.warning("scorer '%s' %s after %.1f s; serving again", self.scorer.name, outcome, running_s)


def _settle(job: _Job, result: list[float] | None = None, error: Exception | None = None) -> None:
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result or [])
