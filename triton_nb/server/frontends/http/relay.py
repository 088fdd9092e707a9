"""The HTTP relay: a small process that terminates HTTP and hands each request to the server.

Why a process: measured on the fraud ensemble over HTTP, the server's one interpreter spent about
a third of its time on HTTP itself (httptools' callbacks, uvicorn's request cycle, one socket
write per answer) while the second core idled; that work needs none of the models. Here it runs
in a process of its own, as the gRPC relay (:mod:`triton_nb.server.frontends.grpc.relay`) runs gRPC's. The
server gets each request whole (method, path, headers, body) over a socket pair and answers with
status, headers and body; everything Triton's protocol means (routes, JSON, binary tensors,
errors) stays in the server's :class:`~triton_nb.server.frontends.http.app.HttpApp`, so both ways answer alike.
Each frame is written to the server as soon as it is ready, never gathered per loop turn: the server
starts on the first requests of a burst while this process still reads the rest.

The connections are served as before: uvicorn with
:class:`~triton_nb.server.frontends.http.connections.GuardedHttpProtocol` (read deadlines, keep-alive, head
limit), swept about once a second. The listening socket is bound by the server (so a port that is
taken fails its start, in its words) and handed over as a file descriptor.

This file runs as a script (``python relay.py --fd N --listen-fd M ...``) and loads only the
standard library, orjson, uvicorn and :mod:`connections` (by its path), so it starts without the
package's models and numerical libraries. It ends when the server asks (after answering what is in
flight, within the grace it is given) or when the socket pair closes (the server has gone).

The framing, shared with :class:`triton_nb.server.frontends.http.link.HttpRelayLink`: every frame is a
header ``<IIB`` (payload length, request id, kind) followed by the payload.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import math
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<IIB")
# relay -> server
REQUEST = 1  # payload: _REQUEST_HEAD (head length, body state), the head, the body
# server -> relay
REPLY = 2  # payload: _REPLY_HEAD (status, headers length), the headers, the body
SHUTDOWN = 3  # payload: empty (answer what is in flight, within the grace given at start, then end)
# relay -> server, once
READY = 4  # payload: empty (uvicorn serves the listening socket)

# A request head: method, path and the headers' names and values, one a line (none can hold a
# newline: httptools refuses one in a head).
_REQUEST_HEAD = struct.Struct("<IB")
_REPLY_HEAD = struct.Struct("<HI")
#: How a request's body arrived.
BODY_WHOLE, BODY_OVER_LIMIT, BODY_NOT_READ = 0, 1, 2
_STOPPED = b'{"error":"the server stopped before the request was answered"}'


def frame(kind: int, request_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), request_id, kind) + payload


def encode_request(method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes, state: int) -> bytes:
    head = b"\n".join([method.encode("latin-1"), path.encode("utf-8", "surrogateescape"),
                       *(part for pair in headers for part in pair)])
    return _REQUEST_HEAD.pack(len(head), state) + head + body


def decode_request(payload: bytes) -> tuple[str, str, list[tuple[bytes, bytes]], bytes, int]:
    """``(method, path, headers, body, body state)`` of a request frame's payload."""
    size, state = _REQUEST_HEAD.unpack_from(payload)
    start = _REQUEST_HEAD.size
    parts = payload[start:start + size].split(b"\n")
    headers = list(zip(parts[2::2], parts[3::2], strict=True))
    return (parts[0].decode("latin-1"), parts[1].decode("utf-8", "surrogateescape"), headers,
            payload[start + size:], state)


