"""The link between the gRPC servicer and the relay process that terminates gRPC.

gRPC's own per-call machinery runs in a relay process (:mod:`triton_nb.server.frontends.grpc.relay`,
started by :class:`GrpcRelay`), which passes each call's bytes over a socket pair to
:class:`RelayLink`, on the front ends' event loop (:mod:`triton_nb.server.frontends.network`); the link hands
them to the :class:`~triton_nb.server.frontends.grpc.servicer.GrpcServicer` and writes its answers back. Kept apart
from the servicer: this is transport, the servicer is Triton's protocol.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from triton_nb._sockets import SCRIPT_BOOTSTRAP, recv_exactly
from triton_nb.errors import InvalidArgumentError, TritonNBError, UnavailableError, wire_message, wire_status
from triton_nb.server.frontends.grpc import relay
from triton_nb.server.frontends.grpc.servicer import GrpcServicer

__all__ = ["GrpcRelay", "RelayLink"]

log = logging.getLogger(__name__)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _RelayContext:
    """What the servicer's methods use of a ``grpc.aio.ServicerContext``, for calls that arrive
    through the relay."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Abort(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:  # the generated base class's UNIMPLEMENTED
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


def _error_payload(code_name: str, details: str) -> bytes:
    return code_name.encode() + b"\0" + details.encode("utf-8", errors="replace")


class RelayLink(asyncio.Protocol):
    """The server's end of the socket pair to the gRPC relay process (:mod:`relay`).

    Frames are read on the front ends' event loop. ``ModelInfer``, the hot path, is decoded there
    and queued; its answer is encoded and written by the model thread that finishes it, through a
    blocking duplicate of the socket under a lock — no hop back to the loop, whose thread would have
    to win the GIL once more per call. The other calls run the servicer's coroutines as tasks.
    """

    def __init__(self, servicer: GrpcServicer, link: socket.socket) -> None:
        self._servicer = servicer
        self._server = servicer._server
        self._writer = link.dup()
        self._writer.setblocking(True)
        self._write_lock = threading.Lock()
        self._buffer = bytearray()
        self._streams: dict[int, asyncio.Queue] = {}
        self._tasks: set[asyncio.Task] = set()
        self.closed: asyncio.Future | None = None

    # ------------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.closed = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: BaseException | None) -> None:
        for queue in self._streams.values():
            queue.put_nowait(None)
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)
        with self._write_lock:
            self._writer.close()

    def send(self, kind: int, call_id: int, payload: bytes = b"") -> None:
        """Write one frame; safe from any thread."""
        data = relay.frame(kind, call_id, payload)
        with self._write_lock:
            try:
                self._writer.sendall(data)
            except OSError:  # the relay has gone: its clients see the connection drop
                log.debug("gRPC relay gone; answer to call %d dropped", call_id)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset = 0
        header = relay.HEADER
        while len(buffer) - offset >= header.size:
            size, call_id, kind = header.unpack_from(buffer, offset)
            end = offset + header.size + size
            if len(buffer) < end:
                break
            payload = bytes(buffer[offset + header.size:end])
            offset = end
            self._frame(kind, call_id, payload)
        del buffer[:offset]

    # ------------------------------------------------------------------ calls
    def _frame(self, kind: int, call_id: int, payload: bytes) -> None:
        if kind == relay.CALL:
            method, _, request = payload.partition(b"\0")
            if method == b"ModelInfer":
                self._model_infer(call_id, request)
            else:
                self._spawn(self._unary(call_id, method.decode(), request))
        elif kind == relay.STREAM_OPEN:
            queue: asyncio.Queue = asyncio.Queue()
            self._streams[call_id] = queue
            self._spawn(self._stream(call_id, queue))
        elif kind == relay.STREAM_MESSAGE:
            queue = self._streams.get(call_id)
            if queue is not None:
                queue.put_nowait(pb.ModelInferRequest.FromString(payload))
        elif kind == relay.STREAM_CLOSE:
            queue = self._streams.get(call_id)
            if queue is not None:
                queue.put_nowait(None)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fail(self, kind: int, call_id: int, error: BaseException) -> None:
        if isinstance(error, _Abort):
            self.send(kind, call_id, _error_payload(error.code.name, error.details))
            return
        if not isinstance(error, TritonNBError):
            log.exception("gRPC call failed", exc_info=error)
        _, code = wire_status(error)
        self.send(kind, call_id, _error_payload(code, wire_message(error)))

    def _model_infer(self, call_id: int, data: bytes) -> None:
        servicer = self._servicer
        lease = None
        try:
            decoded = servicer._decode(pb.ModelInferRequest.FromString(data))
            lease, classes = decoded.lease, decoded.classes
            future = self._server.infer_async(decoded.request)
        except Exception as error:
            if lease is not None:
                lease.release()
            self._fail(relay.REPLY_ERROR, call_id, error)
            return

        def answer(finished: Any) -> None:  # on the model thread that finished the request
            try:
                if finished.cancelled():
                    raise InvalidArgumentError("the request was cancelled")
                payload = servicer._encode(finished.result(), classes, lease).SerializeToString()
            except Exception as error:
                self._fail(relay.REPLY_ERROR, call_id, error)
                return
            finally:
                if lease is not None:  # the outputs are in their regions (or failed to be)
                    lease.release()
            self.send(relay.REPLY, call_id, payload)

        future.add_done_callback(answer)

    async def _unary(self, call_id: int, method: str, data: bytes) -> None:
        handler = getattr(type(self._servicer), method, None)
        base = getattr(service_pb2_grpc.GRPCInferenceServiceServicer, method, None)
        if handler is None or handler is base:
            self.send(relay.REPLY_ERROR, call_id, _error_payload("UNIMPLEMENTED", f"{method} is not supported"))
            return
        try:
            request_type = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name[method].input_type
            request = _message_class(request_type).FromString(data)
            response = await handler(self._servicer, request, _RelayContext())
        except Exception as error:
            self._fail(relay.REPLY_ERROR, call_id, error)
            return
        self.send(relay.REPLY, call_id, response.SerializeToString())

    async def _stream(self, call_id: int, queue: asyncio.Queue) -> None:
        async def requests() -> AsyncIterator[pb.ModelInferRequest]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        try:
            async for message in self._servicer.ModelStreamInfer(requests(), _RelayContext()):
                self.send(relay.STREAM_OUT, call_id, message.SerializeToString())
        except Exception as error:
            self._fail(relay.STREAM_END, call_id, error)
        else:
            self.send(relay.STREAM_END, call_id)
        finally:
            self._streams.pop(call_id, None)


