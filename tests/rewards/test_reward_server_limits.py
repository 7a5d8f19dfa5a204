"""The reward server and client at their limits: long completions, lone surrogates, slow or vanishing
clients, a wedged scorer, too many connections, keys that can never match. Real uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from reward_servers import BlockingScorer, ThreadServer

from purplerl.config import RewardServerConfig
from purplerl.errors import ExperimentError, UserError
from purplerl.rewards.client import HTTPScorer
from purplerl.rewards.server import create_app, settings_from_env
from purplerl.rewards.toxicity import EmbeddedToxicityScorer

WAIT_S = 60  # only ends a hung test; nothing here is timed against it


def serve(**settings: object) -> ThreadServer:
    config = RewardServerConfig(**settings)
    return ThreadServer(create_app(config), config)


def long_completions(char: str) -> list[str]:
    """1,024 completions of 33,000 characters each, each with its own words first so their scores differ."""
    words = ["you", "stupid", "idiot", "lovely", "day", "hell", "crap", "moron", "nice", "weather", "hurt"]
    heads = [" ".join(words[(i * 7 + j) % len(words)] for j in range(1 + i % 5)) + " " for i in range(1024)]
    return [(head + char * 33_000)[:33_000] for head in heads]


def wait_until(condition: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(WAIT_S * 100):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition not met")


# ------------------------------------------------------------------------------------- long completions


def test_1024_completions_of_33000_chars_with_small_limits() -> None:
    server = serve(max_texts=100, max_chars=50, max_body_bytes=2048)
    try:
        texts = long_completions("x")
        scorer = HTTPScorer(server.url, retries=0)
        prompts = ["write something rude"] * len(texts)
        assert scorer.score(texts, prompts) == EmbeddedToxicityScorer().score([t[:50] for t in texts])
        assert scorer.last_truncated == list(range(1024)) and scorer.truncated_total == 1024
        health = httpx.get(f"{server.url}/health").json()
        # {"texts":[],"prompts":[]} (25 bytes) + n texts (52) and prompts (22) + 2 (n - 1) commas <= 2,048 bytes
        # holds up to n = 26: 40 requests
        assert health["requests"] == 40
    finally:
        server.stop()


def test_1024_completions_of_33000_chars_with_default_limits() -> None:
    # cut to the default 20,000 characters, "é" (2 bytes of UTF-8) makes each text ~40 kB and the batch ~41 MB:
    # over the default max_body_bytes of 32 MiB, so the client must split it
    server = serve()
    try:
        texts = long_completions("é")
        scorer = HTTPScorer(server.url, retries=0)
        assert scorer.score(texts) == EmbeddedToxicityScorer().score([t[:20_000] for t in texts])
        assert scorer.last_truncated == list(range(1024))
        assert httpx.get(f"{server.url}/health").json()["requests"] == 2
    finally:
        server.stop()


# --------------------------------------------------------------------------------------- lone surrogates


def test_lone_surrogates_score_as_in_process() -> None:
    server = serve()
    try:
        texts = ["you idiot \ud800", "\udfffgo to hell you moron", "stupid\ud800idiot", "\ud800", "nice \udc00 day"]
        expected = EmbeddedToxicityScorer().score(texts)
        assert HTTPScorer(server.url, retries=0).score(texts, prompts=texts) == expected
        # Python's json writes them as "\ud800" escapes, which the server's parser alone would refuse
        body = json.dumps({"texts": texts})
        assert "\\ud800" in body
        response = httpx.post(f"{server.url}/score", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        assert response.json()["scores"] == expected
        broken = httpx.post(f"{server.url}/score", content='{"texts": ["\\ud800"', headers={})
        assert broken.status_code == 400 and broken.json()["detail"].startswith("malformed JSON")
        # nesting past Python's stack, with a lone surrogate so the rescue parser runs too: a 4xx, not a 500
        deep = '{"texts": ["\\ud800"], "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
        nested = httpx.post(f"{server.url}/score", content=deep, headers={"content-type": "application/json"})
        assert 400 <= nested.status_code < 500, nested.text
        assert httpx.post(f"{server.url}/score", json={"texts": ["nice day"]}).status_code == 200
    finally:
        server.stop()


# ---------------------------------------------------------------------------- slow or vanishing clients


def connect(server: ThreadServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it never does)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture(scope="module")
def impatient() -> Iterator[ThreadServer]:
    server = serve(header_timeout_s=0.2, body_timeout_s=0.2, keep_alive_s=0.2, max_header_bytes=1024)
    yield server
    server.stop()


@pytest.mark.parametrize("sent", [b"", b"POST /score HTTP/1.1\r\n", b"POST /score HTTP/1.1\r\nHost: x\r\nContent-"])
def test_stalled_headers_close_the_connection(impatient: ThreadServer, sent: bytes) -> None:
    with connect(impatient) as sock:
        sock.sendall(sent)
        assert read_until_closed(sock) == b""


def test_stalled_body_gets_408(impatient: ThreadServer) -> None:
    with connect(impatient) as sock:
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n" + b'{"texts": ["a')
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(b'{"detail":"request body not received within body_timeout_s=0.2 s"}')
    assert httpx.get(f"{impatient.url}/health").status_code == 200


def test_idle_kept_alive_connection_is_closed(impatient: ThreadServer) -> None:
    with connect(impatient) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"status":"ok"' in answer


def test_headers_growing_past_max_header_bytes_get_400(impatient: ThreadServer) -> None:
    with connect(impatient) as sock:  # headers still incomplete after 2,000 bytes
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 2000)
        assert read_until_closed(sock).startswith(b"HTTP/1.1 400 ")


class Records(logging.Handler):
    """Collects the records of uvicorn's error logger (where the server logs) and signals each one."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.arrived = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.arrived:
            self.records.append(record)
            self.arrived.notify_all()

    def wait_for(self, text: str) -> logging.LogRecord:
        with self.arrived:
            assert self.arrived.wait_for(lambda: any(text in r.getMessage() for r in self.records), WAIT_S), text
            return next(r for r in self.records if text in r.getMessage())


