"""pb_utils' requests and responses: :class:`InferenceRequest` (what ``execute()`` receives, and
the BLS request a model builds to call another model: ``exec()``, ``exec(decoupled=True)``,
``async_exec()``), :class:`InferenceResponse`, :class:`InferenceResponseSender` and
:class:`ResponseIterator`.

Part of the surface :mod:`triton_nb.backends.pb_utils` exposes. The server side of these classes
(wrapping the server's requests, reading what a model answered) is
:mod:`triton_nb.backends._pb_bridge`.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from triton_nb.backends._pb_context import CallContext, require_server
from triton_nb.backends._pb_errors import TritonError, TritonModelException, triton_error_from_exception
from triton_nb.backends._pb_tensor import Tensor
from triton_nb.tensors import InferRequest, InferResponse

if TYPE_CHECKING:
    from concurrent.futures import Future

    from triton_nb.backends.base import ServerHandle

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "Forward",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "PreferredMemory",
    "ResponseIterator",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# --------------------------------------------------------------------------- responses


def _parameters_json(parameters: Any, what: str) -> str:
    """``parameters`` as the JSON string Triton keeps (python_backend's ``PyParametersToJSON``):
    a dict of str keys and bool, int or str values; anything else is refused in Triton's words,
    with the offending parameter named."""
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(f"{what}: expect parameters to be a dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)} "
                                       f"(parameter {key!r})")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type "
                                       f"{type(value)} (parameter '{key}')")
    return json.dumps(parameters)


def _bls_parameters(parameters: dict[str, Any] | None) -> str:
    """A BLS response's parameters as python_backend's request executor writes them: compact JSON
    (TritonJson) of the int, bool and str parameters; another type is an error (raised)."""
    for key, value in (parameters or {}).items():
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Unsupported parameter type for parameter '{key}'.")
    return json.dumps(parameters or {}, separators=(",", ":"), ensure_ascii=False)


#: How a request the server handed to ``execute()`` passes a decoupled model's responses on:
#: ``forward(response, final)``, called by its :class:`InferenceResponseSender` from whichever
#: thread the model sends on (``response`` is None for a final flag without a response).
Forward = Callable[["InferenceResponse | None", bool], None]


def _cannot_forward(response: InferenceResponse | None, final: bool) -> None:
    raise TritonModelException("this request cannot send responses")


class InferenceResponse:
    """The answer to one request: output tensors, or a :class:`TritonError`."""

    def __init__(self, output_tensors: Any = None, error: TritonError | None = None, parameters: Any = None) -> None:
        tensors = [] if output_tensors is None else output_tensors
        if isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
            raise TypeError("InferenceResponse: output_tensors must be a list of pb_utils.Tensor")
        tensors = list(tensors)
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    f"InferenceResponse: output_tensors must hold pb_utils.Tensor, got {type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse: error must be a pb_utils.TritonError, got {type(error).__name__}")
        self._tensors = tensors
        self._error = error
        self._parameters = _parameters_json(parameters, "InferenceResponse")

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON string, as in Triton."""
        return self._parameters

    @classmethod
    def _from_server(cls, response: InferResponse) -> InferenceResponse:
        """A BLS answer: the server's response as the model sees it."""
        error = triton_error_from_exception(response.error) if response.error is not None else None
        if error is not None:  # python_backend reads no parameters of a failed response
            return cls(error=error)
        try:
            parameters = _bls_parameters(response.parameters)
        except TritonModelException as exc:  # as python_backend: the whole response becomes the error
            return cls(error=TritonError(str(exc)))
        out = cls([Tensor._wrap(name, array) for name, array in response.outputs.items()])
        out._parameters = parameters
        return out

    @classmethod
    def _failed(cls, exc: BaseException) -> InferenceResponse:
        return cls(error=triton_error_from_exception(exc))

    def __repr__(self) -> str:
        if self._error is not None:
            return f"InferenceResponse(error={self._error!r})"
        return f"InferenceResponse(output_tensors={[t.name() for t in self._tensors]})"


class InferenceResponseSender:
    """Sends the responses of one request: ``send(response, flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)``.

    Decoupled models send any number of responses and then the final flag; a model in the
    default mode may send its single response this way instead of returning it (Triton 24.06).
    """

    def __init__(self, request: InferenceRequest, decoupled: bool) -> None:
        self._request = request
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0
        self._response: InferenceResponse | None = None  # the default mode's single response

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Unable to send response. Expected a pb_utils.InferenceResponse, got {type(response).__name__}"
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and final and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                        "response."
                    )
            if response is not None:
                self._sent += 1
            if final:
                self._closed = True
            if not self._decoupled:
                if response is not None:
                    self._response = response
                return
            forward = self._request._forward
        forward(response, final)

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()

    def _close(self) -> bool:
        """Close without sending; True if it was still open."""
        with self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open


# --------------------------------------------------------------------------- requests

_REQUIRED: Any = object()
_RESERVED_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout"})