def _message_class(descriptor: Any) -> Any:
    return getattr(pb, descriptor.name)


class GrpcRelay:
    """Starts the relay process and ends it; the link runs on the front ends' event loop."""

    def __init__(self, servicer: GrpcServicer, address: str, port: int, max_message_bytes: int,
                 startup_timeout_s: float = 60.0, restricted: dict[str, tuple[str, str]] | None = None) -> None:
        self._servicer = servicer
        ours, theirs = socket.socketpair()
        # Run as a file, without its folder on sys.path (no module beside it may shadow a real
        # package) and without importing the package (fast start, no models).
        command = [sys.executable, "-c", SCRIPT_BOOTSTRAP, str(Path(relay.__file__)), "--fd", str(theirs.fileno()),
                   "--address", address, "--port", str(port), "--max-message-bytes", str(max_message_bytes),
                   "--restricted", json.dumps(restricted or {})]
        try:
            self.process = subprocess.Popen(command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._socket = ours
        try:
            self.port = self._await_listening(startup_timeout_s)
        except BaseException:
            self.kill()
            raise
        self.link: RelayLink | None = None

    def _await_listening(self, timeout_s: float) -> int:
        self._socket.settimeout(timeout_s)
        try:
            header = recv_exactly(self._socket, relay.HEADER.size)
            size, _, kind = relay.HEADER.unpack(header)
            payload = recv_exactly(self._socket, size)
        except (OSError, EOFError) as exc:
            raise UnavailableError(f"the gRPC front end did not start: {exc or 'the relay process exited'}") from None
        finally:
            self._socket.settimeout(None)
        if kind == relay.START_FAILED:
            raise UnavailableError(f"gRPC service {payload.decode(errors='replace')}")
        (port,) = struct.unpack("<I", payload)
        return port

    async def connect(self) -> RelayLink:
        """Serve the link on the running loop (the front ends')."""
        self._socket.setblocking(False)
        _, link = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: RelayLink(self._servicer, self._socket), sock=self._socket)
        self.link = link
        return link

    def begin_stop(self, grace_s: float) -> None:
        """Ask the relay to refuse new calls and end once the calls in flight are answered."""
        if self.link is not None:
            self.link.send(relay.SHUTDOWN, 0, struct.pack("<d", grace_s))

    def wait(self, timeout_s: float) -> bool:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._socket.close()

