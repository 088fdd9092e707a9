"""The ONNX Runtime backend: Triton's ``onnxruntime`` backend (platform ``onnxruntime_onnx``).

One :class:`OnnxRuntimeBackend` is one model instance holding one ``onnxruntime.InferenceSession``
over ``<version>/<default_model_filename or model.onnx>`` (a folder of that name means its
``model.onnx``, as in Triton). What it reproduces of Triton's onnxruntime backend
(``triton-inference-server/onnxruntime_backend``, ``src/onnxruntime.cc``):

* execution providers: CPU for ``KIND_CPU``; CUDA (on ``device_id``) for ``KIND_GPU``, which
  fails the load, naming the model, when onnxruntime-gpu or a CUDA device is missing;
* session options from the model config: ``parameters`` ``intra_op_thread_count``,
  ``inter_op_thread_count`` (0 or absent: onnxruntime's default, one thread per core),
  ``execution_mode`` (0 sequential, 1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``,
  ``session.use_device_allocator_for_initializers``, and ``optimization { graph { level } }``
  (-1 basic, 1 extended, 2 none, anything else all);
* load-time checks, each naming the model and the tensor: every configured input and output must
  exist in the graph with the same datatype (``TYPE_STRING`` is ONNX ``tensor(string)``), and
  dims compatible with the graph's shape (a leading ``-1`` for the batch when ``max_batch_size``
  > 0; ``reshape`` is compared instead of ``dims`` when given); graph inputs the config leaves out
  are an error (onnxruntime could not run without them);
* execution: a batch's requests are concatenated along the batch dimension, run once, and each
  output split back by rows; models without batching (``max_batch_size`` 0) run request by
  request. Every configured output is returned (the server keeps the requested ones).

BYTES inputs travel as object arrays of ``bytes`` and are decoded (UTF-8) into ONNX strings;
string outputs come back encoded as ``bytes``. A request whose input cannot be fed (bad UTF-8, a
datatype other than the config's) fails alone; when onnxruntime rejects a batched run, the
requests are run one by one so only the offending ones fail.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb._optional import require_module
from triton_nb.backends.base import Backend, ModelContext
from triton_nb.errors import (
    InternalError,
    InvalidArgumentError,
    MissingDependencyError,
    NotFoundError,
    UnavailableError,
)
from triton_nb.repository.config import ModelConfig
from triton_nb.tensors import InferRequest, InferResponse, triton_to_numpy_dtype

__all__ = ["DEFAULT_MODEL_FILENAME", "OnnxRuntimeBackend"]

#: The file Triton's onnxruntime backend loads when ``default_model_filename`` is not set.
DEFAULT_MODEL_FILENAME = "model.onnx"

# Config datatype -> the type onnxruntime reports for a graph tensor.
_ONNX_TYPES = {
    "TYPE_BOOL": "tensor(bool)",
    "TYPE_UINT8": "tensor(uint8)",
    "TYPE_UINT16": "tensor(uint16)",
    "TYPE_UINT32": "tensor(uint32)",
    "TYPE_UINT64": "tensor(uint64)",
    "TYPE_INT8": "tensor(int8)",
    "TYPE_INT16": "tensor(int16)",
    "TYPE_INT32": "tensor(int32)",
    "TYPE_INT64": "tensor(int64)",
    "TYPE_FP16": "tensor(float16)",
    "TYPE_FP32": "tensor(float)",
    "TYPE_FP64": "tensor(double)",
    "TYPE_STRING": "tensor(string)",
    "TYPE_BF16": "tensor(bfloat16)",
}
_CONFIG_TYPES = {onnx: config for config, onnx in _ONNX_TYPES.items()}

_TRUE = ("true", "1", "on", "yes")
_FALSE = ("false", "0", "off", "no")


def _datatype_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2 as mc

    return mc.DataType.Name(data_type)


def _describe_onnx_type(onnx_type: str) -> str:
    config_type = _CONFIG_TYPES.get(onnx_type)
    return f"{config_type} ({onnx_type})" if config_type else onnx_type


def _graph_dims(shape: Any) -> list[int]:
    """onnxruntime's shape (ints, symbolic names, None) with every unknown dim as -1."""
    if not isinstance(shape, (list, tuple)):
        return []
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


