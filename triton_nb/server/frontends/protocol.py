"""What the HTTP and gRPC front ends share: tensor codecs, the classification extension, the
server's identity, wire limits and logging settings. The request-level reading (versions, request
parameters, the :class:`~triton_nb.tensors.InferRequest` itself) is :mod:`triton_nb.server.frontends.request_codec`.

Both protocols carry a tensor as a name, a datatype, a shape and either typed values (JSON lists,
gRPC ``contents``) or raw little-endian bytes (HTTP binary data, gRPC ``raw_*_contents``). BYTES
elements travel raw as a 4-byte little-endian length followed by the bytes, one after another.
Every check names the model and the tensor, so a bad request is answered with a message a user
can act on, never a traceback from numpy.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_nb._version import __version__
from triton_nb.errors import InvalidArgumentError
from triton_nb.tensors import DATATYPES, deserialize_bytes, element_count, numpy_to_triton_dtype, serialize_bytes

__all__ = [
    "API_GROUPS",
    "SERVER_EXTENSIONS",
    "SERVER_NAME",
    "WireLimits",
    "array_from_buffer",
    "array_from_joined_buffers",
    "array_from_joined_values",
    "array_from_values",
    "array_to_buffer",
    "array_to_values",
    "check_shape",
    "classify",
    "parse_restricted_api",
    "server_metadata",
]

SERVER_NAME = "triton_nb"
# The protocol extensions this server implements (Triton's names, as ``GET /v2`` lists them).
SERVER_EXTENSIONS = (
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",  # listed as Triton lists it; without a GPU no region can be registered
    "binary_tensor_data",
    "parameters",
    "statistics",
    "logging",
)

# Triton's API groups, as --http-restricted-api / --grpc-restricted-api name them.
API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
              "trace", "logging")

_BIG_ENDIAN = sys.byteorder == "big"


def server_metadata(name: str = SERVER_NAME) -> dict[str, Any]:
    """Triton's server metadata; ``name`` is the server's id (tritonserver's ``--id``)."""
    return {"name": name, "version": __version__, "extensions": list(SERVER_EXTENSIONS)}


@dataclass(frozen=True)
class WireLimits:
    """Bounds on what one request may make the server allocate.

    ``max_request_bytes`` bounds an HTTP body (after decompression; gRPC messages have their own
    bound, ``grpc_max_message_bytes``, enforced by gRPC); ``max_elements`` bounds the element count
    one tensor may declare, so a shape such as ``[1000000000, 1000]`` is refused before anything is
    allocated.
    """

    max_request_bytes: int = 64 * 1024 * 1024
    max_elements: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_elements"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {getattr(self, name)}")


def _dtype(model: str, tensor: str, datatype: Any) -> np.dtype:
    if datatype is None or datatype == "":
        raise InvalidArgumentError(f"model '{model}': input '{tensor}' needs a 'datatype'")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidArgumentError(
            f"model '{model}': input '{tensor}' has unknown datatype {datatype!r} (expected one of "
            f"{', '.join(DATATYPES)})")
    return DATATYPES[datatype]


