"""The link between the HTTP application and the relay process that terminates HTTP.

HTTP's connections, parsing and writes run in a relay process (:mod:`triton_nb.server.frontends.http.relay`,
started by :class:`HttpRelay`), which passes each request whole over a socket pair to
:class:`HttpRelayLink`, on the front ends' event loop (:mod:`triton_nb.server.frontends.network`);
the link has the :class:`~triton_nb.server.frontends.http.app.HttpApp` answer it and writes the
answers back. Kept apart from the application: this is transport, the application is Triton's
protocol.
"""

from __future__ import annotations

import asyncio
import socket
from functools import partial
from pathlib import Path
from typing import Any

from triton_nb.errors import PayloadTooLargeError, UnavailableError
from triton_nb.server.frontends.http import relay
from triton_nb.server.frontends.http.app import HttpApp
from triton_nb.server.frontends.relay_process import FramedLink, RelayProcess

__all__ = ["HttpRelay", "HttpRelayLink"]

def _receiver(body: bytes, state: int, limit: int) -> Any:
    """The ASGI ``receive`` of a request the relay read whole (or stopped reading at the limit)."""

    async def receive() -> dict[str, Any]:
        if state == relay.BODY_OVER_LIMIT:  # the application's own words for a body over the limit
            raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


class HttpRelayLink(FramedLink):
    """The server's end of the socket pair to the HTTP relay process.

    A KServe v2 inference request, the hot path, is decoded and queued on the front ends' loop at
    once; its answer is encoded and written by the model thread that finishes it (see
    :class:`FramedLink`). Every other request runs :meth:`HttpApp.answer` as a task.
    """

    protocol = "HTTP"

    def __init__(self, app: HttpApp, link: socket.socket, max_request_bytes: int) -> None:
        super().__init__(link, app.service.infer_together)
        self._app = app
        self._limit = max_request_bytes
        self._tasks: set[asyncio.Task] = set()

    def _reply(self, request_id: int, answer: tuple[int, list[tuple[bytes, bytes]], bytes]) -> None:
        self.send(relay.REPLY, request_id, relay.encode_reply(*answer))

    def frames_received(self, frames: list[tuple[int, int, bytes]]) -> None:
        # The inference requests of one read go to the application together, which may decode
        # them together (HttpApp.begin_infer_burst); every other request runs as a task.
        app = self._app
        burst: list[tuple[int, str, str]] = []
        requests: list[tuple[str, str, dict[bytes, bytes], bytes]] = []
        for kind, request_id, payload in frames:
            if kind != relay.REQUEST:
                continue
            method, path, headers, body, state = relay.decode_request(payload)
            route = app.infer_route(method, path) if state == relay.BODY_WHOLE else None
            if route is None:
                task = asyncio.ensure_future(self._answer(request_id, method, path, headers, body, state))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                continue
            burst.append((request_id, method, path))
            requests.append((*route, dict(headers), body))
        if not requests:
            return
        for (request_id, method, path), call in zip(burst, app.begin_infer_burst(requests), strict=True):
            if isinstance(call, Exception):
                self._reply(request_id, app.error_answer(call, method, path))
            else:
                call.future.add_done_callback(partial(self._finished, request_id, method, path, call))

    def _finished(self, request_id: int, method: str, path: str, call: Any, _: Any) -> None:
        """Answer a finished request, on the model thread that finished it."""
        try:
            reply = call.reply()
        except Exception as error:
            self._reply(request_id, self._app.error_answer(error, method, path))
        else:
            self._reply(request_id, (reply.status, reply.headers, reply.body))

    async def _answer(self, request_id: int, method: str, path: str, headers: list[tuple[bytes, bytes]],
                      body: bytes, state: int) -> None:
        scope = {"type": "http", "method": method, "path": path, "headers": headers}
        self._reply(request_id, await self._app.answer(scope, _receiver(body, state, self._limit)))


class HttpRelay(RelayProcess):
    """Starts the relay process on a bound listening socket and ends it; the link runs on the
    front ends' event loop."""

    def __init__(self, app: HttpApp, listener: socket.socket, *, max_request_bytes: int, read_timeout_s: float,
                 keep_alive_s: float, exit_timeout_s: float, grace_s: float, startup_timeout_s: float = 60.0) -> None:
        self._app = app
        self._max_request_bytes = max_request_bytes
        super().__init__(str(Path(relay.__file__)),
                         ["--listen-fd", str(listener.fileno()), "--max-request-bytes", str(max_request_bytes),
                          "--read-timeout-s", repr(read_timeout_s), "--keep-alive-s", repr(keep_alive_s),
                          "--exit-timeout-s", repr(exit_timeout_s), "--grace-s", repr(grace_s)],
                         protocol="HTTP", pass_fds=[listener.fileno()])
        kind, _ = self.first_frame(startup_timeout_s)
        if kind != relay.READY:
            self.kill()
            raise UnavailableError(f"the HTTP front end did not start: the relay sent frame kind {kind}")
        self.link: HttpRelayLink | None = None

    async def connect(self) -> HttpRelayLink:  # type: ignore[override]
        """Serve the link on the running loop (the front ends')."""
        self.link = await super().connect(lambda sock: HttpRelayLink(self._app, sock, self._max_request_bytes))
        return self.link

    def begin_stop(self) -> None:
        """Ask the relay to take no new connections and end once the requests in flight are
        answered. Called on the front ends' loop, which owns the link's writes."""
        if self.link is not None:
            self.link.send(relay.SHUTDOWN, 0)
