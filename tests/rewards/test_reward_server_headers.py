"""The request-head cap (max_header_bytes, 16 KiB by default as README.md promises): over it is 400 however the
bytes arrive (one write or many, one huge header or many small ones), at it is served, and the server goes on
serving. Raw sockets against real uvicorn on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from reward_servers import ThreadServer

from purplerl.config import RewardServerConfig
from purplerl.rewards.server import create_app

LIMIT = RewardServerConfig().max_header_bytes
START = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
WAIT_S = 60  # only ends a hung test


class Zero:
    name = "zero"

    def score(self, texts: list[str], prompts: list[str] | None = None) -> list[float]:
        return [0.0] * len(texts)


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    settings = RewardServerConfig()
    running = ThreadServer(create_app(settings, Zero(), "zero", "zero"), settings)
    yield running
    running.stop()


def head(size: int, headers: int = 1) -> bytes:
    """A complete GET /health head of exactly `size` bytes, padded with `headers` headers 'X-Pad-NNNNN: aaa...'."""
    overhead = len(START) + 2 + headers * len(b"X-Pad-00000: \r\n")
    pad, extra = divmod(size - overhead, headers)
    assert pad >= 1
    lines = [b"X-Pad-%05d: %s\r\n" % (i, b"a" * (pad + (i < extra))) for i in range(headers)]
    out = START + b"".join(lines) + b"\r\n"
    assert len(out) == size
    return out


def exchange(server: ThreadServer, pieces: list[bytes]) -> bytes:
    """Sends each piece in its own write (a pause between, so the server reads them apart) and returns all the
    server answers until it closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(0.002)
            sock.sendall(piece)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def refused_then_served(server: ThreadServer, pieces: list[bytes]) -> bool:
    """400 for `pieces`, and the next request served: a refusal closes one connection, not the server."""
    refused = exchange(server, pieces).startswith(b"HTTP/1.1 400 ")
    return refused and exchange(server, [START + b"\r\n"]).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("pieces", [
    [head(100_000)],                              # one huge header, one write
    [head(100_000, headers=2000)],                # many headers, one write
    [head(LIMIT + 1)],                            # one byte over, one write
    [head(LIMIT + 1, headers=300)],
    split(head(LIMIT + 1), 100),                  # many small writes, the last one crossing the cap
    split(head(LIMIT + 1, headers=300), 1000),
    [head(LIMIT + 1)[:-4], b"\r\n\r\n"],          # whole but for its blank line, then the rest
    # still sending long after the 400: the answer must survive the rest arriving (no reset before it is read)
    [head(1_000_000)],
    split(head(60_000), 1000),
], ids=["huge-header", "many-headers", "one-over", "one-over-many-headers", "small-writes",
        "small-writes-many-headers", "crossing-write", "megabyte-header", "long-drip"])
def test_a_head_over_the_cap_gets_400(server: ThreadServer, pieces: list[bytes]) -> None:
    assert refused_then_served(server, pieces)


def test_a_head_still_incomplete_past_the_cap_gets_400(server: ThreadServer) -> None:
    incomplete = START + b"X-Pad: " + b"a" * (LIMIT + 1 - len(START) - len(b"X-Pad: "))
    assert refused_then_served(server, split(incomplete, 500))


@pytest.mark.parametrize("pieces", [[head(LIMIT)], [head(LIMIT, headers=300)], split(head(LIMIT), 100)],
                         ids=["one-write", "many-headers", "small-writes"])
def test_a_head_at_the_cap_is_served(server: ThreadServer, pieces: list[bytes]) -> None:
    assert exchange(server, pieces).startswith(b"HTTP/1.1 200 ")


def test_the_cap_is_16_kib() -> None:
    assert LIMIT == 16 * 1024
