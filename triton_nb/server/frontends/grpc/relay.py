"""The gRPC relay: a small process that terminates gRPC and hands each call to the server.

Why a process: gRPC's Python server costs about 110 µs of CPU per call in its own machinery (HTTP/2,
completion-queue polling, the asyncio bridge), and in the server's process that time is spent
holding the one GIL the models need — measured, it halved throughput under load. In a process of
its own, that machinery runs on another core; the server receives finished request bytes over a
socket pair and answers with response bytes. Nothing else crosses: no tensors are copied twice,
no pickling, one read and one write per call.

This file runs as a script (``python relay.py --fd N ...``) and imports only ``grpc`` and the
standard library, so it starts in a fraction of a second without loading the package's models or
numerical libraries. It exits when the server asks it to (after answering what is in flight) or
when the socket closes (the server's process has gone).

The framing, shared with :class:`triton_nb.server.frontends.grpc.link.RelayLink`: every frame is a header
``<IIB`` (payload length, call id, kind) followed by the payload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import struct
import sys

HEADER = struct.Struct("<IIB")

# relay -> server
CALL = 1  # payload: method name (utf-8), b"\0", request bytes
STREAM_OPEN = 2  # payload: empty
STREAM_MESSAGE = 3  # payload: request bytes
STREAM_CLOSE = 4  # payload: empty (the client sent its last message)
LISTENING = 9  # payload: the bound port, "<I"
START_FAILED = 10  # payload: the reason (utf-8)
# server -> relay
REPLY = 0  # payload: response bytes
REPLY_ERROR = 11  # payload: status code name (utf-8), b"\0", details (utf-8)
STREAM_OUT = 6  # payload: response bytes
STREAM_END = 7  # payload: empty, or an error as in REPLY_ERROR
SHUTDOWN = 8  # payload: grace period in seconds, "<d"

# Each method's API group (Triton's names), for restricted APIs.
API_GROUP = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "ServerMetadata": "metadata",
    "ModelMetadata": "metadata", "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics", "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository", "RepositoryModelUnload": "model-repository", "LogSettings": "logging",
    "TraceSetting": "trace", "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
}
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"
SERVICE = "inference.GRPCInferenceService"
STREAM_METHOD = "ModelStreamInfer"
UNARY_METHODS = (
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer", "ModelConfig",
    "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload", "LogSettings",
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting",
)


# A stopping relay answers the calls still in flight at the end of its grace with this, then
# gives them _CUT_S more to be written before gRPC cancels whatever is left.
_STOPPED = b"UNAVAILABLE\0the server stopped before the request was answered"
_CUT_S = 1.0


def frame(kind: int, call_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), call_id, kind) + payload


class _Relay:
    def __init__(self, link: socket.socket, max_message_bytes: int,
                 restricted: dict[str, tuple[str, str]] | None = None) -> None:
        self._link = link
        self._restricted = restricted or {}
        self._max_message_bytes = max_message_bytes
        self._calls: dict[int, asyncio.Future] = {}
        self._streams: dict[int, asyncio.Queue] = {}
        self._next_id = 0
        self._writer: asyncio.StreamWriter | None = None
        self._server = None
        self._shutdown = asyncio.Event()
        self._stopping: asyncio.Future | None = None

    def _new_id(self) -> int:
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        return self._next_id

    async def run(self, address: str, port: int) -> None:
        import grpc

        reader, self._writer = await asyncio.open_connection(sock=self._link)
        options = [("grpc.max_receive_message_length", self._max_message_bytes),
                   ("grpc.max_send_message_length", self._max_message_bytes),
                   ("grpc.so_reuseport", 0)]  # a port that is taken must fail, not be shared
        server = grpc.aio.server(options=options)
        handlers = {name: grpc.unary_unary_rpc_method_handler(self._unary(name)) for name in UNARY_METHODS}
        handlers[STREAM_METHOD] = grpc.stream_stream_rpc_method_handler(self._stream)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        host = f"[{address}]" if ":" in address else address
        try:
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:
            bound, reason = 0, str(exc)
        else:
            reason = "the address is taken or cannot be bound"
        if bound == 0:
            self._writer.write(frame(START_FAILED, 0, f"cannot listen on {address}:{port}: {reason}".encode()))
            await self._writer.drain()
            return
        await server.start()
        self._server = server
        self._writer.write(frame(LISTENING, 0, struct.pack("<I", bound)))
        reading = asyncio.ensure_future(self._read(reader))
        await self._shutdown.wait()
        reading.cancel()
        await _settle_leftover_tasks()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                size, call_id, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
                payload = await reader.readexactly(size) if size else b""
                if kind in (REPLY, REPLY_ERROR):
                    future = self._calls.pop(call_id, None)
                    if future is not None and not future.done():
                        future.set_result((kind, payload))
                elif kind in (STREAM_OUT, STREAM_END):
                    queue = self._streams.get(call_id)
                    if queue is not None:
                        queue.put_nowait((kind, payload))
                elif kind == SHUTDOWN:
                    (grace,) = struct.unpack("<d", payload)
                    self._stopping = asyncio.ensure_future(self._stop(grace))
        except (asyncio.IncompleteReadError, ConnectionError):  # the server's process has gone
            await self._stop(0)

    async def _stop(self, grace: float) -> None:
        if self._server is not None:
            # new calls are refused at once; calls in flight have the grace to be answered
            stopping = asyncio.ensure_future(self._server.stop(grace + _CUT_S))
            done, _ = await asyncio.wait([stopping], timeout=grace)
            if not done:
                # what is left is answered here, saying why, before gRPC's own cut (its message,
                # "Cancelling all calls", says nothing of the server stopping)
                for future in self._calls.values():
                    if not future.done():
                        future.set_result((REPLY_ERROR, _STOPPED))
                for queue in self._streams.values():
                    queue.put_nowait((STREAM_END, _STOPPED))
            await stopping
        self._shutdown.set()

    async def _check_restricted(self, method: str, context) -> None:
        """A restricted API needs its metadata key with its value, or the call is refused here, at the
        edge, before it reaches the server."""
        import grpc

        rule = self._restricted.get(API_GROUP.get(method, ""))
        if rule is None:
            return
        # Triton's convention: the metadata key carries a prefix (real Triton's clients send it so);
        # the status is PERMISSION_DENIED, where Triton 2.51 answers UNAVAILABLE
        key = GRPC_RESTRICTED_PREFIX + rule[0]
        if dict(context.invocation_metadata() or ()).get(key) != rule[1]:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"This protocol is restricted, expecting header '{key}'")

    def _unary(self, method: str):
        import grpc

        name = method.encode()

        async def handle(request: bytes, context) -> bytes:
            await self._check_restricted(method, context)
            call_id = self._new_id()
            future = asyncio.get_running_loop().create_future()
            self._calls[call_id] = future
            self._writer.write(frame(CALL, call_id, name + b"\0" + request))
            try:
                kind, payload = await future
            finally:
                self._calls.pop(call_id, None)
            if kind == REPLY_ERROR:
                code, _, details = payload.partition(b"\0")
                await context.abort(grpc.StatusCode[code.decode()], details.decode("utf-8", errors="replace"))
            return payload

        return handle

    async def _stream(self, requests, context):
        import grpc

        await self._check_restricted(STREAM_METHOD, context)
        stream_id = self._new_id()
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[stream_id] = queue
        self._writer.write(frame(STREAM_OPEN, stream_id))

        async def forward() -> None:
            async for request in requests:
                self._writer.write(frame(STREAM_MESSAGE, stream_id, request))
            self._writer.write(frame(STREAM_CLOSE, stream_id))

        sending = asyncio.ensure_future(forward())
        try:
            while True:
                kind, payload = await queue.get()
                if kind == STREAM_OUT:
                    yield payload
                    continue
                if payload:
                    code, _, details = payload.partition(b"\0")
                    await context.abort(grpc.StatusCode[code.decode()], details.decode("utf-8", errors="replace"))
                return
        finally:
            sending.cancel()
            self._streams.pop(stream_id, None)


async def _settle_leftover_tasks() -> None:
    """Cancel and await what gRPC's stopped server left scheduled (a call's watcher that outlives
    its call), so that no cancelled task's traceback reaches the server's output as the loop closes:
    a stopped relay says nothing but that it stopped."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def quiet(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if isinstance(context.get("exception"), asyncio.CancelledError):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(quiet)
    leftover = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in leftover:
        task.cancel()
    await asyncio.gather(*leftover, return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="gRPC relay of a triton_nb server (started by the server)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-message-bytes", type=int, required=True)
    parser.add_argument("--restricted", default="{}", help="JSON: {api group: [metadata key, value]}")
    args = parser.parse_args(argv)
    # ^C in a terminal reaches the whole process group, and so does SIGTERM from a service manager
    # (systemd's default) or `kill -- -PGID`: the server decides when the relay stops (after
    # answering the calls in flight), so the relay itself ignores both. It still ends when the
    # server's process does, however that ends: its socket closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    link = socket.socket(fileno=args.fd)
    restricted = {group: (rule[0], rule[1]) for group, rule in json.loads(args.restricted).items()}
    relay = _Relay(link, args.max_message_bytes, restricted)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; the default loop also works
        runner = asyncio.run
    else:
        runner = uvloop.run
    runner(relay.run(args.address, args.port))


if __name__ == "__main__":
    sys.exit(main())
