"""triton_nb's ``triton_python_backend_utils``: the module a Triton Python-backend ``model.py`` imports.

A ``model.py`` written for NVIDIA Triton's Python backend does ``import triton_python_backend_utils
as pb_utils``; :mod:`triton_nb.backends.python` makes that name resolve to this module, so the
model runs unchanged, in-process (no stub process, no shared memory). Everything here follows
the real module's names, signatures and semantics (its pure-Python part and the classes Triton's
stub binds into it in C++):

* :class:`Tensor` — name + numpy array; ``triton_dtype()`` is Triton's numeric type code
  (``TRITONSERVER_DataType``: FP32 is 11, BYTES is 13), as the real module returns it. BYTES
  tensors are object arrays (of ``bytes``, or of ``str`` which go out UTF-8 encoded) or ``bytes_``
  arrays; a unicode (``<U``) array is refused, as in Triton. ``to_dlpack``/``from_dlpack``
  use numpy's DLPack support (CPU only; BYTES cannot go through DLPack).
* :class:`InferenceRequest` — what ``execute()`` receives, and the BLS request a model builds
  to call another model (``exec()``, ``exec(decoupled=True)``, ``async_exec()``).
* :class:`InferenceResponse`, :class:`TritonError` (with Triton's error codes),
  :class:`TritonModelException`, :class:`Logger`, :class:`ModelConfig` (auto-complete), the
  ``get_*_by_name`` helpers, the type helpers, ``serialize_byte_tensor`` /
  ``deserialize_bytes_tensor`` and the ``TRITONSERVER_*`` constants.
* :class:`MetricFamily` / :class:`Metric` — custom counters, gauges and histograms, exported on the
  server's ``/metrics`` as Triton exports them (see :mod:`triton_nb.server.metrics` for scopes and
  lifetime); :func:`load_model` / :func:`unload_model` — the model loading API, in explicit model
  control mode only, with Triton's errors.

How a BLS request finds its server
----------------------------------
A model builds ``pb_utils.InferenceRequest(model_name=...)`` with no reference to any server,
and several triton_nb servers may live in one process. The Python backend therefore runs every
call into model code (``initialize``, ``execute``, ``finalize``, ``auto_complete_config``)
inside :func:`_calling`, which sets the context variable :data:`_CURRENT` to the calling
instance's :class:`_CallContext` (its server handle, model name and logger). ``exec()`` reads
it. Context variables are per thread and per asyncio task (copied into tasks the model
creates), so concurrent instances of different servers never see each other's context.
Threads a model starts itself begin with an empty context; for them, the backend registers
the globals of the model's modules (:func:`_register_owner`) and the lookup walks the
caller's stack to the nearest frame running model code. ``Logger`` and ``get_model_dir`` use
the same lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import json
import logging
import queue
import struct
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from triton_nb.errors import InternalError, InvalidArgumentError, NotFoundError, TritonNBError, UnavailableError
from triton_nb.tensors import InferRequest, InferResponse

if TYPE_CHECKING:
    from concurrent.futures import Future

    from triton_nb.backends.base import ServerHandle

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "LogLevel",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

# --------------------------------------------------------------------------- constants

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    """Where BLS outputs should be placed; everything is CPU memory here."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU

# Triton's TRITONSERVER_DataType codes; BF16 (14) has no numpy type.
_TYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.bool_): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.uint16): 3,
    np.dtype(np.uint32): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.int8): 6,
    np.dtype(np.int16): 7,
    np.dtype(np.int32): 8,
    np.dtype(np.int64): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float32): 11,
    np.dtype(np.float64): 12,
    np.dtype(np.object_): 13,
}
_BYTES = 13
_CODE_TYPES: dict[int, type] = {code: dtype.type for dtype, code in _TYPE_CODES.items()}

TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


# --------------------------------------------------------------------------- errors


class TritonModelException(Exception):
    """The exception model code raises (and Triton raises into model code) on failure."""

    def message(self) -> str:
        return str(self)


