"""Tensors as the server and its backends pass them: the request and response that cross every
boundary of the server, Triton's data types, and the BYTES layout.

One :class:`InferRequest` is built by a protocol adapter (in-process client, HTTP, gRPC),
resolved by the model manager, queued by a scheduler and handed — in a list, one batch — to a
backend, which answers with one :class:`InferResponse` per request. Tensors are numpy arrays
with the batch dimension first when the model batches; BYTES tensors are object arrays of
``bytes``, as in Triton's Python backend.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    import ml_dtypes
except ImportError:  # a Python model's own environment (a process instance's interpreter) may lack it
    ml_dtypes = None

from triton_nb.errors import InvalidArgumentError

__all__ = [
    "DATATYPES",
    "CarriedResponses",
    "InferRequest",
    "InferResponse",
    "deserialize_bytes",
    "element_count",
    "numpy_to_triton_dtype",
    "serialize_bytes",
    "text_to_bytes",
    "triton_to_numpy_dtype",
]

# KServe v2 / Triton datatype names -> numpy dtypes. BYTES is an object array of bytes; BF16 is
# ml_dtypes' bfloat16 (a dependency of tritonclient, which uses the same type since r26.06).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
if ml_dtypes is not None:
    DATATYPES["BF16"] = np.dtype(ml_dtypes.bfloat16)
_NUMPY_TO_TRITON = {dtype: name for name, dtype in DATATYPES.items()}


def triton_to_numpy_dtype(datatype: str) -> np.dtype:
    """``"FP32"`` -> ``float32`` (also accepts config names such as ``"TYPE_FP32"``)."""
    name = datatype.removeprefix("TYPE_")
    if name == "STRING":
        name = "BYTES"
    try:
        return DATATYPES[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown datatype '{datatype}'") from None


def numpy_to_triton_dtype(dtype: Any) -> str:
    """``float32`` -> ``"FP32"``; unicode and bytes arrays are ``"BYTES"``."""
    dtype = np.dtype(dtype)
    if dtype.kind in "SUO":
        return "BYTES"
    try:
        return _NUMPY_TO_TRITON[dtype]
    except KeyError:
        raise InvalidArgumentError(f"numpy dtype {dtype} has no Triton datatype") from None


def text_to_bytes(values: Any) -> np.ndarray:
    """A column of text (or numbers meant as text) as a BYTES tensor: an object array of UTF-8
    ``bytes``, missing values (None, NaN) as ``b""``. Floats keep their spelling (``91750.0``),
    as TabFormer writes zips."""
    import pandas as pd

    series = values if isinstance(values, pd.Series) else pd.Series(values)
    missing = series.isna().to_numpy()
    # object -> str lets numpy size the unicode array (to_numpy(dtype=str) would truncate)
    if series.dtype.kind == "f":
        text = series.astype(str).to_numpy(dtype=object).astype(str)
    else:
        text = series.astype(object).where(~missing, "").to_numpy(dtype=object).astype(str)
    encoded = np.char.encode(text, "utf-8").astype(object)
    if missing.any():
        encoded[missing] = b""
    return encoded


@dataclass
class InferRequest:
    """One inference request, as the scheduler and backends see it.

    ``inputs`` hold numpy arrays whose first dimension is the batch when the model batches.
    ``requested_outputs`` of None means every output. ``timeout_microseconds`` of 0 means the
    model's queue policy decides. ``response_sender`` is set for decoupled models: the backend
    streams ``(response, final)`` pairs through it instead of returning responses.
    """

    model_name: str
    inputs: dict[str, np.ndarray]
    model_version: int = -1  # -1: the version the policy serves (the latest)
    requested_outputs: list[str] | None = None
    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    timeout_microseconds: int = 0
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    response_sender: Callable[[InferResponse, bool], None] | None = None
    # Filled by the server as the request moves (ns): queue, compute_input/infer/output.
    timing: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    # An ensemble step carrying the rows of several ensemble requests as one request: the rows of
    # each, in order. The model's statistics count it as that many requests; () is one request.
    carried_rows: tuple[int, ...] = field(default=(), repr=False, compare=False)
    # ... and each carried request's id, in the same order (() when it is one request).
    carried_request_ids: tuple[str, ...] = field(default=(), repr=False, compare=False)
    # Set once the request is cancelled (a BLS caller's ``ResponseIterator.cancel()``): never
    # cleared, as Triton's flag; the model reads it with ``request.is_cancelled()``.
    cancelled: bool = field(default=False, repr=False, compare=False)

    def is_cancelled(self) -> bool:
        """Whether the request was cancelled (Triton's ``TRITONBACKEND_RequestIsCancelled``)."""
        return self.cancelled

    def counted_requests(self) -> int:
        """How many requests this one counts as in the statistics (more than 1 when carried)."""
        return len(self.carried_rows) or 1

    def carried_apart(self) -> list[InferRequest]:
        """The requests whose rows this one carries (``carried_rows``), in order: each with its own
        rows (views of these inputs) and its own id, and everything else of this one."""
        ids = self.carried_request_ids or (self.request_id,) * len(self.carried_rows)
        apart, start = [], 0
        for rows, request_id in zip(self.carried_rows, ids, strict=True):
            end = start + rows
            apart.append(InferRequest(
                model_name=self.model_name, inputs={name: array[start:end] for name, array in self.inputs.items()},
                model_version=self.model_version, requested_outputs=self.requested_outputs, request_id=request_id,
                parameters=self.parameters, priority=self.priority, timeout_microseconds=self.timeout_microseconds,
                arrival_ns=self.arrival_ns, cancelled=self.cancelled))
            start = end
        return apart

    def batch_size(self, batching: bool) -> int:
        """Rows this request adds to a batch: the first dim of its inputs, or 1 without batching."""
        if not batching or not self.inputs:
            return 1
        return int(next(iter(self.inputs.values())).shape[0])


class CarriedResponses(Exception):
    """How a backend answers a request carrying several requests' rows (``InferRequest.carried_rows``)
    when it cannot answer it as one response: one response per carried request, in order, each
    with its outputs or the error that failed it alone. Set as that response's ``error``, so that
    whatever does not know carried requests fails it as a whole."""

    def __init__(self, responses: list[InferResponse]) -> None:
        failed = next((response.error for response in responses if response.error is not None), None)
        super().__init__(str(failed) if failed is not None else "the carried requests were answered apart")
        self.responses = responses


@dataclass
class InferResponse:
    """The answer to one request: output tensors, or the error that failed this request alone."""

    model_name: str
    model_version: int
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    error: Exception | None = None

    def as_numpy(self, name: str) -> np.ndarray | None:
        """The output named ``name`` (None if absent), like ``tritonclient``'s result."""
        return self.outputs.get(name)

    @classmethod
    def failed(cls, request: InferRequest, error: Exception, version: int = -1) -> InferResponse:
        return cls(model_name=request.model_name, model_version=version, request_id=request.request_id, error=error)


# BYTES tensors on the wire, in shared memory and in a process instance's arena: each element a
# 4-byte little-endian length followed by its bytes, one after another (Triton's layout).
_LENGTH = struct.Struct("<I")


def element_count(shape: tuple[int, ...]) -> int:
    """Elements in a tensor of ``shape`` (1 for a scalar), without numpy's overflow to float."""
    count = 1
    for dim in shape:
        count *= dim
    return count


def deserialize_bytes(model: str, tensor: str, buffer: bytes | memoryview, count: int) -> np.ndarray:
    """``count`` length-prefixed elements from ``buffer`` as an object array of bytes."""
    values = np.empty(count, dtype=object)
    if count == 1 and len(buffer) >= 4 and _LENGTH.unpack_from(buffer, 0)[0] == len(buffer) - 4:
        values[0] = bytes(buffer[4:])  # the common single-row request, without the loop
        return values
    data = bytes(buffer)  # (one copy; a slice of bytes is then the element, with no view in between)
    unpack = _LENGTH.unpack_from
    items: list[bytes] = []
    append = items.append
    offset = 0
    try:
        for _ in range(count):  # the loop a well-formed tensor takes; a malformed one is told below
            (length,) = unpack(data, offset)
            offset += 4
            append(data[offset:offset + length])
            offset += length
    except struct.error:
        pass
    else:
        if offset == len(data):
            values[:] = items
            return values
    raise _malformed(model, tensor, data, count)


def _malformed(model: str, tensor: str, buffer: bytes, count: int) -> InvalidArgumentError:
    """What is wrong with BYTES data that the fast loop could not take, in Triton's terms."""
    view = memoryview(buffer)
    offset = 0
    end = len(view)
    for i in range(count):
        if offset + 4 > end:
            return InvalidArgumentError(
                f"model '{model}': BYTES input '{tensor}' holds fewer than the {count} elements its shape needs")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            return InvalidArgumentError(
                f"model '{model}': BYTES input '{tensor}' element {i} says {length} bytes; the data ends before")
        offset += length
    return InvalidArgumentError(
        f"model '{model}': BYTES input '{tensor}' has {end - offset} bytes left over after {count} elements")


def serialize_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor (bytes or str elements) as length-prefixed elements, in C order."""
    parts = []
    for item in array.ravel(order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)
