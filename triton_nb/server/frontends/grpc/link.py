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
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from triton_nb.errors import InvalidArgumentError, TritonNBError, UnavailableError, wire_message, wire_status
from triton_nb.server.frontends.grpc import relay
from triton_nb.server.frontends.grpc.servicer import GrpcServicer, StartedInfer
from triton_nb.server.frontends.relay_process import FramedLink, RelayProcess

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


class RelayLink(FramedLink):
    """The server's end of the socket pair to the gRPC relay process (:mod:`relay`).

    ``ModelInfer``, the hot path, is decoded on the front ends' loop and queued; its answer is
    encoded and written by the model thread that finishes it (see :class:`FramedLink`). The other
    calls run the servicer's coroutines as tasks.
    """

    protocol = "gRPC"

    def __init__(self, servicer: GrpcServicer, link: socket.socket) -> None:
        super().__init__(link, servicer.service.infer_together)
        self._servicer = servicer
        self._streams: dict[int, asyncio.Queue] = {}
        self._tasks: set[asyncio.Task] = set()

    def connection_lost(self, exc: BaseException | None) -> None:
        for queue in self._streams.values():
            queue.put_nowait(None)
        super().connection_lost(exc)

    # ------------------------------------------------------------------ calls
    def frames_received(self, frames: list[tuple[int, int, bytes]]) -> None:
        # The ModelInfer calls of one read go to the servicer together, which may decode them
        # together (GrpcServicer.start_infer_burst); every other frame is taken in order.
        calls: list[int] = []
        messages: list[pb.ModelInferRequest] = []
        for kind, call_id, payload in frames:
            if kind == relay.CALL and payload.startswith(b"ModelInfer\0"):
                try:
                    messages.append(pb.ModelInferRequest.FromString(payload[len(b"ModelInfer\0"):]))
                except Exception as error:  # not a ModelInferRequest: answered at once
                    self._fail(relay.REPLY_ERROR, call_id, error)
                    continue
                calls.append(call_id)
            else:
                self.frame_received(kind, call_id, payload)
        if messages:
            for call_id, started in zip(calls, self._servicer.start_infer_burst(messages), strict=True):
                if isinstance(started, Exception):
                    self._fail(relay.REPLY_ERROR, call_id, started)
                else:
                    started.future.add_done_callback(partial(self._answer, call_id, started))

    def frame_received(self, kind: int, call_id: int, payload: bytes) -> None:
        if kind == relay.CALL:
            method, _, request = payload.partition(b"\0")
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

    def _answer(self, call_id: int, started: StartedInfer, finished: Any) -> None:
        """Answer a finished ``ModelInfer`` call, on the model thread that finished it."""
        try:
            if finished.cancelled():
                raise InvalidArgumentError("the request was cancelled")
            payload = self._servicer.encode_infer(finished.result(), started.classes,
                                                  started.lease).SerializeToString()
        except Exception as error:
            self._fail(relay.REPLY_ERROR, call_id, error)
            return
        finally:
            if started.lease is not None:  # the outputs are in their regions (or failed to be)
                started.lease.release()
        self.send(relay.REPLY, call_id, payload)

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


class GrpcRelay(RelayProcess):
    """Starts the relay process and ends it; the link runs on the front ends' event loop."""

    def __init__(self, servicer: GrpcServicer, address: str, port: int, max_message_bytes: int,
                 startup_timeout_s: float = 60.0, restricted: dict[str, tuple[str, str]] | None = None) -> None:
        self._servicer = servicer
        super().__init__(str(Path(relay.__file__)),
                         ["--address", address, "--port", str(port), "--max-message-bytes", str(max_message_bytes),
                          "--restricted", json.dumps(restricted or {})], protocol="gRPC")
        kind, payload = self.first_frame(startup_timeout_s)
        if kind != relay.LISTENING:
            self.kill()
            raise UnavailableError(f"gRPC service {payload.decode(errors='replace')}")
        (self.port,) = struct.unpack("<I", payload)
        self.link: RelayLink | None = None

    async def connect(self) -> RelayLink:  # type: ignore[override]
        """Serve the link on the running loop (the front ends')."""
        self.link = await super().connect(lambda sock: RelayLink(self._servicer, sock))
        return self.link

    def begin_stop(self, grace_s: float) -> None:
        """Ask the relay to refuse new calls and end once the calls in flight are answered."""
        if self.link is not None:
            self.link.send(relay.SHUTDOWN, 0, struct.pack("<d", grace_s))