class _ErrorCode(enum.IntEnum):
    # TRITONSERVER_Error_Code, in Triton's order.
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """The error of one response: ``TritonError("message", TritonError.NOT_FOUND)``.

    Like Triton's, this is a value carried by an :class:`InferenceResponse`, not an exception
    (raise :class:`TritonModelException` to fail a whole batch).
    """

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = _ErrorCode.INTERNAL) -> None:
        if message is None:
            raise TypeError("TritonError: message must be a string, not None")
        try:
            self._code = _ErrorCode(int(code))
        except (TypeError, ValueError):
            raise TypeError(f"TritonError: unknown error code {code!r}") from None
        self._message = str(message)

    def message(self) -> str:
        return self._message

    def code(self) -> _ErrorCode:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, TritonError.{self._code.name})"


# TritonError codes <-> triton_nb's error classes (the server maps those onto HTTP/gRPC).
_CODE_TO_ERROR: dict[int, type[TritonNBError]] = {
    _ErrorCode.INVALID_ARG: InvalidArgumentError,
    _ErrorCode.NOT_FOUND: NotFoundError,
    _ErrorCode.UNAVAILABLE: UnavailableError,
}
_GRPC_TO_CODE = {
    "INVALID_ARGUMENT": _ErrorCode.INVALID_ARG,
    "NOT_FOUND": _ErrorCode.NOT_FOUND,
    "UNAVAILABLE": _ErrorCode.UNAVAILABLE,
    "UNIMPLEMENTED": _ErrorCode.UNSUPPORTED,
    "ALREADY_EXISTS": _ErrorCode.ALREADY_EXISTS,
    "CANCELLED": _ErrorCode.CANCELLED,
    "INTERNAL": _ErrorCode.INTERNAL,
}


def _error_class(code: int) -> type[TritonNBError]:
    return _CODE_TO_ERROR.get(code, InternalError)


def _triton_error_from_exception(exc: BaseException) -> TritonError:
    code = _GRPC_TO_CODE.get(getattr(exc, "grpc_code", ""), _ErrorCode.INTERNAL)
    if isinstance(exc, TimeoutError):
        code = _ErrorCode.UNAVAILABLE
    return TritonError(str(exc) or type(exc).__name__, code)


# --------------------------------------------------------------------------- the calling instance


@dataclass(frozen=True)
class _CallContext:
    """The model instance that model code runs for: what BLS, Logger and get_model_dir need."""

    model_name: str
    model_version: int
    server: ServerHandle | None
    logger: logging.Logger
    model_dir: str  # the folder of model.py, as pb_utils.get_model_dir() returns it
    instance_name: str = ""  # "<group name>_<index>", as Triton names the instance ("" if not told)


_CURRENT: contextvars.ContextVar[_CallContext | None] = contextvars.ContextVar("triton_nb_pb_utils_call", default=None)

# id(module globals) -> (weak reference to the module, context), for threads a model starts.
_OWNERS: dict[int, tuple[weakref.ref[ModuleType], _CallContext]] = {}
_OWNERS_LOCK = threading.Lock()
_ROOT_LOGGER = logging.getLogger("triton_nb.python_backend")


@contextlib.contextmanager
def _calling(context: _CallContext) -> Iterator[None]:
    """Run model code on behalf of ``context`` (set around every call into a model)."""
    token = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _register_owner(module: ModuleType, context: _CallContext) -> None:
    """Code defined in ``module`` runs for ``context`` (found by walking a thread's stack)."""
    with _OWNERS_LOCK:
        _OWNERS[id(module.__dict__)] = (weakref.ref(module), context)


def _unregister_owner(module: ModuleType) -> None:
    with _OWNERS_LOCK:
        entry = _OWNERS.get(id(module.__dict__))
        if entry is not None and entry[0]() is module:
            del _OWNERS[id(module.__dict__)]


def _current_context() -> _CallContext | None:
    context = _CURRENT.get()
    if context is not None:
        return context
    if not _OWNERS:
        return None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        entry = _OWNERS.get(id(frame.f_globals))
        if entry is not None:
            module = entry[0]()
            if module is not None and module.__dict__ is frame.f_globals:
                return entry[1]
        frame = frame.f_back
    return None


def _require_server(what: str) -> _CallContext:
    context = _current_context()
    if context is None or context.server is None:
        where = f"model '{context.model_name}'" if context is not None else "this code"
        raise TritonModelException(
            f"{what}: no triton_nb server is reachable from {where}; BLS requests can be sent only from a "
            "Python model's execute() (or threads it starts) while it is served by a triton_nb server"
        )
    return context


