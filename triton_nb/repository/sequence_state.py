"""Implicit sequence state: the ``sequence_batching.state`` tensors a server keeps between the
requests of a sequence, and their initial values.

Triton (core ``src/sequence_state.cc`` and ``SequenceBatchScheduler::GenerateInitialStateData``,
docs ``user_guide/implicit_state_management.md``) gives each request of a sequence an extra input,
``input_name``, holding the state; the model answers with ``output_name``, which becomes the next
request's input state. A sequence's first request gets the initial state:

* ``initial_state { zero_data: true }``: zeros of its ``dims``;
* ``initial_state { data_file: F }``: the bytes of ``<model folder>/initial_state/F``, row-major
  (``TYPE_STRING``: elements each prefixed with a 4-byte little-endian length, as in warm-up files);
* no ``initial_state``: Triton leaves the memory uninitialised, with every variable dimension 1;
  here it is zeros of that shape (empty bytes for ``TYPE_STRING``), which a model that
  initialises its state on the START flag — what Triton's docs ask of it — cannot tell apart.

With ``max_batch_size`` > 0 each state gets a leading batch dimension of 1.

This module reads and checks the settings (load-time errors in Triton's words); the sequence
batcher (:mod:`triton_nb.server.scheduling.sequence`) carries the tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InvalidArgumentError
from triton_nb.repository.config import CONFIG_FILENAME, ModelConfig, Problem
from triton_nb.repository.warmup import decode_bytes_elements, numpy_dtype_of

__all__ = ["INITIAL_STATE_FOLDER", "StateSpec", "check_sequence_state", "state_specs"]

#: The folder of a model that holds ``initial_state.data_file`` files (Triton's ``kInitialStateFolder``).
INITIAL_STATE_FOLDER = "initial_state"


@dataclass(frozen=True)
class StateSpec:
    """One implicit state of a model: its input and output tensor names and the initial value
    its sequences start from (batch dimension included when the model batches)."""

    input_name: str
    output_name: str
    initial: np.ndarray


def state_specs(config: ModelConfig, model_path: str | os.PathLike[str]) -> tuple[StateSpec, ...]:
    """The implicit states of ``config`` (empty without ``sequence_batching.state``); raises
    :class:`InvalidArgumentError` in Triton's words for a setting Triton refuses at load."""
    specs: list[StateSpec] = []
    seen_inputs: set[str] = set()
    seen_outputs: set[str] = set()
    for state in config.sequence_batching.state:
        if not state.input_name or not state.output_name:
            raise InvalidArgumentError(f"sequence batching state of model '{config.name}' must set both "
                                       "'input_name' and 'output_name'")
        # Triton logs a warning and ignores a duplicate; refusing it says more
        if state.input_name in seen_inputs or state.output_name in seen_outputs:
            name = state.input_name if state.input_name in seen_inputs else state.output_name
            raise InvalidArgumentError(f"State input name '{name}' specified more than once.")
        seen_inputs.add(state.input_name)
        seen_outputs.add(state.output_name)
        if state.data_type == mc.TYPE_INVALID:
            raise InvalidArgumentError(f"sequence batching state '{state.input_name}' of model '{config.name}' "
                                       "needs a data_type")
        dtype = numpy_dtype_of(state.data_type)
        if len(state.initial_state) > 1:
            raise InvalidArgumentError(f"initial_state field for state input '{state.input_name}' must contain "
                                       f"exactly one or zero element. Found '{len(state.initial_state)}' elements.")
        if state.initial_state:
            values = _initial_values(state, state.initial_state[0], dtype, Path(model_path))
        else:
            shape = tuple(1 if d == -1 else d for d in state.dims)
            values = np.full(shape, b"", dtype=object) if state.data_type == mc.TYPE_STRING else np.zeros(shape, dtype)
        if config.max_batch_size > 0:
            values = values.reshape((1, *values.shape))
        values.setflags(write=False)  # shared by every sequence that starts from it
        specs.append(StateSpec(state.input_name, state.output_name, values))
    return tuple(specs)


def _initial_values(state: mc.ModelSequenceBatching.State, initial: mc.ModelSequenceBatching.InitialState,
                    dtype: np.dtype, model_path: Path) -> np.ndarray:
    """Triton's checks of one ``initial_state``, in its words, and the values it gives."""
    name = state.input_name
    if initial.data_type != state.data_type:
        raise InvalidArgumentError(f"The data type used for 'initial_state' field of state '{name}' does not match "
                                   "the state data type.")
    if not initial.name:
        raise InvalidArgumentError(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(initial.dims) != len(state.dims):
        raise InvalidArgumentError(f"Number of dimensions in 'initial_state' doesn't match the size of 'state' "
                                   f"dimensions for state input '{name}'. {len(initial.dims)} != {len(state.dims)}")
    for given, declared in zip(initial.dims, state.dims, strict=True):
        if given == -1:
            raise InvalidArgumentError(f"'initial_state' field for state input name '{name}' contains variable "
                                       "dimensions.")
        if declared != -1 and given != declared:
            raise InvalidArgumentError(f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                                       f"description. {given} != {declared}")
    shape = tuple(initial.dims)
    count = int(np.prod(shape, dtype=np.int64))
    source = initial.WhichOneof("state_data")
    if source == "zero_data":
        return np.full(shape, b"", dtype=object) if dtype == np.object_ else np.zeros(shape, dtype)
    if source != "data_file":
        raise InvalidArgumentError(f"initial_state of state input '{name}' must set 'zero_data' or 'data_file'")
    relative = PurePosixPath(initial.data_file)
    if not initial.data_file or relative.is_absolute() or ".." in relative.parts or "\\" in initial.data_file:
        raise InvalidArgumentError(f"initial_state of state input '{name}': data_file '{initial.data_file}' must be a "
                                   f"file name inside the model's '{INITIAL_STATE_FOLDER}/' folder")
    path = model_path.joinpath(INITIAL_STATE_FOLDER, *relative.parts)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"initial_state of state input '{name}': cannot read "
                                   f"{INITIAL_STATE_FOLDER}/{initial.data_file}: {exc.strerror or exc}") from exc
    if dtype == np.object_:
        elements = decode_bytes_elements(data)
        if len(elements) < count:
            raise InvalidArgumentError(f"initial_state of state input '{name}' expects {count} string elements, but "
                                       f"{initial.data_file} holds {len(elements)}")
        values = np.empty(count, dtype=object)
        values[:] = elements[:count]
        return values.reshape(shape)
    needed = count * dtype.itemsize
    if len(data) < needed:
        raise InvalidArgumentError(f"initial_state setting expects {needed} bytes, but the data provided from "
                                   f"{initial.data_file}only has {len(data)} bytes.")  # sic: Triton's words
    return np.frombuffer(data[:needed], dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def check_sequence_state(config: ModelConfig, model: str, model_path: str | os.PathLike[str],
                         file: str = CONFIG_FILENAME) -> list[Problem]:
    """What is wrong with ``sequence_batching.state`` of one model, as its load would say it;
    also where a state tensor's name collides with an input or output of the model."""
    if not config.sequence_batching.state:
        return []
    try:
        state_specs(config, model_path)
    except InvalidArgumentError as exc:
        return [Problem(model, file, "sequence_batching.state", str(exc))]
    problems = []
    inputs = {t.name for t in config.input}
    for i, state in enumerate(config.sequence_batching.state):
        if state.input_name in inputs:
            problems.append(Problem(model, file, f"sequence_batching.state[{i}].input_name",
                                    f"state input '{state.input_name}' is also an input of the model: the server "
                                    "supplies it, so a request must not"))
    return problems
