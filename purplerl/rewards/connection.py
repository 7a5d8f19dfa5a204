"""The reward server's HTTP connections: uvicorn's h11 protocol with two bounds uvicorn lacks, a deadline for
each request's head and an exact cap on its size. `purplerl.rewards.server.uvicorn_config` installs it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("uvicorn.error")  # uvicorn gives it a stderr handler; a server line belongs there


class HeadLimitedConnection(h11.Connection):
    """h11's server side, refusing a request whose head (request line, every header and the blank line) is over
    `max_head_bytes`, however its bytes arrive: in one write or many, as one huge header or many small ones.

    h11's own bound (max_incomplete_event_size) measures a head only while it is still incomplete after a read:
    a head that arrives whole in one read (asyncio reads up to 256 KiB) passes at any size, and so does one whose
    last read crosses the bound. The bytes h11 takes from its buffer to make a request are the head's exact size.
    The refusal is h11's own error, so uvicorn answers it as it answers that bound: 400 and the connection closed.
    """

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes

    def next_event(self) -> Any:
        if self.their_state is not h11.IDLE:  # no head is being read
            return super().next_event()
        buffered = len(self.trailing_data[0])
        event = super().next_event()
        if isinstance(event, h11.Request):
            size = buffered - len(self.trailing_data[0])
            if size > self.max_head_bytes:
                raise h11.RemoteProtocolError(f"request head of {size} bytes is over max_header_bytes="
                                              f"{self.max_head_bytes}", error_status_hint=400)
        return event


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for each request's head, a HeadLimitedConnection, and a 400 that
    reaches a client still sending.

    uvicorn has no deadline: its keep-alive timer stops at the first byte, so a client that sends half a request
    line holds its connection (and one of `max_connections`) forever. The deadline runs from connecting,
    and from the end of each answer on a kept-alive connection, until the headers are complete.
    """

    def __init__(self, *args: Any, header_timeout_s: float, max_header_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = HeadLimitedConnection(max_header_bytes)
        self.header_timeout_s = header_timeout_s
        self.header_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None  # set once a bad request is answered

    def send_400_response(self, msg: str) -> None:
        """The 400, then our end of the connection; what the client still sends is read and dropped until it
        closes, for at most header_timeout_s. uvicorn closes at once instead, and a socket closed with unread
        data sends a reset that can destroy the 400 before a client still sending (a 1 MB header, a slow drip)
        reads it: the "lingering close" of web servers."""
        body = msg.encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body)),
                   (b"connection", b"close")]
        answer = [h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()]
        self.transport.write(b"".join(self.conn.send(event) or b"" for event in answer))
        self.transport.write_eof()
        self.linger_timer = self.loop.call_later(self.header_timeout_s, self.transport.close)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.linger_timer is not None:  # answered 400: the rest is dropped
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in (or the connection failed)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self.header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_too_slow(self) -> None:
        self.header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            where = "%s:%d" % self.client if self.client else "a client"
            log.warning("%s sent no complete request headers within header_timeout_s=%g s: connection closed",
                        where, self.header_timeout_s)
            self.transport.close()