class OnnxRuntimeBackend(Backend):
    """One instance of an ONNX model, run by onnxruntime. Construct = load."""

    def __init__(self, context: ModelContext) -> None:
        super().__init__(context)
        config = context.config
        self._name = context.name
        self._version = context.version
        self._batching = config.max_batch_size > 0
        #: (compute_input_ns, compute_infer_ns, compute_output_ns) of the last execute call.
        self.last_execution_ns: tuple[int, int, int] | None = None
        ort = require_module("onnxruntime", f"model '{self._name}' (onnxruntime backend)")
        self.model_path = self._model_path(context)
        options = self._session_options(ort, config)
        providers = self._providers(ort, context)
        try:
            self._session = ort.InferenceSession(str(self.model_path), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own pybind exception types
            raise InvalidArgumentError(
                f"unable to load model '{self._name}': onnxruntime cannot load '{self.model_path}': {exc}"
            ) from None
        if context.instance_kind == "KIND_GPU" and "CUDAExecutionProvider" not in self._session.get_providers():
            raise UnavailableError(
                f"unable to load model '{self._name}': instance group kind KIND_GPU, but onnxruntime could not "
                f"use CUDA device {context.device_id} (no usable GPU or CUDA libraries); use KIND_CPU to run on CPU"
            )
        self._inputs = self._check_inputs(config)
        self._outputs = self._check_outputs(config)
        self._output_names = [name for name, _ in self._outputs]

    # ------------------------------------------------------------------ loading

    def _model_path(self, context: ModelContext) -> Path:
        filename = context.config.default_model_filename or DEFAULT_MODEL_FILENAME
        path = context.version_path / filename
        if path.is_dir():  # Triton: a folder named like the model file holds model.onnx
            path = path / DEFAULT_MODEL_FILENAME
        if not path.is_file():
            raise NotFoundError(
                f"unable to load model '{self._name}': unable to find '{path}' "
                f"(the onnxruntime backend loads '{filename}' from version folder {context.version})"
            )
        return path

    def _parameter(self, config: ModelConfig, key: str) -> str | None:
        if key not in config.parameters:
            return None
        return config.parameters[key].string_value

    def _int_parameter(self, config: ModelConfig, key: str) -> int:
        value = self._parameter(config, key)
        if value is None or value.strip() == "":
            return 0
        try:
            return int(value)
        except ValueError:
            raise InvalidArgumentError(
                f"model '{self._name}': parameters.{key}: '{value}' is not an integer"
            ) from None

    def _bool_parameter(self, config: ModelConfig, key: str) -> bool | None:
        value = self._parameter(config, key)
        if value is None:
            return None
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise InvalidArgumentError(f"model '{self._name}': parameters.{key}: '{value}' is not a boolean")

    def _session_options(self, ort: Any, config: ModelConfig) -> Any:
        options = ort.SessionOptions()
        level = config.optimization.graph.level if config.optimization.HasField("graph") else 0
        options.graph_optimization_level = {
            -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        mode = self._int_parameter(config, "execution_mode")
        if mode not in (0, 1):
            raise InvalidArgumentError(
                f"model '{self._name}': parameters.execution_mode: expected 0 (sequential) or 1 (parallel), "
                f"got {mode}"
            )
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
        intra = self._int_parameter(config, "intra_op_thread_count")
        if intra > 0:
            options.intra_op_num_threads = intra
        inter = self._int_parameter(config, "inter_op_thread_count")
        if inter > 0:
            options.inter_op_num_threads = inter
        arena = self._bool_parameter(config, "enable_mem_arena")
        if arena is not None:
            options.enable_cpu_mem_arena = arena
        pattern = self._bool_parameter(config, "enable_mem_pattern")
        if pattern is not None:
            options.enable_mem_pattern = pattern
        key = "session.use_device_allocator_for_initializers"
        value = self._parameter(config, key)
        if value is not None:
            options.add_session_config_entry(key, value)
        return options

    def _providers(self, ort: Any, context: ModelContext) -> list[Any]:
        if context.instance_kind != "KIND_GPU":
            return ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise MissingDependencyError(
                "onnxruntime-gpu", "gpu",
                f"model '{self._name}' (instance group kind KIND_GPU, onnxruntime backend)",
            )
        return [("CUDAExecutionProvider", {"device_id": context.device_id}), "CPUExecutionProvider"]

    def _check_dims(self, tensor_name: str, graph_shape: Any, dims: list[int], exact: bool) -> None:
        """Triton's CompareDimsSupported: the graph's shape against the config's (plus the batch dim)."""
        if not isinstance(graph_shape, (list, tuple)) or len(graph_shape) == 0:
            return  # unknown or scalar: nothing to compare, as Triton does
        model = _graph_dims(graph_shape)
        if self._batching:
            if model[0] != -1:
                raise InvalidArgumentError(
                    f"unable to load model '{self._name}': tensor '{tensor_name}': for the model to support "
                    f"batching (max_batch_size > 0) the graph's first dimension must be dynamic, but the graph "
                    f"has shape {model}"
                )
            full = [-1, *dims]
        else:
            full = list(dims)
        ok = len(model) == len(full) and all(
            m == f for m, f in zip(model, full, strict=True) if exact or m != -1
        )
        if not ok:
            raise InvalidArgumentError(
                f"unable to load model '{self._name}': tensor '{tensor_name}': the model expects shape {model} "
                f"but the configuration specifies {full}"
                + (" (a batch dimension because max_batch_size > 0, then dims)" if self._batching else "")
            )

    def _check_type(self, kind: str, tensor: Any, onnx_type: str) -> str:
        config_type = _datatype_name(tensor.data_type)
        expected = _ONNX_TYPES.get(config_type)
        if expected is None or config_type == "TYPE_BF16":
            raise InvalidArgumentError(
                f"unable to load model '{self._name}': {kind} '{tensor.name}': datatype {config_type} is not "
                "supported by the onnxruntime backend here"
            )
        if expected != onnx_type:
            raise InvalidArgumentError(
                f"unable to load model '{self._name}': configuration expects datatype {config_type} for {kind} "
                f"'{tensor.name}', the model provides {_describe_onnx_type(onnx_type)}"
            )
        return config_type

    def _check_inputs(self, config: ModelConfig) -> list[tuple[str, str, tuple[int, ...] | None]]:
        graph = {node.name: node for node in self._session.get_inputs()}
        overridable = {node.name: node for node in self._session.get_overridable_initializers()}
        declared = set()
        inputs = []
        for tensor in config.input:
            declared.add(tensor.name)
            node = graph.get(tensor.name) or overridable.get(tensor.name)
            if node is None:
                raise InvalidArgumentError(
                    f"unable to load model '{self._name}': configuration input '{tensor.name}' is not an input of "
                    f"the ONNX graph in '{self.model_path}' (graph inputs: {', '.join(graph) or 'none'})"
                )
            if tensor.optional and self._batching:
                raise InvalidArgumentError(
                    f"unable to load model '{self._name}': optional input '{tensor.name}' is not supported for "
                    "models that support batching"
                )
            config_type = self._check_type("input", tensor, node.type)
            shape = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
            self._check_dims(tensor.name, node.shape, shape, exact=False)
            inputs.append((tensor.name, config_type, tuple(shape) if tensor.HasField("reshape") else None))
        missing = [name for name in graph if name not in declared]
        if missing:
            raise InvalidArgumentError(
                f"unable to load model '{self._name}': the ONNX graph needs input(s) "
                f"{', '.join(repr(m) for m in missing)}, which the configuration does not declare"
            )
        return inputs

    def _check_outputs(self, config: ModelConfig) -> list[tuple[str, tuple[int, ...] | None]]:
        graph = {node.name: node for node in self._session.get_outputs()}
        outputs = []
        for tensor in config.output:
            node = graph.get(tensor.name)
            if node is None:
                raise InvalidArgumentError(
                    f"unable to load model '{self._name}': configuration output '{tensor.name}' is not an output "
                    f"of the ONNX graph in '{self.model_path}' (graph outputs: {', '.join(graph) or 'none'})"
                )
            self._check_type("output", tensor, node.type)
            shape = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
            self._check_dims(tensor.name, node.shape, shape, exact=True)
            outputs.append((tensor.name, tuple(tensor.dims) if tensor.HasField("reshape") else None))
        return outputs

    # ------------------------------------------------------------------ execution

    def _feeds(self, request: InferRequest) -> dict[str, np.ndarray]:
        """One request's inputs as onnxruntime takes them; raises InvalidArgumentError for this request."""
        feeds: dict[str, np.ndarray] = {}
        rows = request.batch_size(self._batching)
        for name, config_type, reshape in self._inputs:
            if name not in request.inputs:
                continue  # an optional input (the server checked the required ones)
            array = np.asarray(request.inputs[name])
            if config_type == "TYPE_STRING":
                array = self._decode_strings(name, array)
            else:
                expected = triton_to_numpy_dtype(config_type)
                if array.dtype != expected:
                    raise InvalidArgumentError(
                        f"model '{self._name}': input '{name}' must be {config_type.removeprefix('TYPE_')}, "
                        f"got numpy {array.dtype}"
                    )
            if reshape is not None:
                try:
                    array = array.reshape((rows, *reshape) if self._batching else reshape)
                except ValueError:
                    raise InvalidArgumentError(
                        f"model '{self._name}': input '{name}' of shape {list(array.shape)} cannot be reshaped "
                        f"to the configured reshape {list(reshape)}"
                    ) from None
            feeds[name] = array
        return feeds

    def _decode_strings(self, name: str, array: np.ndarray) -> np.ndarray:
        flat = array.reshape(-1)
        values = []
        for item in flat:
            if isinstance(item, (bytes, bytearray, np.bytes_)):
                try:
                    values.append(bytes(item).decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise InvalidArgumentError(
                        f"model '{self._name}': input '{name}' holds bytes that are not UTF-8 ({exc.reason} at "
                        f"byte {exc.start}); ONNX string tensors need UTF-8 text"
                    ) from None
            else:
                values.append(str(item))
        decoded = np.empty(len(values), dtype=object)
        decoded[:] = values
        return decoded.reshape(array.shape)

    @staticmethod
    def _encode_strings(array: np.ndarray) -> np.ndarray:
        encoded = np.empty(array.size, dtype=object)
        encoded[:] = [item.encode("utf-8") if isinstance(item, str) else bytes(item) for item in array.reshape(-1)]
        return encoded.reshape(array.shape)

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if not self._output_names:
            return []
        return self._session.run(self._output_names, feeds)

    def _respond(self, request: InferRequest, outputs: dict[str, np.ndarray]) -> InferResponse:
        return InferResponse(
            model_name=self._name, model_version=self._version, outputs=outputs, request_id=request.request_id
        )

    def _shape_output(self, name: str, array: np.ndarray, rows: int, dims: tuple[int, ...] | None) -> np.ndarray:
        if array.dtype == object or array.dtype.kind in "SU":
            array = self._encode_strings(np.asarray(array, dtype=object))
        if dims is not None:  # the graph's shape is the reshape; clients see the config's dims
            array = array.reshape((rows, *dims) if self._batching else dims)
        return array

    def _execute_group(self, group: list[tuple[int, InferRequest, dict[str, np.ndarray]]],
                       responses: list[InferResponse | None], timing: list[int]) -> None:
        """Run a group of requests as one batch (or one request) and fill in their responses."""
        started = time.monotonic_ns()
        if len(group) == 1:
            feeds = group[0][2]
        else:
            feeds = {
                name: np.concatenate([item[2][name] for item in group], axis=0) for name in group[0][2]
            }
        inferring = time.monotonic_ns()
        try:
            results = self._run(feeds)
        except Exception as exc:
            if len(group) > 1:  # find the culprit(s): each request alone
                for item in group:
                    self._execute_group([item], responses, timing)
                return
            index, request, _ = group[0]
            responses[index] = InferResponse.failed(
                request, InvalidArgumentError(f"model '{self._name}': onnxruntime failed: {exc}"), self._version
            )
            return
        outputs_at = time.monotonic_ns()
        rows = [request.batch_size(self._batching) for _, request, _ in group]
        total = sum(rows)
        per_request: list[dict[str, np.ndarray]] = [{} for _ in group]
        for (name, dims), result in zip(self._outputs, results, strict=True):
            result = np.asarray(result)
            if self._batching:
                if result.ndim == 0 or result.shape[0] != total:
                    raise InternalError(
                        f"model '{self._name}': output '{name}' has shape {list(result.shape)}, expected "
                        f"{total} rows (one per input row)"
                    )
                pieces = np.split(result, np.cumsum(rows)[:-1], axis=0)
            else:
                pieces = [result]
            for slot, piece, count in zip(per_request, pieces, rows, strict=True):
                slot[name] = self._shape_output(name, piece, count, dims)
        for (index, request, _), outputs in zip(group, per_request, strict=True):
            responses[index] = self._respond(request, outputs)
        ended = time.monotonic_ns()
        timing[0] += inferring - started
        timing[1] += outputs_at - inferring
        timing[2] += ended - outputs_at

    def execute(self, requests: list[InferRequest]) -> list[InferResponse]:
        responses: list[InferResponse | None] = [None] * len(requests)
        timing = [0, 0, 0]
        started = time.monotonic_ns()
        ready: list[tuple[int, InferRequest, dict[str, np.ndarray]]] = []
        for index, request in enumerate(requests):
            try:
                ready.append((index, request, self._feeds(request)))
            except InvalidArgumentError as exc:
                responses[index] = InferResponse.failed(request, exc, self._version)
        timing[0] += time.monotonic_ns() - started
        if self._batching and ready:
            # Requests with different optional inputs cannot share a run (no optional inputs when batching,
            # so in practice this is one group).
            groups: dict[tuple[str, ...], list[tuple[int, InferRequest, dict[str, np.ndarray]]]] = {}
            for item in ready:
                groups.setdefault(tuple(sorted(item[2])), []).append(item)
            for group in groups.values():
                self._execute_group(group, responses, timing)
        else:
            for item in ready:
                self._execute_group([item], responses, timing)
        self.last_execution_ns = (timing[0], timing[1], timing[2])
        missing = [i for i, response in enumerate(responses) if response is None]
        if missing:  # a bug here, never the caller's doing
            raise InternalError(f"model '{self._name}': no response for request(s) {missing}")
        return responses  # type: ignore[return-value]

    def finalize(self) -> None:
        self._session = None
