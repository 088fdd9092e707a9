"""The connections of the HTTP front end: uvicorn's httptools protocol with the read limits
uvicorn lacks.

Why a subclass of its own: uvicorn closes a connection only when it idles *after* a response, and
httptools buffers a request head whole with no limit. A client that connects and sends nothing, one
that trickles a head or body a few bytes at a time (slowloris), or one that sends an endless head
would each hold a connection, and this process's memory, forever; in a notebook kernel that is the
user's kernel. uvicorn offers no hook for these limits, so :class:`GuardedHttpProtocol` adds them at
the protocol level, where the bytes arrive, and :func:`sweep_connections` (run by
:mod:`triton_nb.server.frontends.network` about once a second) reads their clocks. The ASGI application
(:mod:`triton_nb.server.frontends.http.app`) never sees any of this.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["MAX_HEAD_BYTES", "GuardedHttpProtocol", "sweep_connections"]

log = logging.getLogger(__name__)

# The largest request head (request line and headers) a client may send. httptools buffers a head
# whole and sets no limit of its own, so without one a client could grow this process's memory
# without end; tritonclient's heads are a few hundred bytes, and nginx stops at 8 to 32 KiB.
MAX_HEAD_BYTES = 64 * 1024

_STATUS_TEXT = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the read limits uvicorn lacks.

    uvicorn closes a connection only when it idles *after* a response. A connection that never
    sends a request, a request head or body trickled a few bytes at a time (slowloris), and a head
    of any size (httptools buffers it whole) would each hold a connection, and memory, forever.
    Here:

    * a request, head and body, must arrive whole within ``read_timeout_s`` of its first byte: a
      deadline for the whole request, not for a pause between bytes, since a slowloris client never
      pauses for long. Otherwise it is answered 408 and the connection closed; the application,
      which may be waiting for the body, sees the client disconnect. Time during which the server
      itself holds reading back (a pipelined request waiting its turn, a large body not yet
      consumed) is not counted against the client;
    * a connection idle before its first request (or sending only blank lines between requests)
      is closed after the keep-alive timeout, as uvicorn closes one idle after a response;
    * a head over ``max_head_bytes`` is answered 431 and the connection closed.

    The clocks are read by :func:`sweep_connections` about once a second rather than by a timer
    per request, so the hot path only notes the time a request began.
    """

    def __init__(self, *args: Any, read_timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timeout_s = read_timeout_s
        self._max_head_bytes = max_head_bytes
        self._request_since: float | None = None  # a request is arriving (from its first byte)
        self._idle_since: float | None = None  # waiting for a request
        self._in_body = False  # between the end of a head and the end of its body
        self._heads = 0  # heads begun on this connection
        self._head_bytes = 0  # bytes of the head arriving, counted a whole read at a time

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self._idle_since = self.loop.time()

    def data_received(self, data: bytes) -> None:
        heads = self._heads
        in_head = self._request_since is not None and not self._in_body
        super().data_received(data)
        # a read that found a head arriving and left the same head arriving was head from end to
        # end; reads in which a head begins or ends are not counted (a read is at most 256 KiB)
        if in_head and heads == self._heads and self._request_since is not None and not self._in_body:
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head_bytes and not self.transport.is_closing():
                self._refuse(431, f"the request head is over the limit of {self._max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._heads += 1
        self._head_bytes = 0
        self._request_since = self.loop.time()
        self._idle_since = None

    def on_headers_complete(self) -> None:
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._request_since = None
        self._in_body = False
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete and not self.pipeline:
            self._idle_since = self.loop.time()  # answered before its body ended (a GET with a body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._request_since is None and not self.pipeline:
            self._idle_since = self.loop.time()

    def check_clocks(self, now: float, cutoff: float | None = None) -> None:
        """Close the connection if its request is overdue or it has idled too long; a request
        still arriving at ``cutoff`` (a stopping server's) is overdue whatever its own deadline."""
        if self.transport is None or self.transport.is_closing():
            return
        if self._request_since is not None:
            if cutoff is not None and now > cutoff:
                self._refuse(408, "the request had not arrived when the server stopped")
            elif self.flow.read_paused:  # the server holds reading back: not the client's delay
                self._request_since = now
            elif now - self._request_since > self._read_timeout_s:
                self._refuse(408, f"the request did not arrive within {self._read_timeout_s:g} s "
                                  f"(http_read_timeout_secs)")
        elif self._idle_since is not None and now - self._idle_since > self.timeout_keep_alive:
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` if no response is under way on this connection, then close it."""
        log.debug("HTTP client %s: %s; closing the connection", self.client, message)
        self._request_since = self._idle_since = None
        cycle = self.cycle
        if self._in_body:  # this request's application runs; it may not have answered yet
            free = cycle is not None and not cycle.response_started
        else:  # a head arriving; an earlier response may still be under way (pipelining)
            free = cycle is None or cycle.response_complete
        if free:
            body = orjson.dumps({"error": message})
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (status, _STATUS_TEXT[status], len(body), body))
        self.transport.close()  # the application, if it waits for the body, sees the client disconnect


def sweep_connections(connections: Iterable[object], now: float, cutoff: float | None = None) -> None:
    """Check the clocks of a uvicorn server's connections (``server.server_state.connections``)."""
    for connection in list(connections):
        if isinstance(connection, GuardedHttpProtocol):
            connection.check_clocks(now, cutoff)
