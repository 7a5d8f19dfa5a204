"""Reward servers for the tests: the real app served by uvicorn in a thread, and a scorer that blocks."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from purplerl.config import RewardServerConfig
from purplerl.rewards.server import uvicorn_config


class ThreadServer:
    """uvicorn serving `app` in a daemon thread on a free 127.0.0.1 port (bound here, so no race), with the
    connection settings `serve` gives it."""

    def __init__(self, app: FastAPI, settings: RewardServerConfig | None = None) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, see _bind
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, settings or RewardServerConfig()))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "test server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class BlockingScorer:
    """Scores 0.5 once `release` is set; `entered` is set when a call starts. The timeout only ends a hung test."""

    name = "toxicity"

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        self.entered.set()
        assert self.release.wait(timeout=60)
        return [0.5] * len(texts)