def encode_reply(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    head = b"\n".join(part for pair in headers for part in pair)
    return _REPLY_HEAD.pack(status, len(head)) + head + body


def decode_reply(payload: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    status, size = _REPLY_HEAD.unpack_from(payload)
    start = _REPLY_HEAD.size
    head = payload[start:start + size]
    parts = head.split(b"\n") if head else []
    return status, list(zip(parts[0::2], parts[1::2], strict=True)), payload[start + size:]


class _Link(asyncio.Protocol):
    """The relay's end of the socket pair: requests out, replies in."""

    def __init__(self, relay: _Relay) -> None:
        self._relay = relay
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def write(self, data: bytes) -> None:
        # At once, not gathered per loop turn: with the frames of a turn gathered, 16 clients' requests
        # reached the server as one burst it served alone while this process waited; written one by
        # one, the two processes overlap. Fraud twin over HTTP, alternated against the in-process
        # front end, 2026-12-07: gathered 0.99x at 16 in flight and 1.06x at 32; at once 1.17x and 1.26x.
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset = 0
        while len(buffer) - offset >= HEADER.size:
            size, request_id, kind = HEADER.unpack_from(buffer, offset)
            end = offset + HEADER.size + size
            if len(buffer) < end:
                break
            self._relay.received(kind, request_id, bytes(buffer[offset + HEADER.size:end]))
            offset = end
        del buffer[:offset]


class _Relay:
    """The ASGI application uvicorn serves here: every request goes to the server, whole."""

    def __init__(self, max_request_bytes: int, exit_timeout_s: float) -> None:
        self._max_request_bytes = max_request_bytes
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self.link: _Link | None = None
        self.server: Any = None
        self.stop_began: float | None = None
        self.exit_timeout_s = exit_timeout_s

    def received(self, kind: int, request_id: int, payload: bytes) -> None:
        if kind == REPLY:
            future = self._pending.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(payload)
        elif kind == SHUTDOWN:
            self.stop_began = asyncio.get_running_loop().time()
            self.server.should_exit = True

    async def _body(self, scope: dict[str, Any], receive: Any) -> tuple[bytes, int] | None:
        """The body, or None when the client left before it arrived. The body limit is the
        server's to enforce (it names it in its error); here it only stops the buffering."""
        limit = self._max_request_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return b"", BODY_NOT_READ  # refused by the server from the declared length
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return b"", BODY_OVER_LIMIT
            chunks.append(chunk)
            if not message.get("more_body", False):
                return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), BODY_WHOLE

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        got = await self._body(scope, receive)
        if got is None or self.link is None:
            return
        body, state = got
        self._next_id = request_id = (self._next_id + 1) & 0xFFFFFFFF
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self.link.write(frame(REQUEST, request_id,
                              encode_request(scope["method"], scope["path"], scope["headers"], body, state)))
        try:
            status, headers, body = decode_reply(await future)
        except asyncio.CancelledError:
            # uvicorn cancels when a stop outlasts its grace: answer 503, as the server would
            self._pending.pop(request_id, None)
            status, headers, body = 503, [(b"content-type", b"application/json")], _STOPPED
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _load_sibling(name: str) -> Any:
    """A module of this folder by its path: importing the package would load the models' libraries."""
    spec = importlib.util.spec_from_file_location(f"_triton_nb_relay_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


async def _sweep(relay: _Relay, server: Any, serving: asyncio.Future, sweep_connections: Any,
                 period_s: float) -> None:
    loop = asyncio.get_running_loop()
    while not serving.done():
        await asyncio.sleep(period_s)
        cutoff = None if relay.stop_began is None else relay.stop_began + relay.exit_timeout_s
        sweep_connections(server.server_state.connections, loop.time(), cutoff)


async def _run(args: argparse.Namespace) -> None:
    import uvicorn

    protocol = _load_sibling("connections")
    relay = _Relay(args.max_request_bytes, args.exit_timeout_s)
    loop = asyncio.get_running_loop()
    pair = socket.socket(fileno=args.fd)
    _, relay.link = await loop.connect_accepted_socket(lambda: _Link(relay), sock=pair)
    listener = socket.socket(fileno=args.listen_fd)
    listener.setblocking(False)
    config = uvicorn.Config(
        relay, lifespan="off", log_config=None, access_log=False,
        http=functools.partial(protocol.GuardedHttpProtocol, read_timeout_s=args.read_timeout_s),
        timeout_keep_alive=args.keep_alive_s,  # type: ignore[arg-type] # a float works
        timeout_graceful_shutdown=math.ceil(args.grace_s),
    )
    relay.server = server = uvicorn.Server(config)
    # the server's process decides when this one stops (a Ctrl-C reaches both): uvicorn's own
    # signal handlers stay out
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    # READY goes first, before uvicorn takes a connection: the server bound the port before this
    # process started, so a client (a readiness probe) may be waiting already, and its request's
    # frame must not reach the server ahead of READY. Should serving fail, this process ends and
    # the server sees its link close.
    relay.link.write(frame(READY, 0))
    serving = asyncio.ensure_future(server.serve(sockets=[listener]))
    period = max(0.05, min(1.0, args.read_timeout_s / 4, args.keep_alive_s / 4, args.exit_timeout_s / 4))
    sweeper = asyncio.ensure_future(_sweep(relay, server, serving, protocol.sweep_connections, period))
    await asyncio.wait([serving, relay.link.closed], return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():  # the server's process has gone: nobody can answer
        server.should_exit = True
        server.force_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(serving), 5)
    sweeper.cancel()
    # requests cancelled at the end of the grace answer 503 as they unwind: let them write it
    leftovers = list(server.server_state.tasks)
    if leftovers:
        await asyncio.wait(leftovers, timeout=1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="HTTP relay of a triton_nb server (started by the server)")
    parser.add_argument("--fd", type=int, required=True, help="the socket pair's end")
    parser.add_argument("--listen-fd", type=int, required=True, help="the bound, listening socket")
    parser.add_argument("--max-request-bytes", type=int, required=True)
    parser.add_argument("--read-timeout-s", type=float, required=True)
    parser.add_argument("--keep-alive-s", type=float, required=True)
    parser.add_argument("--exit-timeout-s", type=float, required=True)
    parser.add_argument("--grace-s", type=float, required=True, help="uvicorn's graceful shutdown")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(_run(args))
    else:
        uvloop.run(_run(args))
    sys.exit(0)


if __name__ == "__main__":
    main()