def check_shape(model: str, tensor: str, shape: Any, limits: WireLimits) -> tuple[int, ...]:
    """The shape as a tuple of ints, after checking it is a list of non-negative whole numbers
    whose product stays under the element limit."""
    count = 1
    if type(shape) is list or type(shape) is tuple:
        for dim in shape:
            if type(dim) is not int or dim < 0:  # bool is not int here, as JSON means it
                break
            count *= dim or 1  # zero dims are skipped: [0, 2**62] must not reach numpy either
        else:
            if count > limits.max_elements:
                raise InvalidArgumentError(f"model '{model}': input '{tensor}' with shape {list(shape)} is over "
                                           f"the limit of {limits.max_elements} elements")
            return tuple(shape)
    if isinstance(shape, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidArgumentError(f"model '{model}': input '{tensor}' has a negative dimension in shape "
                                   f"{list(shape)}")
    raise InvalidArgumentError(f"model '{model}': input '{tensor}' needs a shape that is a list of integers, "
                               f"got {shape!r}")


def array_from_buffer(model: str, tensor: str, datatype: Any, shape: tuple[int, ...],
                      buffer: bytes | memoryview) -> np.ndarray:
    """A tensor from raw little-endian bytes (HTTP binary data, gRPC raw contents)."""
    dtype = _dtype(model, tensor, datatype)
    count = element_count(shape)
    if dtype.kind == "O":
        return deserialize_bytes(model, tensor, buffer, count).reshape(shape)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidArgumentError(
            f"model '{model}': input '{tensor}' has {len(buffer)} bytes of data; {datatype} with shape "
            f"{list(shape)} needs {expected}")
    if _BIG_ENDIAN and dtype.itemsize > 1:  # the wire is little-endian
        return np.frombuffer(buffer, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    # A binary tensor starts wherever the JSON header or the tensor before it ended; native code
    # (XGBoost, onnxruntime, a model's own) may need its itemsize alignment, so a misaligned view
    # is copied. Aligned ones, the usual case, stay views of the body.
    return array if array.flags.aligned else array.copy()


# JSON cannot carry these exactly; Triton refuses them in JSON and asks for binary data.
_BINARY_ONLY = ("FP16", "BF16")


def _flatten(values: list[Any]) -> list[Any]:
    if values and isinstance(values[0], list):
        flat: list[Any] = []
        stack = [iter(values)]
        while stack:
            for item in stack[-1]:
                if isinstance(item, list):
                    stack.append(iter(item))
                    break
                flat.append(item)
            else:
                stack.pop()
        return flat
    return values


# The numpy kinds JSON values may infer to, per datatype kind: whole numbers for integers
# (unsigned 64-bit values beyond int64 infer to uint64), any number for floats, true/false for BOOL.
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf", "V": ""}
_KIND_NAMES = {"b": "true/false", "i": "whole number", "u": "whole number", "f": "fractional number",
               "U": "text", "O": "mixed or out-of-range", "S": "text"}


def array_from_values(model: str, tensor: str, datatype: Any, shape: tuple[int, ...], values: Any) -> np.ndarray:
    """A tensor from typed values: a JSON list (flat or nested, row-major) or a gRPC contents list."""
    dtype = _dtype(model, tensor, datatype)
    if datatype in _BINARY_ONLY:
        raise InvalidArgumentError(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input "
            f"{tensor}")
    if not isinstance(values, (list, tuple)):
        raise InvalidArgumentError(f"model '{model}': input '{tensor}' needs its data as a list, got "
                                   f"{type(values).__name__}")
    flat = _flatten(list(values))
    count = element_count(shape)
    if len(flat) != count:
        raise InvalidArgumentError(
            f"model '{model}': input '{tensor}' has {len(flat)} values; shape {list(shape)} needs {count}")
    if dtype.kind == "O":
        array = np.empty(count, dtype=object)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                array[i] = item.encode("utf-8")
            elif isinstance(item, bytes):
                array[i] = item
            else:
                raise InvalidArgumentError(
                    f"model '{model}': BYTES input '{tensor}' element {i} is {type(item).__name__}, not a string")
        return array.reshape(shape)
    # numpy infers the JSON values' kind in C; only then is the kind checked against the
    # datatype (np.array(["1.5"], dtype=float32) would quietly parse text, and True is not 1)
    try:
        inferred = np.array(flat)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(
            f"model '{model}': input '{tensor}' has data that is not {datatype}: {exc}") from None
    if count and inferred.dtype.kind not in _JSON_KINDS[dtype.kind]:
        if dtype.kind in "iu" and all(type(v) is int for v in flat):  # e.g. UINT64 values past int64
            try:
                return np.array(flat, dtype=dtype).reshape(shape)
            except OverflowError:
                raise InvalidArgumentError(
                    f"model '{model}': input '{tensor}' has values out of range for {datatype}") from None
        raise InvalidArgumentError(
            f"model '{model}': input '{tensor}' has data that is not {datatype} (found "
            f"{_KIND_NAMES.get(inferred.dtype.kind, inferred.dtype.kind)} values)")
    try:
        array = inferred.astype(dtype, copy=False)
    except (TypeError, ValueError, OverflowError) as exc:  # pragma: no cover - kinds checked above
        raise InvalidArgumentError(
            f"model '{model}': input '{tensor}' has data that is not {datatype}: {exc}") from None
    return array.reshape(shape)


# The JSON element types whose values read the same joined with other requests' as alone, by the
# datatype's kind: numpy reads a bool among numbers as a number, and a nested list would flatten
# across the requests' borders.
_JOINABLE_TYPES = {"b": frozenset((bool,)), "i": frozenset((int,)), "u": frozenset((int,)),
                   "f": frozenset((int, float)), "O": frozenset((str,))}


def array_from_joined_values(model: str, tensor: str, datatype: Any, shape: tuple[int, ...],
                             values: list[Any]) -> np.ndarray | None:
    """:func:`array_from_values` for the flat JSON value lists of several requests joined in order
    (their tensors joined along the batch, ``shape`` the joined one). None where reading them
    joined might read one of them otherwise than alone (see ``_JOINABLE_TYPES``): read each alone
    then. Raises as :func:`array_from_values` does."""
    joinable = _JOINABLE_TYPES.get(_dtype(model, tensor, datatype).kind)
    if joinable is None or not joinable.issuperset(map(type, values)):
        return None
    return array_from_values(model, tensor, datatype, shape, values)


_LENGTH = struct.Struct("<I")  # a BYTES element's length prefix


def array_from_joined_buffers(model: str, tensor: str, datatype: Any, shape: tuple[int, ...],
                              buffers: list[bytes]) -> np.ndarray | None:
    """:func:`array_from_buffer` for the raw buffers of several requests whose tensors are each of
    ``shape``, joined along the batch (the first dim). None where a buffer is not exactly one
    request's (read each alone then, which says what is wrong): BYTES are joined only at one
    element a request, whose length prefix must span its buffer."""
    dtype = _dtype(model, tensor, datatype)
    count = element_count(shape)
    joined = (shape[0] * len(buffers), *shape[1:]) if shape else ()
    if not joined:
        return None
    if dtype.kind == "O":
        if count != 1 or not all(len(buffer) >= 4 and _LENGTH.unpack_from(buffer)[0] == len(buffer) - 4
                                 for buffer in buffers):
            return None
        values = np.empty(len(buffers), dtype=object)
        values[:] = [bytes(buffer[4:]) for buffer in buffers]
        return values.reshape(joined)
    size = count * dtype.itemsize
    if any(len(buffer) != size for buffer in buffers):
        return None
    return array_from_buffer(model, tensor, datatype, joined, b"".join(buffers))


def array_to_buffer(array: np.ndarray) -> bytes:
    """Raw little-endian bytes of a tensor (BYTES length-prefixed)."""
    if array.dtype.kind in "OSU":
        return serialize_bytes(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()


def array_to_values(model: str, output: str, array: np.ndarray) -> list[Any]:
    """A tensor as a flat list for JSON (BYTES as text)."""
    datatype = numpy_to_triton_dtype(array.dtype)
    if datatype in _BINARY_ONLY:
        raise InvalidArgumentError(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output")
    if datatype == "BYTES":
        return [item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
                for item in array.ravel()]
    return array.ravel().tolist()


def classify(model: str, output: str, array: np.ndarray, count: int, batching: bool,
             labels: list[str] | None = None) -> np.ndarray:
    """Triton's classification extension: the ``count`` largest values of each batch row as
    ``"value:index"`` (``"value:index:label"`` with a label file), a BYTES tensor of shape
    ``[batch, count]`` (``[count]`` without batching)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidArgumentError(
            f"model '{model}': classification count for output '{output}' must be a positive integer, got {count!r}")
    if array.dtype.kind not in "biuf":
        raise InvalidArgumentError(
            f"model '{model}': output '{output}' is {numpy_to_triton_dtype(array.dtype)}; classification needs "
            f"numbers")
    rows = array.reshape(array.shape[0], -1) if batching and array.ndim > 0 else array.reshape(1, -1)
    take = min(count, rows.shape[1])
    # stable sort on the negated values: ties keep index order, as Triton's std::sort on pairs does
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :take]
    result = np.empty(order.shape, dtype=object)
    for r in range(order.shape[0]):
        for c in range(take):
            index = int(order[r, c])
            text = f"{_format_score(rows[r, index])}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode("utf-8")
    return result if batching else result[0]


def _format_score(value: Any) -> str:
    if isinstance(value, (np.floating, float)):
        return f"{float(value):f}"
    return str(value.item() if hasattr(value, "item") else value)


def parse_restricted_api(specs: Any, flag: str) -> dict[str, tuple[str, str]]:
    """Triton's ``--http-restricted-api`` values — ``"<group>[,<group>...]:<key>=<value>"``, one or
    a list — as ``{group: (header key, value)}``. A request to a restricted group must carry that
    header (gRPC: that metadata key) with that value."""
    if not specs:
        return {}
    restrictions: dict[str, tuple[str, str]] = {}
    for spec in [specs] if isinstance(specs, str) else list(specs):
        groups, _, header = str(spec).partition(":")
        key, _, value = header.partition("=")
        if not groups or not key.strip() or not value:
            raise InvalidArgumentError(f"{flag} must be <group>[,<group>...]:<key>=<value>, got {spec!r}")
        for group in (g.strip() for g in groups.split(",")):
            if group not in API_GROUPS:
                raise InvalidArgumentError(f"{flag}: unknown API group '{group}' (one of {', '.join(API_GROUPS)})")
            if group in restrictions:
                raise InvalidArgumentError(f"{flag}: API group '{group}' is restricted twice")
            restrictions[group] = (key.strip().lower(), value)
    return restrictions
