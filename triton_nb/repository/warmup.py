"""Triton's model warm-up samples (``model_warmup`` in ``config.pbtxt``): their data, and checks.

A warm-up sample is a request Triton builds itself and runs on every instance of a model version
while the version loads, so the first user request does not pay for lazy initialisation. This
module turns the ``ModelWarmup`` messages of a config into the tensors of those requests, with
the rules of Triton's core (``TritonModelInstance::GenerateWarmupData`` in
triton-inference-server/core ``src/backend_model_instance.cc``), and checks them without running
anything (``triton-nb validate``). The server runs them (:mod:`triton_nb.server.models.warmup`).

Triton's rules, confirmed against tritonserver 2.51:

* ``dims`` exclude the batch dimension; a batching model (``max_batch_size`` > 0) gets each
  request as ``[1, *dims]``, and ``batch_size: N`` means N such one-row requests executed
  together in one batch (not one request of N rows); ``count`` repeats the sample (0 means 1);
  ``batch_size: 0`` skips the sample;
* every dim must be fixed (no -1), and one of ``zero_data``, ``random_data`` or
  ``input_data_file`` must be set, else the load fails in Triton's words;
* ``zero_data`` is zeros; for ``TYPE_STRING`` it is empty strings (Triton hands the backend a
  zeroed buffer, i.e. 4-byte length prefixes of 0). ``random_data`` is random bytes for the
  fixed-size types (any bit pattern, so floats may be huge or NaN) and, as in Triton, empty
  strings for ``TYPE_STRING``;
* ``input_data_file`` is read from ``<model folder>/warmup/<file>``: raw little-endian values for
  the fixed-size types (a longer file is fine, only the first bytes are used; a shorter one fails
  the load), and for ``TYPE_STRING`` elements each prefixed with its length as a 4-byte
  little-endian integer, exactly the tensor's element count of them;
* an input the model does not declare is handed to the backend as well (Triton treats it as a
  control input); a required input the sample lacks fails the load.

Where Triton 2.51 crashes instead of failing the load — a ``batch_size`` above
``max_batch_size``, or above 1 for a model that does not batch (the proto documents "must be
1") — triton_nb refuses the sample with a clear error.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import triton_to_np_dtype

from triton_nb.errors import InvalidArgumentError
from triton_nb.repository.config import CONFIG_FILENAME, ModelConfig, Problem

__all__ = [
    "WARMUP_FOLDER",
    "WarmupSample",
    "add_file_sample",
    "add_zero_sample",
    "check_warmup",
    "decode_bytes_elements",
    "encode_bytes_elements",
    "warmup_samples",
]

#: The folder of a model that holds the ``input_data_file`` files (Triton's ``kWarmupDataFolder``).
WARMUP_FOLDER = "warmup"

_STRING = mc.TYPE_STRING
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class WarmupSample:
    """One sample ready to run: the tensors of one request and how to repeat it."""

    name: str
    batch_size: int  # how many requests run together (each one row when the model batches)
    count: int  # how many times the batch runs (>= 1)
    inputs: dict[str, np.ndarray]  # one request's tensors, [1, *dims] when the model batches


# --------------------------------------------------------------------------- BYTES layout


def encode_bytes_elements(values: np.ndarray | list[bytes | str]) -> bytes:
    """BYTES elements in Triton's serialized layout: each a 4-byte little-endian length, then
    its bytes (text is UTF-8). This is what an ``input_data_file`` of a ``TYPE_STRING`` input holds."""
    parts = []
    for value in np.asarray(values, dtype=object).ravel():
        data = value.encode() if isinstance(value, str) else bytes(value)
        parts.append(_LENGTH.pack(len(data)) + data)
    return b"".join(parts)


def decode_bytes_elements(data: bytes) -> list[bytes]:
    """The elements of Triton's serialized BYTES layout; InvalidArgumentError if it is cut short."""
    elements, offset = [], 0
    while offset < len(data):
        if offset + _LENGTH.size > len(data):
            raise InvalidArgumentError(f"{len(data) - offset} trailing byte(s) at offset {offset} are too few for "
                                       "a 4-byte length prefix")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > len(data):
            raise InvalidArgumentError(f"element {len(elements)} declares {length} bytes at offset {offset} but only "
                                       f"{len(data) - offset} remain")
        elements.append(bytes(data[offset:offset + length]))
        offset += length
    return elements


# --------------------------------------------------------------------------- building samples


def numpy_dtype_of(data_type: int) -> np.dtype:
    name = mc.DataType.Name(data_type).removeprefix("TYPE_")
    numpy_type = triton_to_np_dtype("BYTES" if name == "STRING" else name)
    if numpy_type is None:
        raise InvalidArgumentError(f"data type {name} has no numpy equivalent")
    return np.dtype(numpy_type)


