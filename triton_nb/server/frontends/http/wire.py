"""What the HTTP front end reads off an inference request's (or a control request's) headers and
body before the server is asked anything, and the JSON it writes: the binary split
(``Inference-Header-Content-Length``), raw binary requests, shared-memory tensor parameters,
restricted API groups, model-load parameters, content encodings, Triton's JSON spellings of
non-finite numbers, and which JSON requests may be decoded together. Plain functions of their
arguments; :class:`~triton_nb.server.frontends.http.app.HttpApp` uses them.
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InvalidArgumentError, PayloadTooLargeError, UnsupportedEncodingError
from triton_nb.server.frontends.shared_memory import SHM_PARAMETERS, TensorRegion
from triton_nb.tensors import InferRequest, triton_to_numpy_dtype

__all__ = [
    "api_group",
    "compress_body",
    "decompress_body",
    "dumps_json",
    "joinable_signature",
    "json_header_length",
    "load_parameters",
    "raw_request",
    "tensor_region",
]

_JOINABLE_INPUT = frozenset(("name", "datatype", "shape", "data"))
_ALONE = ("id", "inputs")  # what may differ between requests decoded together


def joinable_signature(model: str, version_text: str, document: Any) -> tuple | None:
    """What requests decoded together share (see :meth:`HttpApp.begin_infer_burst`), or None when
    ``document`` is read alone: every input given as ``name``, ``datatype``, ``shape`` and ``data``
    (a list of the shape's element count), an ``id`` that is text, and the rest of the document
    compared whole."""
    if type(document) is not dict or type(document.get("id", "")) is not str:
        return None
    inputs = document.get("inputs")
    if type(inputs) is not list or not inputs:
        return None
    signature: list[Any] = [model, version_text]
    for entry in inputs:
        if type(entry) is not dict or entry.keys() != _JOINABLE_INPUT:
            return None
        shape, data = entry["shape"], entry["data"]
        if type(shape) is not list or type(data) is not list:
            return None
        count = 1
        for dim in shape:
            if type(dim) is not int:  # bool too: True == 1 would join a request that alone is refused
                return None
            count *= dim
        if len(data) != count:
            return None
        signature.append((entry["name"], entry["datatype"], *shape))
    if len(document) > 1 + ("id" in document):
        signature.append(orjson.dumps({key: value for key, value in document.items() if key not in _ALONE},
                                      option=orjson.OPT_SORT_KEYS))
    return tuple(signature)


def json_header_length(model: str, headers: dict[bytes, bytes], body_bytes: int) -> int | None:
    """The JSON header's size from ``Inference-Header-Content-Length``; None without the header."""
    header_length = headers.get(b"inference-header-content-length")
    if header_length is None:
        return None
    if not header_length.strip().isdigit():
        raise InvalidArgumentError(
            f"model '{model}': Inference-Header-Content-Length must be a whole number of bytes >= 0, got "
            f"{header_length.decode(errors='replace')!r}")
    if int(header_length) > body_bytes:
        raise InvalidArgumentError(
            f"model '{model}': Inference-Header-Content-Length {int(header_length)} is larger than the "
            f"body ({body_bytes} bytes)")
    return int(header_length)


def raw_request(model: str, version: int | None, config: Any, body: bytes) -> InferRequest:
    """A raw binary request (a JSON header of 0 bytes): the whole body is the model's only input,
    one batch row of the config's shape, as Triton reads it."""
    if len(config.input) != 1:
        raise InvalidArgumentError(f"Raw request must only have 1 input (found 1) to be deduced but got "
                                   f"{len(config.input)} inputs in '{model}' model configuration")
    spec = config.input[0]
    shape = ([1] if config.max_batch_size > 0 else []) + list(spec.dims)
    dtype = triton_to_numpy_dtype(mc.DataType.Name(spec.data_type))
    if dtype.kind == "O":  # the body is one element
        array = np.empty(1, dtype=object)
        array[0] = bytes(body)
        return InferRequest(model, {spec.name: array.reshape([1] * max(len(shape), 1))},
                            model_version=-1 if version is None else version)
    if shape.count(-1) == 1:  # one variable dim: as many as the body holds
        row_bytes = int(np.prod([d for d in shape if d != -1])) * dtype.itemsize
        if row_bytes and len(body) % row_bytes == 0:
            shape[shape.index(-1)] = len(body) // row_bytes
    expected = int(np.prod(shape)) * dtype.itemsize
    if -1 in shape or len(body) != expected:
        raise InvalidArgumentError(f"input byte size mismatch for input '{spec.name}' for model '{model}'. "
                                   f"Expected {'a whole number of rows' if -1 in shape else expected}, got "
                                   f"{len(body)}")
    array = np.frombuffer(body, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
    return InferRequest(model, {spec.name: array.reshape(shape)}, model_version=-1 if version is None else version)


def api_group(parts: list[str]) -> str | None:
    """The API group of a path (Triton's names), for restricted APIs; None for no route."""
    if not parts or parts[0] != "v2":
        return None
    rest = parts[1:]
    if not rest:
        return "metadata"
    head = rest[0]
    if head == "models":
        if rest[1:] == ["stats"]:
            return "statistics"
        tail = rest[2:]
        if len(tail) >= 2 and tail[0] == "versions":
            tail = tail[2:]
        action = tail[0] if tail else ""
        return {"": "metadata", "ready": "health", "config": "model-config", "infer": "inference",
                "stats": "statistics"}.get(action)
    return {"health": "health", "repository": "model-repository", "logging": "logging", "trace": "trace",
            "systemsharedmemory": "shared-memory", "cudasharedmemory": "shared-memory"}.get(head)


def tensor_region(parameters: dict[str, Any]) -> TensorRegion:
    """A tensor's ``shared_memory_*`` parameters; a missing offset is 0 and a missing size 0 (which
    the region then refuses), as Triton reads them."""
    region = parameters["shared_memory_region"]
    if not isinstance(region, str):
        raise InvalidArgumentError(f"Unable to parse 'shared_memory_region': expected a string, got {region!r}")
    numbers = []
    for key in SHM_PARAMETERS[1:]:
        value = parameters.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"Unable to parse '{key}': expected a whole number >= 0, got {value!r} "
                                       f"(region '{region}')")
        numbers.append(value)
    return TensorRegion(region, numbers[0], numbers[1])


def dumps_json(document: dict[str, Any], non_finite: bool) -> bytes:
    """Compact JSON; with NaN or infinities in the data, written as ``NaN``/``Infinity`` as
    Triton writes them (orjson would write null)."""
    if non_finite:
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return orjson.dumps(document)


def load_parameters(model: str, parameters: dict[str, Any]) -> tuple[Any, dict[str, bytes] | None]:
    config = parameters.get("config")
    if config is not None and not isinstance(config, (str, dict)):
        raise InvalidArgumentError(f"model '{model}': load parameter 'config' must be a JSON string")
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith("file:"):
            continue
        if not isinstance(value, str):
            raise InvalidArgumentError(f"model '{model}': file override '{key}' must be base64 text")
        try:
            files[key] = base64.b64decode(value, validate=True)
        except ValueError:
            raise InvalidArgumentError(f"model '{model}': file override '{key}' is not valid base64") from None
    return config, files or None


def decompress_body(body: bytes, encoding: bytes, limit: int) -> bytes:
    if encoding == b"gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == b"deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise UnsupportedEncodingError(f"unsupported Content-Encoding '{encoding.decode(errors='replace')}' "
                                   f"(gzip, deflate or identity)")
    inflater = zlib.decompressobj(wbits)
    try:
        # bounded: a small compressed body must not inflate past the limit (a "zip bomb")
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgumentError(f"the {encoding.decode()} request body does not decompress: {exc}") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise PayloadTooLargeError(f"the decompressed request body is over the limit of {limit} bytes")
    return data


def compress_body(body: bytes, accept: bytes) -> tuple[bytes, bytes] | None:
    """``body`` compressed as ``Accept-Encoding`` asks (gzip first, then deflate) and the encoding's
    name; None when it asks for neither."""
    accepted = {part.split(b";")[0].strip().lower() for part in accept.split(b",")}
    if b"gzip" in accepted:
        return gzip.compress(body, compresslevel=6), b"gzip"
    if b"deflate" in accepted:
        return zlib.compress(body), b"deflate"
    return None