class InferenceTrace:
    """Triton's trace handle; triton_nb does not trace requests."""

    def get_context(self) -> str | None:
        return None


class PreferredMemory:
    """Where BLS outputs should go; accepted for compatibility, everything stays in CPU memory."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceRequest:
    """An inference request: the ones ``execute()`` receives, and the BLS requests a model sends.

    BLS: ``pb_utils.InferenceRequest(model_name="other", inputs=[...], requested_output_names=[...])``
    then ``exec()`` (blocking; an :class:`InferenceResponse`), ``exec(decoupled=True)`` (an
    iterator of responses) or ``await async_exec()``. ``timeout`` is in microseconds.
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Any = _REQUIRED,
        requested_output_names: Any = _REQUIRED,
        model_name: str = _REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        missing = [
            name for name, value in (("inputs", inputs), ("requested_output_names", requested_output_names),
                                     ("model_name", model_name)) if value is _REQUIRED
        ]
        if missing:
            raise TypeError(f"InferenceRequest(): missing required argument(s): {', '.join(missing)}")
        if not isinstance(correlation_id, (int, str)) or isinstance(correlation_id, bool):
            raise TritonModelException("Correlation ID must be integer or string")
        tensors = list(inputs)
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    f"InferenceRequest(): inputs must be pb_utils.Tensor objects, got {type(tensor).__name__}"
                )
        self._inputs = tensors
        self._request_id = str(request_id)
        self._correlation_id = correlation_id
        self._requested_output_names = [str(name) for name in requested_output_names]
        self._model_name = str(model_name)
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._parameters = _parameters_json(parameters, "InferenceRequest")
        self._preferred_memory = preferred_memory
        self._trace = trace or InferenceTrace()
        self._server_request: InferRequest | None = None
        self._decoupled = False
        self._sender: InferenceResponseSender | None = None
        self._forward: Forward = _cannot_forward
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _from_server(cls, request: InferRequest, *, decoupled: bool, output_names: list[str],
                     forward: Forward | None = None) -> InferenceRequest:
        """Wrap a request the server hands to ``execute()`` (inputs are not copied); ``forward``
        passes a decoupled model's responses on (None: the request cannot send any)."""
        self = cls.__new__(cls)
        # (every request of every Python-model batch passes here: only what differs per request is
        # set; the fields no served request changes at first are the class's defaults below)
        inputs = self._inputs = [Tensor._wrap(name, array) for name, array in request.inputs.items()]
        self._inputs_by_name = {tensor._name: tensor for tensor in inputs}  # inputs never change here
        self._request_id = request.request_id
        self._requested_output_names = list(request.requested_outputs or output_names)
        self._model_name = request.model_name
        self._model_version = request.model_version
        self._timeout = request.timeout_microseconds
        params = request.parameters
        if params:
            sequence_id = params.get("sequence_id", 0)
            self._correlation_id = sequence_id if isinstance(sequence_id, (int, str)) else 0
            flags = 0
            if params.get("sequence_start"):
                flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            if params.get("sequence_end"):
                flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
            self._flags = flags
            user = {k: v for k, v in params.items() if k not in _RESERVED_PARAMETERS}
            self._parameters = json.dumps(user, default=str) if user else "{}"
        self._server_request = request
        self._decoupled = decoupled
        if forward is not None:
            self._forward = forward
        return self

    # what a served request starts with (``_from_server`` sets only what differs)
    _correlation_id: int | str = 0
    _flags = 0
    _parameters = "{}"
    _preferred_memory: PreferredMemory | None = None
    _trace = InferenceTrace()  # stateless: one serves every request
    _sender: InferenceResponseSender | None = None
    _forward: Forward = staticmethod(_cannot_forward)  # type: ignore[assignment]
    _release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    # -- what execute() reads ----------------------------------------------------------
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON string (``json.loads`` it), as in Triton."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        return self._trace

    def is_cancelled(self) -> bool:
        request = self._server_request
        if request is None:
            return False
        flag = getattr(request, "is_cancelled", None)
        if callable(flag):
            return bool(flag())
        return bool(getattr(request, "cancelled", False))

    def get_response_sender(self) -> InferenceResponseSender:
        if self._server_request is None:
            raise TritonModelException(
                "get_response_sender(): only the requests passed to execute() have a response sender"
            )
        if self._sender is None:
            self._sender = InferenceResponseSender(self, self._decoupled)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "request rescheduling (iterative sequence batching) is not supported by triton_nb"
            )
        self._release_flags = int(flags)

    # -- BLS -----------------------------------------------------------------------------
    def _to_server_request(self) -> InferRequest:
        try:
            parameters: dict[str, Any] = json.loads(self._parameters)
        except (TypeError, ValueError):
            parameters = {}
        if self._correlation_id:
            parameters["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = True
        return InferRequest(
            model_name=self._model_name,
            inputs={tensor.name(): tensor._server_array() for tensor in self._inputs},
            model_version=self._model_version,
            requested_outputs=list(self._requested_output_names) or None,
            request_id=self._request_id,
            parameters=parameters,
            timeout_microseconds=self._timeout,
        )

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on ``model_name`` and wait: a response, or (decoupled) an iterator of them.

        Failures of the called model come back as a response with an error, as in Triton.
        """
        context = require_server("InferenceRequest.exec()")
        return self._exec(context, decoupled)

    def _exec(self, context: CallContext, decoupled: bool) -> InferenceResponse | ResponseIterator:
        server = context.server
        assert server is not None
        if decoupled:
            return ResponseIterator._start(server, self._to_server_request())
        try:
            response = server.infer(self._to_server_request())
        except Exception as exc:
            return InferenceResponse._failed(exc)
        if response is None:
            return InferenceResponse(error=TritonError(
                f"model '{self._model_name}' is decoupled: call exec(decoupled=True)", TritonError.INVALID_ARG))
        return InferenceResponse._from_server(response)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """``await request.async_exec()``: like :meth:`exec` without blocking the event loop."""
        context = require_server("InferenceRequest.async_exec()")
        loop = asyncio.get_running_loop()
        if decoupled:
            return loop.run_in_executor(None, self._exec, context, True)
        server = context.server
        assert server is not None
        try:
            future = asyncio.wrap_future(server.infer_async(self._to_server_request()), loop=loop)
        except Exception as exc:
            done = loop.create_future()
            done.set_result(InferenceResponse._failed(exc))
            return done
        return asyncio.ensure_future(_await_response(future, self._model_name), loop=loop)

    def __repr__(self) -> str:
        return (f"InferenceRequest(model_name={self._model_name!r}, request_id={self._request_id!r}, "
                f"inputs={[t.name() for t in self._inputs]})")


async def _await_response(future: asyncio.Future[Any], model_name: str) -> InferenceResponse:
    try:
        response = await future
    except Exception as exc:
        return InferenceResponse._failed(exc)
    if response is None:
        return InferenceResponse(error=TritonError(
            f"model '{model_name}' is decoupled: call async_exec(decoupled=True)", TritonError.INVALID_ARG))
    return InferenceResponse._from_server(response)


class ResponseIterator:
    """The responses of a decoupled BLS request, as they arrive; the last one carries the final flag
    (it may have no output tensors). Iterating again after the end replays the responses."""

    def __init__(self) -> None:
        self._server: ServerHandle | None = None
        self._request: InferRequest | None = None
        self._queue: queue.SimpleQueue[InferenceResponse | None] = queue.SimpleQueue()
        self._responses: list[InferenceResponse] = []
        self._finished = False
        self._index = 0
        self._final_seen = False
        self._lock = threading.Lock()

    @classmethod
    def _start(cls, server: ServerHandle, request: InferRequest) -> ResponseIterator:
        iterator = cls()
        iterator._server, iterator._request = server, request
        request.response_sender = iterator._receive
        try:
            future = server.infer_async(request)
        except Exception as exc:
            iterator._finish_with(InferenceResponse._failed(exc))
            return iterator
        future.add_done_callback(iterator._on_done)
        return iterator

    def _receive(self, response: InferResponse | None, final: bool) -> None:
        with self._lock:
            if self._final_seen:
                return
            self._final_seen = final
        if response is not None:
            converted = InferenceResponse._from_server(response)
        else:  # a final flag alone: python_backend's empty last response, with no parameters at all
            converted = InferenceResponse()
            converted._parameters = ""
        self._queue.put(converted)
        if final:
            self._queue.put(None)

    def _finish_with(self, response: InferenceResponse) -> None:
        with self._lock:
            if self._final_seen:
                return
            self._final_seen = True
        self._queue.put(response)
        self._queue.put(None)

    def _on_done(self, future: Future[Any]) -> None:
        exc = future.exception()
        if exc is not None:
            self._finish_with(InferenceResponse._failed(exc))
            return
        result = future.result()
        if isinstance(result, InferResponse):  # the model answered without streaming
            self._finish_with(InferenceResponse._from_server(result))

    def __iter__(self) -> ResponseIterator:
        if self._finished and self._index >= len(self._responses):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._finished:
            if self._index < len(self._responses):
                self._index += 1
                return self._responses[self._index - 1]
            raise StopIteration
        item = self._queue.get()
        if item is None:  # end marker after the final response
            self._finished = True
            self._index = len(self._responses)
            raise StopIteration
        self._responses.append(item)
        return item

    def cancel(self) -> None:
        """Cancel the BLS request (Triton 2.57): the called model's ``request.is_cancelled()``
        turns true, and it decides how to end, usually with a final response carrying a
        ``TritonError.CANCELLED`` error, which ends this iteration as any final response does.
        Nothing happens once the final response has come (python_backend's ``Cancel``)."""
        with self._lock:
            if self._final_seen or self._request is None:
                return
            request = self._request
        request.cancelled = True
        # a model in a process of its own: its server proxy passes the cancellation on
        cancel = getattr(self._server, "cancel_request", None)
        if cancel is not None:
            cancel(request)