def _data_file(model_path: Path, sample: str, tensor: str, filename: str) -> Path:
    relative = PurePosixPath(filename)
    if not filename or relative.is_absolute() or ".." in relative.parts or "\\" in filename:
        raise InvalidArgumentError(f"warmup sample '{sample}' input '{tensor}': input_data_file '{filename}' must be "
                                   f"a file name inside the model's '{WARMUP_FOLDER}/' folder")
    return model_path.joinpath(WARMUP_FOLDER, *relative.parts)


def _input_array(model: str, model_path: Path, sample: str, tensor: str, spec: mc.ModelWarmup.Input,
                 rng: np.random.Generator) -> np.ndarray:
    """The data of one input of one request, without the batch dimension."""
    dims = tuple(spec.dims)
    if any(d < 0 for d in dims):  # Triton's words
        raise InvalidArgumentError(f"warmup sample '{sample}': warmup setting expects all variable-size dimensions "
                                   f"are specified for input '{tensor}'")
    if spec.data_type == mc.TYPE_INVALID:
        raise InvalidArgumentError(f"warmup sample '{sample}': input '{tensor}' needs a data_type")
    dtype = numpy_dtype_of(spec.data_type)
    count = math.prod(dims)
    kind = spec.WhichOneof("input_data_type")
    if kind is None:  # Triton's words
        raise InvalidArgumentError(f"warmup sample '{sample}': warmup setting expects input '{tensor}' to have "
                                   "input_data_type set")
    if kind == "zero_data" or (kind == "random_data" and spec.data_type == _STRING):
        # Triton hands a zeroed buffer, and uses one for random strings too: empty strings
        return np.full(dims, b"", dtype=object) if spec.data_type == _STRING else np.zeros(dims, dtype)
    if kind == "random_data":
        raw = np.frombuffer(rng.bytes(count * dtype.itemsize), dtype=np.uint8)
        return (raw != 0).reshape(dims) if dtype == np.bool_ else raw.view(dtype).reshape(dims).copy()
    path = _data_file(model_path, sample, tensor, spec.input_data_file)
    try:
        data = path.read_bytes()
    except OSError as exc:  # Triton: "failed to open text file for read <path>: <reason>"
        raise InvalidArgumentError(f"warmup sample '{sample}' input '{tensor}': failed to open text file for read "
                                   f"{path}: {exc.strerror or exc}") from None
    if spec.data_type == _STRING:
        try:
            elements = decode_bytes_elements(data)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"warmup sample '{sample}' input '{tensor}': {spec.input_data_file} is not in "
                                       f"Triton's BYTES layout (4-byte little-endian length, then the bytes): "
                                       f"{exc}") from None
        if len(elements) != count:  # Triton's words
            raise InvalidArgumentError(f"warmup sample '{sample}': expected {count} string elements for inference "
                                       f"input '{tensor}' for model '{model}', got {len(elements)}")
        array = np.empty(count, dtype=object)
        array[:] = elements
        return array.reshape(dims)
    needed = count * dtype.itemsize
    if len(data) < needed:  # Triton's words (with the space it leaves out)
        raise InvalidArgumentError(f"warmup sample '{sample}' input '{tensor}': warmup setting expects {needed} bytes, "
                                   f"but the data provided from {spec.input_data_file} only has {len(data)} bytes")
    array = np.frombuffer(data, dtype=dtype, count=count)
    if sys.byteorder == "big":
        array = array.byteswap()
    return array.reshape(dims).copy()


def warmup_samples(config: ModelConfig, model_path: str | os.PathLike[str], *,
                   rng: np.random.Generator | None = None) -> list[WarmupSample]:
    """The samples of ``config`` (the model in folder ``model_path``) ready to run, in order;
    ``batch_size: 0`` samples are left out, as Triton skips them. Raises
    :class:`~triton_nb.errors.InvalidArgumentError` naming the sample and the input for what would
    fail the load before anything ran (the model's own checks of the request come later)."""
    model = config.name
    model_path = Path(model_path)
    rng = rng if rng is not None else np.random.default_rng()
    batching = config.max_batch_size > 0
    samples = []
    for setting in config.model_warmup:
        name = setting.name
        if setting.batch_size == 0:
            continue
        if not batching and setting.batch_size != 1:
            raise InvalidArgumentError(f"warmup sample '{name}': batch_size must be 1 for a model that does not batch "
                                       f"(max_batch_size 0), got {setting.batch_size}")
        if batching and setting.batch_size > config.max_batch_size:
            raise InvalidArgumentError(f"warmup sample '{name}': batch_size {setting.batch_size} is above the model's "
                                       f"max_batch_size {config.max_batch_size}")
        inputs = {}
        for tensor, spec in setting.inputs.items():
            array = _input_array(model, model_path, name, tensor, spec, rng)
            inputs[tensor] = array[np.newaxis] if batching else array
        samples.append(WarmupSample(name, setting.batch_size, max(setting.count, 1), inputs))
    return samples


# --------------------------------------------------------------------------- static checks


