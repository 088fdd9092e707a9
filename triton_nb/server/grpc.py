"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` over a server
(:class:`triton_nb.server.service.InferenceService`).

The servicer implements the service generated in ``tritonclient.grpc.service_pb2_grpc``. gRPC itself
is terminated by a relay process (:mod:`triton_nb.server.grpc_relay`, started by :class:`GrpcRelay`)
that passes each call's bytes over a socket pair to :class:`RelayLink`, on the front ends' event loop
(:mod:`triton_nb.server.network`): gRPC's own per-call machinery then runs on another core instead of
holding this process's GIL. Tensors arrive as
typed ``contents`` or as ``raw_input_contents`` (one raw buffer per input, in order); responses
always fill ``raw_output_contents`` for every output, in order, as Triton does. Status codes come
from :func:`triton_nb.errors.wire_status`, the same mapping the HTTP front end uses.
``ModelStreamInfer`` serves decoupled models (any number of responses per request) and answers
non-decoupled ones one response per request; errors in a stream travel as ``error_message`` and the
stream carries on, as in Triton.
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
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from triton_nb.errors import InvalidArgumentError, TritonNBError, UnavailableError, wire_status
from triton_nb.server import grpc_relay as relay
from triton_nb.server.protocol import (
    SERVER_EXTENSIONS,
    SERVER_NAME,
    LogSettings,
    WireLimits,
    array_from_buffer,
    array_from_values,
    array_to_buffer,
    check_shape,
    classify,
)
from triton_nb.server.types import InferRequest, InferResponse, numpy_to_triton_dtype

if TYPE_CHECKING:
    from triton_nb.server.service import InferenceService

__all__ = ["GrpcRelay", "GrpcServicer", "RelayLink"]

log = logging.getLogger(__name__)

# Typed contents field for each datatype; FP16 and BF16 have none and must come raw.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
_SERVER_PARAMETERS = ("priority", "timeout")


def _parameter(value: Any) -> Any:
    which = value.WhichOneof("parameter_choice")
    return None if which is None else getattr(value, which)


def _version_number(model: str, text: str) -> int:
    if not text:
        return -1
    if not text.isdigit():
        raise InvalidArgumentError(
            f"model '{model}': version '{text}' must be a whole number > 0 (or empty for the latest)")
    return int(text)


def _message(error: BaseException) -> str:
    return str(error) if isinstance(error, TritonNBError) else f"{type(error).__name__}: {error}"


class GrpcServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Every RPC of ``inference.GRPCInferenceService`` except shared memory and tracing."""

    def __init__(self, server: InferenceService, limits: WireLimits, log_settings: LogSettings) -> None:
        self._server = server
        self._limits = limits
        self._log_settings = log_settings

    async def _abort(self, context: grpc.aio.ServicerContext, error: BaseException) -> None:
        if not isinstance(error, TritonNBError):
            log.exception("gRPC call failed", exc_info=error)
        _, code = wire_status(error)
        await context.abort(grpc.StatusCode[code], _message(error))

    # ------------------------------------------------------------------ health and metadata
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._server.is_server_live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._server.is_server_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        try:
            version = _version_number(request.name, request.version)
        except TritonNBError as error:
            await self._abort(context, error)
        return pb.ModelReadyResponse(ready=self._server.is_model_ready(request.name, version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        from triton_nb._version import __version__

        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=SERVER_EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        try:
            metadata = self._server.model_metadata(request.name, _version_number(request.name, request.version))
        except Exception as error:
            await self._abort(context, error)
        return pb.ModelMetadataResponse(
            name=metadata["name"], versions=metadata["versions"], platform=metadata["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in metadata["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in metadata["outputs"]],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        try:
            config = self._server.model_config(request.name, _version_number(request.name, request.version))
        except Exception as error:
            await self._abort(context, error)
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any
                              ) -> pb.ModelStatisticsResponse:
        try:
            version = None if not request.version else _version_number(request.name, request.version)
            statistics = self._server.statistics(request.name or None, version)
        except Exception as error:
            await self._abort(context, error)
        return json_format.ParseDict(statistics, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # ------------------------------------------------------------------ repository
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        try:
            index = self._server.repository_index(ready_only=request.ready)
        except Exception as error:
            await self._abort(context, error)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**m) for m in index])

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: Any
                                  ) -> pb.RepositoryModelLoadResponse:
        name = request.model_name
        try:
            config = None
            files: dict[str, bytes] = {}
            for key, value in request.parameters.items():
                parameter = _parameter(value)
                if key == "config":
                    if not isinstance(parameter, str):
                        raise InvalidArgumentError(f"model '{name}': load parameter 'config' must be a string")
                    config = parameter
                elif key.startswith("file:"):
                    if not isinstance(parameter, bytes):
                        raise InvalidArgumentError(f"model '{name}': file override '{key}' must be bytes_param")
                    files[key] = parameter
            self._server.check_network_model_control(name, "load")
            loop = asyncio.get_running_loop()
            # loading runs a model's initialize(): seconds, so off the front ends' loop
            await loop.run_in_executor(None, lambda: self._server.load_model(name, config=config,
                                                                             files=files or None))
        except Exception as error:
            await self._abort(context, error)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: Any
                                    ) -> pb.RepositoryModelUnloadResponse:
        name = request.model_name
        try:
            dependents = request.parameters.get("unload_dependents")
            unload_dependents = bool(_parameter(dependents)) if dependents is not None else False
            self._server.check_network_model_control(name, "unload")
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: self._server.unload_model(
                name, unload_dependents=unload_dependents))
        except Exception as error:
            await self._abort(context, error)
        return pb.RepositoryModelUnloadResponse()

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        try:
            changes = {}
            for key, value in request.settings.items():
                which = value.WhichOneof("parameter_choice")
                if which is not None:
                    changes[key] = getattr(value, which)
            settings = self._log_settings.update(changes) if changes else self._log_settings.to_json()
        except Exception as error:
            await self._abort(context, error)
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = value
        return response

    # ------------------------------------------------------------------ inference
    def _decode(self, request: pb.ModelInferRequest, streaming: bool = False) -> tuple[InferRequest, dict[str, int]]:
        model = request.model_name
        version = _version_number(model, request.model_version)
        # the model first, as Triton: a request to an unknown model is NOT_FOUND whatever its inputs
        decoupled = self._server.input_config(model, version).model_transaction_policy.decoupled
        if decoupled and not streaming:
            raise InvalidArgumentError(
                f"model '{model}': ModelInfer RPC doesn't support models with decoupled transaction policy (use "
                f"ModelStreamInfer)")
        raw = request.raw_input_contents
        if raw and len(raw) != len(request.inputs):
            raise InvalidArgumentError(
                f"model '{model}': {len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one raw "
                f"buffer per input or none")
        arrays: dict[str, np.ndarray] = {}
        for index, tensor in enumerate(request.inputs):
            name = tensor.name
            if name in arrays:
                raise InvalidArgumentError(f"model '{model}': input '{name}' is given more than once")
            shape = check_shape(model, name, list(tensor.shape), self._limits)
            if raw:
                if tensor.HasField("contents"):
                    raise InvalidArgumentError(f"contents field must not be specified when using raw_input_contents "
                                               f"for '{name}' for model '{model}'")
                arrays[name] = array_from_buffer(model, name, tensor.datatype, shape, raw[index])
                continue
            field = _CONTENTS_FIELD.get(tensor.datatype)
            if field is None:
                if tensor.datatype in ("FP16", "BF16"):
                    raise InvalidArgumentError(f"model '{model}': input '{name}' is {tensor.datatype}, which has no "
                                               f"typed contents: send it in raw_input_contents")
                arrays[name] = array_from_values(model, name, tensor.datatype, shape, [])  # names the datatype
                continue
            arrays[name] = array_from_values(model, name, tensor.datatype, shape,
                                             list(getattr(tensor.contents, field)))
        parameters = {key: _parameter(value) for key, value in request.parameters.items()}
        priority = parameters.get("priority", 0)
        timeout = parameters.get("timeout", 0)
        for key, value in (("priority", priority), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"model '{model}': request parameter '{key}' must be a whole number >= 0")
        classes: dict[str, int] = {}
        requested = []
        for output in request.outputs:
            requested.append(output.name)
            if "classification" in output.parameters:
                classes[output.name] = _parameter(output.parameters["classification"])
        return InferRequest(
            model_name=model, model_version=version, inputs=arrays, requested_outputs=requested or None,
            request_id=request.id, priority=priority, timeout_microseconds=timeout,
            parameters={k: v for k, v in parameters.items() if k not in _SERVER_PARAMETERS},
        ), classes

    def _encode(self, response: InferResponse, classes: dict[str, int]) -> pb.ModelInferResponse:
        model = response.model_name
        message = pb.ModelInferResponse(model_name=model, model_version=str(response.model_version),
                                        id=response.request_id)
        batching = None
        for name, array in response.outputs.items():
            if name in classes:
                if batching is None:
                    batching = self._server.input_config(model, response.model_version).max_batch_size > 0
                array = classify(model, name, array, classes[name], batching,
                                 self._server.output_labels(model, name, response.model_version))
            message.outputs.add(name=name, datatype=numpy_to_triton_dtype(array.dtype), shape=array.shape)
            message.raw_output_contents.append(array_to_buffer(array))
        for key, value in response.parameters.items():
            _set_parameter(message.parameters[key], value)
        return message

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        try:
            infer_request, classes = self._decode(request)
            response = await asyncio.wrap_future(self._server.infer_async(infer_request))
            return self._encode(response, classes)
        except Exception as error:
            await self._abort(context, error)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        in_flight = 0

        def error_message(request: pb.ModelInferRequest, error: BaseException) -> pb.ModelStreamInferResponse:
            return pb.ModelStreamInferResponse(error_message=_message(error), infer_response=pb.ModelInferResponse(
                model_name=request.model_name, model_version=request.model_version, id=request.id))

        def finish(message: pb.ModelStreamInferResponse) -> None:
            nonlocal in_flight
            in_flight -= 1
            outbox.put_nowait(message)
            outbox.put_nowait(None)  # a wake-up: the writer checks whether the stream is done

        def start(request: pb.ModelInferRequest) -> None:
            nonlocal in_flight
            try:
                infer_request, classes = self._decode(request, streaming=True)
                config = self._server.input_config(infer_request.model_name, infer_request.model_version)
                decoupled = config.model_transaction_policy.decoupled
                want_empty_final = _parameter(request.parameters["triton_enable_empty_final_response"]) \
                    if "triton_enable_empty_final_response" in request.parameters else False
                if decoupled:
                    def sent(response: InferResponse | None, final: bool) -> None:
                        loop.call_soon_threadsafe(deliver, response, final)

                    def deliver(response: InferResponse | None, final: bool) -> None:
                        if response is not None and response.error is not None:
                            message = error_message(request, response.error)
                        elif response is not None:
                            message = pb.ModelStreamInferResponse(infer_response=self._encode(response, classes))
                            if want_empty_final:
                                message.infer_response.parameters["triton_final_response"].bool_param = final
                        elif final and want_empty_final:
                            message = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
                                model_name=request.model_name, model_version=request.model_version, id=request.id))
                            message.infer_response.parameters["triton_final_response"].bool_param = True
                        else:
                            message = None
                        if final:
                            finish(message) if message is not None else finish_quietly()
                        elif message is not None:
                            outbox.put_nowait(message)

                    infer_request.response_sender = sent
                future = self._server.infer_async(infer_request)
                in_flight += 1
            except Exception as error:
                outbox.put_nowait(error_message(request, error))
                return

            def done(finished: Any) -> None:
                error = None if finished.cancelled() else finished.exception()
                if finished.cancelled():
                    error = InvalidArgumentError("the request was cancelled")
                if error is not None:
                    loop.call_soon_threadsafe(finish, error_message(request, error))
                elif not decoupled:
                    try:
                        message = pb.ModelStreamInferResponse(infer_response=self._encode(finished.result(), classes))
                    except Exception as encode_error:
                        message = error_message(request, encode_error)
                    loop.call_soon_threadsafe(finish, message)

            future.add_done_callback(done)

        def finish_quietly() -> None:
            nonlocal in_flight
            in_flight -= 1
            outbox.put_nowait(None)

        reading = True

        async def read() -> None:
            nonlocal reading
            try:
                async for request in request_iterator:
                    start(request)
            finally:
                reading = False
                outbox.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                message = await outbox.get()
                if message is not None:
                    yield message
                elif not reading and in_flight == 0 and outbox.empty():
                    return
        finally:
            reader.cancel()


def _set_parameter(target: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


# ---------------------------------------------------------------------- the relay's server side


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
    """The server's end of the socket pair to the gRPC relay process (:mod:`grpc_relay`).

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
        self.send(kind, call_id, _error_payload(code, _message(error)))

    def _model_infer(self, call_id: int, data: bytes) -> None:
        servicer = self._servicer
        try:
            request = pb.ModelInferRequest.FromString(data)
            infer_request, classes = servicer._decode(request)
            future = self._server.infer_async(infer_request)
        except Exception as error:
            self._fail(relay.REPLY_ERROR, call_id, error)
            return

        def answer(finished: Any) -> None:  # on the model thread that finished the request
            try:
                if finished.cancelled():
                    raise InvalidArgumentError("the request was cancelled")
                payload = servicer._encode(finished.result(), classes).SerializeToString()
            except Exception as error:
                self._fail(relay.REPLY_ERROR, call_id, error)
                return
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


_BOOTSTRAP = ("import runpy, sys; del sys.path[0]; sys.argv = sys.argv[1:]; "
              "runpy.run_path(sys.argv[0], run_name='__main__')")


class GrpcRelay:
    """Starts the relay process and ends it; the link runs on the front ends' event loop."""

    def __init__(self, servicer: GrpcServicer, address: str, port: int, max_message_bytes: int,
                 startup_timeout_s: float = 60.0, restricted: dict[str, tuple[str, str]] | None = None) -> None:
        self._servicer = servicer
        ours, theirs = socket.socketpair()
        # Run as a file, without its folder on sys.path (its siblings grpc.py and http.py would
        # shadow the real packages) and without importing the package (fast start, no models).
        command = [sys.executable, "-c", _BOOTSTRAP, str(Path(relay.__file__)), "--fd", str(theirs.fileno()),
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
            header = _recv_exactly(self._socket, relay.HEADER.size)
            size, _, kind = relay.HEADER.unpack(header)
            payload = _recv_exactly(self._socket, size)
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


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError("the relay process exited")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
