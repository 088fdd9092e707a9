"""Request data for a measurement: from a DataFrame (its rows become tensors by the rules of
:mod:`triton_nb.frames`), the fraud generator, random or zero tensors
shaped by the model's config, or a JSON file in perf_analyzer's ``--input-data`` format (optionally with a share of them
repeated, for a response cache: ``repeat_ratio``); and the
same requests encoded once for the wire (HTTP binary tensors, gRPC ``ModelInferRequest``, or either
referring to system shared-memory regions instead of carrying tensors), so the load generator spends
no time serializing."""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from triton_nb.errors import InvalidArgumentError
from triton_nb.frames import frame_to_inputs
from triton_nb.perf.options import TENSOR_FORMATS
from triton_nb.server.frontends.protocol import array_to_buffer
from triton_nb.tensors import numpy_to_triton_dtype, triton_to_numpy_dtype

__all__ = [
    "SharedMemoryPlaces",
    "TensorPlace",
    "encode_grpc",
    "encode_http",
    "mix_label",
    "request_inputs",
    "row_mix",
    "with_repeats",
]

InputData = pd.DataFrame | dict | str | os.PathLike | None


def _specs(config: dict[str, Any]) -> list[dict[str, Any]]:
    inputs = config.get("input", [])
    if not inputs:
        raise InvalidArgumentError(f"model '{config.get('name', '?')}' declares no inputs")
    return inputs


def _synthetic_dims(spec: Mapping[str, Any]) -> list[int]:
    """The shape of one synthetic row: a variable dimension (-1) becomes 1, as in perf_analyzer
    without ``--shape``."""
    return [1 if int(d) == -1 else int(d) for d in spec.get("dims", [])]


def _batched(config: dict[str, Any]) -> bool:
    return int(config.get("max_batch_size", 0)) > 0


def _synthetic(config: dict[str, Any], rows: int, kind: str, seed: int) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    arrays = {}
    for spec in _specs(config):
        dtype = triton_to_numpy_dtype(spec["data_type"])
        shape = ([rows] if _batched(config) else []) + _synthetic_dims(spec)
        if dtype.kind == "O":
            if kind == "zero":
                values = np.full(shape, b"", dtype=object)
            else:
                values = np.array([generator.bytes(8).hex().encode() for _ in range(int(np.prod(shape)))],
                                  dtype=object).reshape(shape)
        elif kind == "zero":
            values = np.zeros(shape, dtype)
        elif dtype.kind == "b":
            values = generator.random(shape) < 0.5
        elif dtype.kind in "iu":
            values = generator.integers(0, 100, size=shape).astype(dtype)
        else:
            values = generator.random(shape).astype(dtype)
        arrays[spec["name"]] = values
    return arrays