def check_warmup(config: ModelConfig, model: str, model_path: str | os.PathLike[str],
                 file: str = CONFIG_FILENAME) -> list[Problem]:
    """What is wrong with the warm-up samples of one model, without running them: settings Triton
    refuses, data files that are missing or of the wrong size, inputs that do not match the
    config (data type, dims, required inputs; skipped when the config lists no inputs, as a
    Python model that completes its config in code may). Empty when there is nothing to say."""
    problems: list[Problem] = []
    if not config.model_warmup or config.platform == "ensemble":  # an ensemble's warm-up is config.py's error
        return problems
    inputs = {t.name: t for t in config.input}
    seen: set[str] = set()
    for index, setting in enumerate(config.model_warmup):
        where = f"model_warmup[{index}]"

        def problem(field: str, message: str, severity: str = "error", where: str = where) -> None:
            problems.append(Problem(model, file, f"{where}{field}", message, severity))

        name = setting.name
        if not name:
            problem(".name", "the sample has no name: a failure could not say which sample failed", "warning")
        elif name in seen:
            problem(".name", f"another sample is named '{name}' too", "warning")
        seen.add(name)
        if setting.batch_size == 0:
            problem(".batch_size", f"sample '{name}' has batch_size 0: Triton skips it", "warning")
            continue
        single = ModelConfig()
        single.CopyFrom(config)
        single.name = model  # a config may leave its name to the folder
        del single.model_warmup[:]
        single.model_warmup.add().CopyFrom(setting)
        try:
            (sample,) = warmup_samples(single, model_path)
        except InvalidArgumentError as exc:
            problem("", str(exc))
            continue
        for tensor, spec in setting.inputs.items():
            field = f".inputs['{tensor}']"
            if spec.WhichOneof("input_data_type") == "input_data_file" and spec.data_type != _STRING:
                size = _data_file(Path(model_path), name, tensor, spec.input_data_file).stat().st_size
                needed = sample.inputs[tensor].nbytes
                if size > needed:
                    problem(f"{field}.input_data_file", f"{spec.input_data_file} has {size} bytes; sample '{name}' "
                            f"uses its first {needed} (Triton ignores the rest)", "warning")
            if not inputs:
                continue
            declared = inputs.get(tensor)
            if declared is None:
                problem(field, f"sample '{name}': '{tensor}' is not an input of the model; Triton hands it to the "
                        "backend anyway (as a control input)", "warning")
                continue
            if declared.data_type != spec.data_type:
                given, expected = mc.DataType.Name(spec.data_type), mc.DataType.Name(declared.data_type)
                problem(f"{field}.data_type", f"sample '{name}': input '{tensor}' is {given} but the model expects "
                        f"{expected}")
            if not _dims_match(tuple(declared.dims), tuple(spec.dims)):
                problem(f"{field}.dims", f"sample '{name}': input '{tensor}' has dims {list(spec.dims)} but the model "
                        f"declares {list(declared.dims)} (warm-up dims exclude the batch dimension)")
        if inputs:
            missing = [t.name for t in config.input if not t.optional and t.name not in setting.inputs]
            if missing:
                problem(".inputs", f"sample '{name}' lacks the required input(s) {', '.join(missing)}")
    return problems


def _dims_match(declared: tuple[int, ...], given: tuple[int, ...]) -> bool:
    return len(declared) == len(given) and all(d in (-1, g) for d, g in zip(declared, given, strict=True))


# --------------------------------------------------------------------------- writing samples


def add_zero_sample(config: ModelConfig, name: str, batch_size: int = 1) -> mc.ModelWarmup:
    """Append a sample of ``zero_data`` for every input of ``config`` (dims as declared; a
    variable dim becomes 1) and return it."""
    sample = config.model_warmup.add(name=name, batch_size=batch_size)
    for tensor in config.input:
        spec = sample.inputs[tensor.name]
        spec.data_type = tensor.data_type
        spec.dims.extend(1 if d < 0 else d for d in tensor.dims)
        spec.zero_data = True
    return sample


def add_file_sample(config: ModelConfig, model_path: str | os.PathLike[str], name: str,
                    values: Mapping[str, np.ndarray], filenames: Mapping[str, str]) -> mc.ModelWarmup:
    """Append a sample whose every input comes from an ``input_data_file``: ``values[input]``
    (one request's tensor, without the batch dimension) is written to
    ``<model_path>/warmup/<filenames[input]>`` in Triton's layout. Returns the sample."""
    folder = Path(model_path) / WARMUP_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    sample = config.model_warmup.add(name=name, batch_size=1)
    for tensor in config.input:
        dtype = np.dtype(object) if tensor.data_type == _STRING else numpy_dtype_of(tensor.data_type)
        array = np.asarray(values[tensor.name], dtype=dtype)
        if tensor.data_type == _STRING:
            data = encode_bytes_elements(array)
        else:
            data = (array.byteswap() if sys.byteorder == "big" else array).tobytes()  # little-endian, as Triton reads
        (folder / filenames[tensor.name]).write_bytes(data)
        spec = sample.inputs[tensor.name]
        spec.data_type = tensor.data_type
        spec.dims.extend(array.shape)
        spec.input_data_file = filenames[tensor.name]
    return sample