def get_model_dir() -> str:
    """The folder holding the calling model's ``model.py`` (its version folder), as in Triton."""
    context = _current_context()
    if context is None:
        raise TritonModelException("get_model_dir(): not called from a model served by triton_nb")
    return context.model_dir


# --------------------------------------------------------------------------- tensors


def _type_code(dtype: np.dtype) -> int | None:
    code = _TYPE_CODES.get(dtype)
    if code is None and dtype.kind == "S":
        return _BYTES
    return code


def _bytes_item(value: Any) -> bytes:
    # As Triton serialises a BYTES tensor: bytes stay as they are, anything else becomes str(x) in UTF-8.
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


def _as_bytes_array(array: np.ndarray) -> np.ndarray:
    """The object array of ``bytes`` a BYTES tensor is on the server side (same shape)."""
    if array.dtype == np.object_ and all(type(item) is bytes for item in array.flat):
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)  # a view: out is C-contiguous
    for index, item in enumerate(array.flat):
        flat[index] = _bytes_item(item.item() if isinstance(item, np.generic) else item)
    return out


class _CapsuleHolder:
    """Lets numpy import a bare DLPack capsule (numpy only takes objects with ``__dlpack__``)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU; a capsule of device memory makes numpy refuse it


class Tensor:
    """A named tensor: ``pb_utils.Tensor("OUTPUT0", numpy_array)``."""

    __slots__ = ("_array", "_dtype", "_name")

    def __init__(self, name: str, numpy_array: Any) -> None:
        if not isinstance(name, str) or not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        code = _type_code(array.dtype)
        if code is None:
            hint = " Use an object array (np.object_) of str or bytes for strings." if array.dtype.kind == "U" else ""
            raise TritonModelException(
                f"Tensor '{name}': NumPy dtype {array.dtype} is not supported by the Python backend.{hint}"
            )
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # as Triton does
        self._name = name
        self._array = array
        self._dtype = code

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray) -> Tensor:
        """An input tensor around a server array, without checks or copies."""
        tensor = cls.__new__(cls)
        tensor._name = name
        if array.dtype.kind in "SU":
            array = _as_bytes_array(array)
        tensor._array = array
        tensor._dtype = _type_code(array.dtype) or _BYTES
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        """Triton's ``TRITONSERVER_DataType`` code (FP32 is 11, BYTES is 13)."""
        return self._dtype

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        return True

    def _server_array(self) -> np.ndarray:
        """The array as the server carries it: BYTES as an object array of ``bytes``."""
        return _as_bytes_array(self._array) if self._dtype == _BYTES else self._array

    # -- DLPack ------------------------------------------------------------------------
    def _dlpack_source(self) -> np.ndarray:
        if self._dtype == _BYTES:
            raise TritonModelException(f"Tensor '{self._name}': DLPack does not support string (BYTES) tensors.")
        # numpy refuses to export read-only arrays through the legacy protocol; hand out a copy.
        return self._array if self._array.flags.writeable else self._array.copy()

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this tensor's memory (a copy for read-only arrays)."""
        return self._dlpack_source().__dlpack__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._dlpack_source().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A Tensor from a DLPack capsule or an object with ``__dlpack__`` (CPU memory only)."""
        source = dlpack_tensor if hasattr(dlpack_tensor, "__dlpack__") else _CapsuleHolder(dlpack_tensor)
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}'): {exc} (triton_nb takes CPU tensors only)"
            ) from None
        if not array.flags.c_contiguous:
            raise TritonModelException(f"Tensor.from_dlpack('{name}'): the DLPack tensor must be C-contiguous")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, dtype={self._array.dtype}, shape={self.shape()})"


# --------------------------------------------------------------------------- responses


def _parameters_json(parameters: Any, what: str) -> str:
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(f"{what}: parameters must be a dict, got {type(parameters).__name__}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key).__name__}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value).__name__}"
            )
    return json.dumps(parameters)


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
        error = _triton_error_from_exception(response.error) if response.error is not None else None
        tensors = [Tensor._wrap(name, array) for name, array in response.outputs.items()] if error is None else []
        out = cls(tensors, error)
        parameters = {k: v for k, v in (response.parameters or {}).items() if isinstance(v, (bool, int, str))}
        out._parameters = json.dumps(parameters)
        return out

    @classmethod
    def _failed(cls, exc: BaseException) -> InferenceResponse:
        return cls(error=_triton_error_from_exception(exc))

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
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _from_server(cls, request: InferRequest, *, decoupled: bool, output_names: list[str]) -> InferenceRequest:
        """Wrap a request the server hands to ``execute()`` (inputs are not copied)."""
        self = cls.__new__(cls)
        params = request.parameters or {}
        self._inputs = [Tensor._wrap(name, array) for name, array in request.inputs.items()]
        self._inputs_by_name = {tensor._name: tensor for tensor in self._inputs}  # inputs never change here
        self._request_id = request.request_id
        sequence_id = params.get("sequence_id", 0)
        self._correlation_id = sequence_id if isinstance(sequence_id, (int, str)) else 0
        self._requested_output_names = list(request.requested_outputs or output_names)
        self._model_name = request.model_name
        self._model_version = request.model_version
        flags = 0
        if params.get("sequence_start"):
            flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        if params.get("sequence_end"):
            flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        self._flags = flags
        self._timeout = request.timeout_microseconds
        user = {k: v for k, v in params.items() if k not in _RESERVED_PARAMETERS} if params else None
        self._parameters = json.dumps(user, default=str) if user else "{}"
        self._preferred_memory = None
        self._trace = InferenceTrace()
        self._server_request = request
        self._decoupled = decoupled
        self._sender = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return self

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

    # Set by the Python backend: converts a pb_utils response and hands it to the server.
    def _forward(self, response: InferenceResponse | None, final: bool) -> None:  # pragma: no cover - replaced
        raise TritonModelException("this request cannot send responses")

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
        context = _require_server("InferenceRequest.exec()")
        return self._exec(context, decoupled)

    def _exec(self, context: _CallContext, decoupled: bool) -> InferenceResponse | ResponseIterator:
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
        context = _require_server("InferenceRequest.async_exec()")
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
        self._queue: queue.SimpleQueue[InferenceResponse | None] = queue.SimpleQueue()
        self._responses: list[InferenceResponse] = []
        self._finished = False
        self._index = 0
        self._final_seen = False
        self._lock = threading.Lock()

    @classmethod
    def _start(cls, server: ServerHandle, request: InferRequest) -> ResponseIterator:
        iterator = cls()
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
        converted = InferenceResponse._from_server(response) if response is not None else InferenceResponse()
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
        """Accepted for compatibility; triton_nb cannot cancel a running request."""


# --------------------------------------------------------------------------- lookups


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    # A request the server handed over knows its inputs by name: a model reading its 14 inputs
    # one by one would otherwise scan them 14 times (196 name() calls per request).
    by_name = getattr(inference_request, "_inputs_by_name", None)
    if by_name is not None:
        return by_name.get(name)
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of ``model_config["input"]`` named ``name`` (``model_config`` is the parsed JSON)."""
    for properties in model_config.get("input", []):
        if properties.get("name") == name:
            return properties
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("output", []):
        if properties.get("name") == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# --------------------------------------------------------------------------- types and bytes