def _from_frame(config: dict[str, Any], frame: pd.DataFrame, rows: int, count: int) -> list[dict[str, np.ndarray]]:
    if len(frame) < rows:
        raise InvalidArgumentError(f"the input data has {len(frame)} rows; each request needs {rows}")
    return [frame_to_inputs(config, frame.iloc[index * rows:(index + 1) * rows])
            for index in range(min(count, len(frame) // rows))]


def _from_json_file(config: dict[str, Any], path: Path, rows: int) -> list[dict[str, np.ndarray]]:
    """perf_analyzer's input-data JSON: ``{"data": [{"NAME": [...] | {"content": [...], "shape": [...]}
    | {"b64": "..."}}, ...]}``; each entry is one row (a batch dimension is added)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"input data file {path}: {exc}") from None
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InvalidArgumentError(f"input data file {path}: needs a non-empty \"data\" list")
    specs = {s["name"]: s for s in _specs(config)}
    rows_out = []
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidArgumentError(f"input data file {path}: entry {number} is not an object")
        row = {}
        for name, value in entry.items():
            if name not in specs:
                raise InvalidArgumentError(f"input data file {path}: entry {number} names unknown input '{name}'")
            dtype = triton_to_numpy_dtype(specs[name]["data_type"])
            shape = [int(d) for d in specs[name].get("dims", [])]
            if isinstance(value, dict) and "b64" in value:
                raw = base64.b64decode(value["b64"])
                array = (np.array([raw], dtype=object) if dtype.kind == "O" else np.frombuffer(raw, dtype))
            else:
                content = value.get("content") if isinstance(value, dict) else value
                shape = value.get("shape", shape) if isinstance(value, dict) else shape
                flat = np.asarray(content, dtype=object if dtype.kind == "O" else dtype).ravel()
                array = (np.array([v.encode() if isinstance(v, str) else v for v in flat], dtype=object)
                         if dtype.kind == "O" else flat)
            if list(shape).count(-1) > 1:
                raise InvalidArgumentError(
                    f"input data file {path}: entry {number}, input '{name}' has dims {list(shape)}: with more "
                    "than one variable dimension the entry needs \"content\" and \"shape\"")
            try:
                row[name] = array.reshape(shape)
            except ValueError:
                raise InvalidArgumentError(
                    f"input data file {path}: entry {number}, input '{name}' has {array.size} value(s), which do "
                    f"not fit shape {list(shape)}") from None
        rows_out.append(row)
    requests = []
    for start in range(0, len(rows_out) - rows + 1, rows):
        group = rows_out[start:start + rows]
        if not _batched(config):
            requests.append(group[0])
            continue
        for name in group[0]:
            shapes = {r[name].shape for r in group}
            if len(shapes) > 1:
                raise InvalidArgumentError(
                    f"input data file {path}: entries {start}..{start + rows - 1} give input '{name}' the shapes "
                    f"{sorted(map(list, shapes))}: the rows of one request must have one shape")
        requests.append({name: np.stack([r[name] for r in group]) for name in group[0]})
    return requests


RowsPerRequest = int | Sequence[int]


def row_mix(sizes: RowsPerRequest, weights: Sequence[float] | None, count: int, seed: int = 0) -> list[int]:
    """The rows of each of ``count`` requests: every size of ``sizes`` in proportion to its weight
    (equal weights by default; whole counts by largest remainder), in a seeded random order. A
    single size gives ``count`` requests of it."""
    sizes = [sizes] if isinstance(sizes, (int, np.integer)) else list(sizes)
    if not sizes or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in sizes):
        raise InvalidArgumentError(f"rows_per_request must be a whole number >= 1 or a list of them, got {sizes!r}")
    if len(set(sizes)) != len(sizes):
        raise InvalidArgumentError(f"rows_per_request lists a size twice: {sizes!r}")
    shares = np.ones(len(sizes)) if weights is None else np.asarray(list(weights), float)
    if shares.shape != (len(sizes),) or not np.all(np.isfinite(shares)) or (shares < 0).any() or shares.sum() <= 0:
        raise InvalidArgumentError(f"rows_per_request_weights must be one weight >= 0 per size of {sizes!r} "
                                   f"(not all 0), got {weights!r}")
    exact = shares / shares.sum() * count
    counts = np.floor(exact).astype(int)
    for index in np.argsort(-(exact - counts), kind="stable")[:count - int(counts.sum())]:
        counts[index] += 1
    plan = np.repeat(np.asarray(sizes, int), counts)
    return [int(v) for v in np.random.default_rng(seed).permutation(plan)]


def mix_label(rows: Sequence[int]) -> str:
    """The mix a sequence of row counts holds, as ``"1:90%,8:9%,64:1%"`` (sizes ascending)."""
    values, counts = np.unique(np.asarray(rows, int), return_counts=True)
    return ",".join(f"{v}:{100 * c / len(rows):.3g}%" for v, c in zip(values, counts, strict=True))


def request_inputs(config: dict[str, Any], input_data: InputData = "random", rows_per_request: RowsPerRequest = 1,
                   count: int = 16, seed: int = 0, repeat_ratio: float = 0.0,
                   rows_per_request_weights: Sequence[float] | None = None) -> list[dict[str, np.ndarray]]:
    """Up to ``count`` distinct requests of ``rows_per_request`` rows for the model whose config
    (Triton's JSON form) is given. ``input_data``: a DataFrame (columns matched to inputs by
    name), ``"fraud"`` (generated TabFormer transactions), ``"random"``, ``"zero"``, or the path of
    a JSON file in perf_analyzer's format.

    ``rows_per_request`` a list of sizes (with ``rows_per_request_weights``, default equal): exactly
    ``count`` requests whose sizes follow the mix (:func:`row_mix`); each size's requests are the
    first ones the data gives for that size, reused in turn when it gives fewer.

    ``repeat_ratio`` (0 <= r < 1): exactly ``count`` requests, of which ``round(count * (1 - r))``
    are distinct (the first ones the data gives) and the rest repeat requests that came earlier in
    the sequence (the same objects), spread evenly: sent in order to a server with a response
    cache large enough, a share ``r`` of them are hits (see :func:`with_repeats`)."""
    if not 0.0 <= repeat_ratio < 1.0:
        raise InvalidArgumentError(f"repeat_ratio must be at least 0 and below 1, got {repeat_ratio}")
    mixed = not isinstance(rows_per_request, (int, np.integer)) or rows_per_request_weights is not None
    if repeat_ratio:
        distinct = max(1, round(count * (1.0 - repeat_ratio)))
        unique = request_inputs(config, input_data, rows_per_request, distinct, seed,
                                rows_per_request_weights=rows_per_request_weights)[:distinct]
        if len(unique) < distinct:
            raise InvalidArgumentError(
                f"repeat_ratio {repeat_ratio} over {count} requests needs {distinct} distinct requests; the input "
                f"data gives {len(unique)} (give more rows, or a smaller request count)")
        return with_repeats(unique, count, seed)
    if mixed:
        sizes = row_mix(rows_per_request, rows_per_request_weights, count, seed)
        made = {size: request_inputs(config, input_data, size, sizes.count(size), seed) for size in set(sizes)}
        used = dict.fromkeys(made, 0)
        out = []
        for size in sizes:
            if not made[size]:
                raise InvalidArgumentError(f"the input data gives no request of {size} rows")
            out.append(made[size][used[size] % len(made[size])])
            used[size] += 1
        return out
    if rows_per_request < 1:
        raise InvalidArgumentError(f"rows_per_request must be >= 1, got {rows_per_request}")
    if rows_per_request > 1 and not _batched(config):
        raise InvalidArgumentError(f"model '{config.get('name')}' does not batch (max_batch_size 0): one row per "
                                   f"request")
    if isinstance(input_data, pd.DataFrame):
        return _from_frame(config, input_data, rows_per_request, count)
    if isinstance(input_data, str) and input_data == "fraud":
        from triton_nb.fraud import generate_transactions

        return _from_frame(config, generate_transactions(max(64, rows_per_request * count), seed=seed),
                           rows_per_request, count)
    if isinstance(input_data, str) and input_data in ("random", "zero"):
        return [_synthetic(config, rows_per_request, input_data, seed + i) for i in range(count)]
    if isinstance(input_data, (str, os.PathLike)):
        return _from_json_file(config, Path(input_data), rows_per_request)
    raise InvalidArgumentError(
        f"input_data must be a DataFrame, 'fraud', 'random', 'zero' or a JSON file path, got {input_data!r}")


def with_repeats(distinct: list[Any], count: int, seed: int = 0) -> list[Any]:
    """A sequence of ``count`` items in which every item of ``distinct`` appears, its first
    appearance before any repeat of it, new items spread evenly along the sequence and each other
    place a repeat of an item already seen (drawn with ``seed``): sent in order to a cache, the
    repeats are the ``count - len(distinct)`` hits."""
    if not distinct or count < len(distinct):
        raise InvalidArgumentError(f"with_repeats: {len(distinct)} distinct items do not fit {count} places")
    generator = np.random.default_rng(seed)
    sequence: list[Any] = []
    seen = 0
    for place in range(count):
        if seen < math.ceil((place + 1) * len(distinct) / count):
            sequence.append(distinct[seen])
            seen += 1
        else:
            sequence.append(distinct[int(generator.integers(seen))])
    return sequence


@dataclass(frozen=True)
class TensorPlace:
    """Where one tensor of a request lives in a registered system shared-memory region: the
    ``shared_memory_region``/``_offset``/``_byte_size`` parameters a request carries instead of it."""

    region: str
    offset_bytes: int
    byte_size: int

    def parameters(self) -> dict[str, Any]:
        return {"shared_memory_region": self.region, "shared_memory_byte_size": self.byte_size,
                "shared_memory_offset": self.offset_bytes}


@dataclass(frozen=True)
class SharedMemoryPlaces:
    """Where one request's inputs are (they are sent as references, without data) and where its
    outputs are to be written (each output named here is requested with its place)."""

    inputs: dict[str, TensorPlace]
    outputs: dict[str, TensorPlace]


def _json_data(array: np.ndarray) -> list[Any]:
    """A tensor's values as the ``data`` of a JSON input, flattened in row-major order, as
    tritonclient writes them (BYTES elements as UTF-8 strings)."""
    if array.dtype.kind in "OSU":
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.ravel()]
    return array.ravel().tolist()


def encode_http(model: str, inputs: dict[str, np.ndarray], places: SharedMemoryPlaces | None = None, *,
                input_format: str = "binary", output_format: str = "binary") -> tuple[bytes, int]:
    """A KServe v2 request: the body and its JSON header's length. ``input_format`` "binary" sends
    the tensors after the JSON header (the binary tensor data extension); "json" puts them in it
    as ``data`` lists (the body is then the JSON alone, its length the header's).
    ``output_format``: whether the server is asked for binary outputs (``binary_data_output``) or
    JSON ones. The header's ``parameters`` object comes last (the load generator adds sequence
    parameters just before its closing brace).

    With ``places`` (system shared memory), each input names its region and carries no data, and
    each output of ``places.outputs`` is requested with its region: the body is the JSON header
    alone (its length is the body's)."""
    if input_format not in TENSOR_FORMATS or output_format not in TENSOR_FORMATS:
        raise InvalidArgumentError(f"tensor formats are {' or '.join(TENSOR_FORMATS)}, got input "
                                   f"{input_format!r} and output {output_format!r}")
    header: dict[str, Any] = {"inputs": []}
    buffers = []
    for name, array in inputs.items():
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape),
                                 "datatype": numpy_to_triton_dtype(array.dtype)}
        if places is not None:
            entry["parameters"] = places.inputs[name].parameters()
        elif input_format == "json":
            entry["data"] = _json_data(array)
        else:
            data = array_to_buffer(array)
            entry["parameters"] = {"binary_data_size": len(data)}
            buffers.append(data)
        header["inputs"].append(entry)
    if places is not None and places.outputs:
        header["outputs"] = [{"name": name, "parameters": place.parameters()}
                             for name, place in places.outputs.items()]
    # never empty (the load generator appends members after a comma), and harmless with every
    # output in shared memory: it is only the default for outputs that do not say otherwise
    header["parameters"] = {"binary_data_output": output_format == "binary"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return encoded + b"".join(buffers), len(encoded)


def encode_grpc(model: str, inputs: dict[str, np.ndarray], places: SharedMemoryPlaces | None = None) -> bytes:
    """A serialized ``ModelInferRequest`` with raw contents; with ``places`` (system shared memory),
    inputs and requested outputs with their regions' parameters and no raw contents."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        tensor = request.inputs.add(name=name, datatype=numpy_to_triton_dtype(array.dtype), shape=list(array.shape))
        if places is None:
            request.raw_input_contents.append(array_to_buffer(array))
        else:
            _grpc_place(tensor.parameters, places.inputs[name])
    for name, place in (places.outputs if places is not None else {}).items():
        _grpc_place(request.outputs.add(name=name).parameters, place)
    return request.SerializeToString()


def _grpc_place(parameters: Any, place: TensorPlace) -> None:
    parameters["shared_memory_region"].string_param = place.region
    parameters["shared_memory_byte_size"].int64_param = place.byte_size
    parameters["shared_memory_offset"].int64_param = place.offset_bytes