def test_client_gone_mid_body_is_one_log_line(impatient: ThreadServer) -> None:
    logger = logging.getLogger("uvicorn.error")
    records = Records()
    logger.addHandler(records)
    try:
        with connect(impatient) as sock:
            sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b'{"texts": ["a' * 10)
        record = records.wait_for("disconnected before sending its whole request body")
        assert record.exc_info is None and "\n" not in record.getMessage()
        assert record.getMessage().endswith("(1000 bytes declared): request dropped")
        assert httpx.get(f"{impatient.url}/health").json()["status"] == "ok"
        assert not [r for r in records.records if r.exc_info is not None or r.levelno >= logging.ERROR]
    finally:
        logger.removeHandler(records)


def test_connections_over_the_limit_get_503() -> None:
    server = serve(max_connections=2, keep_alive_s=WAIT_S, header_timeout_s=WAIT_S)
    try:
        first, second = httpx.Client(base_url=server.url), httpx.Client(base_url=server.url)
        assert first.get("/health").status_code == 200 and second.get("/health").status_code == 200
        with httpx.Client(base_url=server.url) as third:  # both others stay open (keep-alive)
            assert third.get("/health").status_code == 503
            second.close()
            wait_until(lambda: third.get("/health").status_code == 200)
        first.close()
    finally:
        server.stop()


# ----------------------------------------------------------------------------------------- wedged scorer


def test_wedged_scorer_makes_health_degraded_and_requests_503() -> None:
    scorer = BlockingScorer()
    settings = RewardServerConfig(score_timeout_s=0.2, batch_wait_ms=0)
    server = ThreadServer(create_app(settings, scorer=scorer), settings)
    try:
        with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
            assert http.get("/health").json()["status"] == "ok"
            first = http.post("/score", json={"texts": ["a"]})
            assert first.status_code == 503
            assert scorer.entered.wait(WAIT_S)  # the call reached the scorer (it may start late on a busy machine)
            assert first.json()["detail"] == ("scorer 'toxicity' did not answer within score_timeout_s=0.2 s; "
                                              "retry later")
            health = http.get("/health").json()
            assert health["status"] == "degraded" and health["pending"] == 0
            assert health["reason"].startswith("scorer 'toxicity' has not answered a call for ")
            assert health["reason"].endswith(" s (score_timeout_s=0.2)")
            # later requests are answered at once, not queued behind the wedged call
            sleeps: list[float] = []
            with pytest.raises(ExperimentError, match=r"after 3 attempts; last error: HTTP 503: scorer 'toxicity' "
                                                      r"has not answered a call for [0-9.]+ s"):
                HTTPScorer(server.url, retries=2, backoff_s=1.0, sleep=sleeps.append).score(["b"])
            assert sleeps == [1.0, 2.0]

            scorer.release.set()
            wait_until(lambda: http.get("/health").json()["status"] == "ok")
            assert http.get("/health").json()["reason"] is None
            assert http.post("/score", json={"texts": ["c"]}).json()["scores"] == [0.5]
            assert http.get("/health").json()["batches"] == 2  # the wedged call and this one: no call in between
    finally:
        scorer.release.set()
        server.stop()


# -------------------------------------------------------------------------------------------- API keys


@pytest.mark.parametrize(("key", "position"), [("clé", 3), ("two words", 4), ("ключ", 1)])
def test_server_refuses_a_key_that_can_never_match(key: str, position: int) -> None:
    with pytest.raises(UserError) as info:
        settings_from_env({"PURPLERL_REWARD_API_KEY": key})
    assert str(info.value) == ("PURPLERL_REWARD_API_KEY: an API key must be printable ASCII without spaces, "
                               f"but character {position} of {len(key)} is not")
    with pytest.raises(ValueError, match="printable ASCII"):
        RewardServerConfig(api_key=key)