def triton_string_to_numpy(triton_type_string: str) -> type:
    """``"TYPE_FP32"`` -> ``np.float32``; ``"TYPE_STRING"`` -> ``np.object_``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type | None:
    """Triton's type code (11) -> numpy type (``np.float32``); None for codes without one."""
    return _CODE_TYPES.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or type -> Triton's type code; None when Triton has none."""
    try:
        return _type_code(np.dtype(data_type))
    except TypeError:
        return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """Triton's BYTES wire form: each element as a 4-byte little-endian length, then its bytes, in C order.

    Object arrays (``bytes`` kept as they are, anything else as ``str`` in UTF-8), ``bytes_`` and
    unicode arrays are accepted; other dtypes give None, as in Triton.
    """
    array = np.asarray(input_tensor)
    if array.size == 0:
        return b""
    if array.dtype.kind not in "OSU":
        return None
    parts = []
    for item in array.flat:
        data = _bytes_item(item.item() if isinstance(item, np.generic) else item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of ``bytes``."""
    buffer = memoryview(encoded_tensor).cast("B") if not isinstance(encoded_tensor, bytes) else encoded_tensor
    items = []
    offset = 0
    size = len(buffer)
    while offset < size:
        if offset + 4 > size:
            raise TritonModelException("Invalid bytes tensor data: incomplete length field")
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        if offset + length > size:
            raise TritonModelException("Invalid bytes tensor data: string extends beyond buffer")
        items.append(bytes(buffer[offset:offset + length]))
        offset += length
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


# --------------------------------------------------------------------------- logging


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LOGGING_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


def _model_logger() -> logging.Logger:
    context = _current_context()
    return context.logger if context is not None else _ROOT_LOGGER


class Logger:
    """``pb_utils.Logger.log_info("...")``: messages go to Python logging, logger
    ``triton_nb.python_backend.<model>`` (VERBOSE is DEBUG)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        _model_logger().log(_LOGGING_LEVELS.get(LogLevel(int(level)), logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _model_logger().info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _model_logger().warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _model_logger().error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _model_logger().debug("%s", message)


# --------------------------------------------------------------------------- model control


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    context = _require_server("is_model_ready()")
    assert context.server is not None
    return bool(context.server.is_model_ready(model_name, int(model_version) if model_version else -1))


# Triton core's refusal in every mode but explicit (ModelRepositoryManager::LoadUnloadModel says
# "polling" for mode none too).
_NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


def _control_error(context: _CallContext, verb: str, message: str) -> TritonModelException:
    # the stub's prefix, then the backend's own around what the server said (python_be.cc's
    # ProcessMessage names the instance)
    instance = context.instance_name or f"{context.model_name}_0"
    return TritonModelException(
        f"Failed to {verb} model: Failed to process the request for model '{instance}', message: {message}")


def _model_control(what: str) -> tuple[_CallContext, ServerHandle]:
    context = _require_server(f"{what}()")
    server = context.server
    assert server is not None
    if getattr(server, "model_control_mode", None) != "explicit":
        raise _control_error(context, "load" if what == "load_model" else "unload", _NOT_EXPLICIT)
    return context, server


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` on the server running the calling model, as Triton's
    ``pb_utils.load_model``: only in explicit model control mode; ``config`` is a JSON model
    config overriding ``config.pbtxt`` ("" for none); ``files`` maps ``"file:<version>/<name>"``
    to the file's bytes (a config is then required). The server's error comes back as a
    :class:`TritonModelException` ``"Failed to load model: Failed to process the request for
    model '<instance>', message: <message>"``, as Triton words it."""
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents")
    contents: dict[str, bytes] = {}
    for path, content in (files or {}).items():
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise TritonModelException(
                f"failed to load model '{model_name}': the content of file {path!r} must be bytes, "
                f"not {type(content).__name__}")
        contents[str(path)] = bytes(content)
    context, server = _model_control("load_model")
    try:
        server.load_model(model_name, config=config or None, files=contents or None)
    except TritonNBError as exc:
        raise _control_error(context, "load", str(exc)) from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload every version of ``model_name`` (and, with ``unload_dependents``, the ensembles
    that use it), as Triton's ``pb_utils.unload_model``: only in explicit model control mode.
    A model must not unload itself from its own ``execute()``: the unload waits for it."""
    context, server = _model_control("unload_model")
    try:
        server.unload_model(model_name, unload_dependents=bool(unload_dependents))
    except TritonNBError as exc:
        raise _control_error(context, "unload", str(exc)) from None


# --------------------------------------------------------------------------- custom metrics
# Families and series live in triton_nb.server.metrics.CUSTOM_METRICS (one registry per process,
# as Triton's): a Metric created while a served model's code runs (initialize, execute, finalize,
# or a thread it started) belongs to that model's server and version, is exported on that server's
# /metrics and goes when the version unloads; one created outside any model (a notebook cell, a
# module's top level at import) is exported by every server of the process and lives as long as
# its Metric object. A process instance (python_process) sends its metrics to its server, which exports them.


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _metric_owner() -> tuple[object, str, int] | None:
    """(server scope, model, version) of the calling model; None outside a served model."""
    context = _current_context()
    if context is None or context.server is None:
        return None
    scope = getattr(getattr(context.server, "stats", None), "custom_scope", None)
    return None if scope is None else (scope, context.model_name, context.model_version)


class Metric:
    """One labelled series of a :class:`MetricFamily`, exported on ``/metrics`` (Triton's
    ``pb_utils.Metric``: ``increment``, ``set``, ``observe``, ``value``, with Triton's errors)."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        from triton_nb.server.metrics import CUSTOM_METRICS, CustomMetricError

        self.labels = dict(labels)
        try:
            self._handle = CUSTOM_METRICS.metric(family._registered, self.labels, buckets, _metric_owner())
        except CustomMetricError as exc:
            raise TritonModelException(f"Error when creating Metric: {exc}") from None
        family._handles.add(self._handle)  # no reference to the family: its deletion clears this metric

    def _run(self, what: str, operation: Any, *args: float) -> Any:
        from triton_nb.server.metrics import CustomMetricError

        try:
            return operation(*args)
        except CustomMetricError as exc:
            raise TritonModelException(f"Failed to {what} metric value: {exc}") from None

    def increment(self, value: float) -> None:
        self._run("increment", self._handle.increment, value)

    def set(self, value: float) -> None:
        self._run("set", self._handle.set, value)

    def observe(self, value: float) -> None:
        self._run("observe", self._handle.observe, value)

    def value(self) -> float:
        return float(self._run("get", self._handle.value))


_FAMILY_DELETED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                   "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
                   "deleted.")


def _clear_metrics(handles: weakref.WeakSet[Any]) -> None:
    for handle in list(handles):
        handle.invalidate(_FAMILY_DELETED)


class MetricFamily:
    """``pb_utils.MetricFamily(name, description, kind)``: a family of the process's metrics
    registry; the same name with another kind is Triton's error (the same kind is the same family)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        from triton_nb.server.metrics import CUSTOM_METRICS, CustomMetricError

        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily(name, description, kind): none of them may be None")
        self.name = str(name)
        self.description = str(description)
        try:
            self.kind = MetricKind(int(kind))
        except ValueError:
            raise TritonModelException(
                "Error when creating MetricFamily: Unsupported kind passed to MetricFamily constructor.") from None
        try:
            self._registered = CUSTOM_METRICS.family(self.name, self.description, int(self.kind))
        except CustomMetricError as exc:
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None
        # Triton's stub clears a family's Metric objects when the family object is deleted (they
        # fail from then on): keep the family as long as its metrics, as Triton's docs ask
        self._handles: weakref.WeakSet[Any] = weakref.WeakSet()
        weakref.finalize(self, _clear_metrics, self._handles)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self.kind != MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        elif self.kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        return Metric(self, labels or {}, buckets)


# --------------------------------------------------------------------------- auto-complete


class ModelConfig:
    """The configuration ``auto_complete_config(auto_complete_model_config)`` receives and returns.

    Only ``max_batch_size``, inputs, outputs, the dynamic batcher and the transaction policy
    can be changed, as in Triton; each setter refuses changes that contradict the config.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        data = json.loads(model_config) if isinstance(model_config, str) else json.loads(json.dumps(model_config))
        data.setdefault("input", [])
        data.setdefault("output", [])
        data.setdefault("max_batch_size", 0)
        data.setdefault("name", "")
        self._model_config: dict[str, Any] = data

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _where(self) -> str:
        return f"auto-complete-config function for model '{self._model_config['name']}'"

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in {self._where()} specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but {self._where()} tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        name = tensor.get("name")
        for key in tensor:
            if key not in allowed:
                raise ValueError(
                    f"{kind} '{name}' in {self._where()} contains property other than {', '.join(map(repr, allowed))}."
                )
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                label = f"{kind} '{name}'" if name else kind
                raise ValueError(f"{label} in {self._where()} is missing '{key}' property.")
        model = self._model_config["name"]
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {current_type} for {kind} "
                    f"'{name}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims {list(tensor['dims'])} but the model "
                    f"configuration specifies dims {list(current['dims'])}"
                )
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects optional {tensor['optional']} but the "
                    f"model configuration specifies optional {current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in {self._where()} contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._model_config['name']}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
