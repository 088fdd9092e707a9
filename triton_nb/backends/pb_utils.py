"""triton_nb's ``triton_python_backend_utils``: the module a Triton Python-backend ``model.py`` imports.

A ``model.py`` written for NVIDIA Triton's Python backend does ``import triton_python_backend_utils
as pb_utils``; :mod:`triton_nb.backends.python` makes that name resolve to this module, so the
model runs unchanged, in-process (no stub process, no shared memory). Everything here follows
the real module's names, signatures and semantics (its pure-Python part and the classes Triton's
stub binds into it in C++), and this module holds that surface only; larger parts are defined in
private modules beside it and imported here:

* :class:`Tensor`, the type helpers, ``serialize_byte_tensor`` / ``deserialize_bytes_tensor``
  and ``TRITON_STRING_TO_NUMPY`` (:mod:`triton_nb.backends._pb_tensor`);
* :class:`InferenceRequest` — what ``execute()`` receives, and the BLS request a model builds
  to call another model (``exec()``, ``exec(decoupled=True)``, ``async_exec()``) —,
  :class:`InferenceResponse`, :class:`InferenceResponseSender`, :class:`ResponseIterator` and
  the request and response flags (:mod:`triton_nb.backends._pb_inference`);
* :class:`TritonError` (with Triton's error codes) and :class:`TritonModelException`
  (:mod:`triton_nb.backends._pb_errors`);
* here: :class:`Logger`, :class:`ModelConfig` (auto-complete), the ``get_*_by_name`` helpers,
  :func:`get_model_dir`, the memory constants, :class:`MetricFamily` / :class:`Metric` — custom
  counters, gauges and histograms, exported on the server's ``/metrics`` as Triton exports them
  (see :mod:`triton_nb.backends.custom_metrics` for scopes and lifetime) — and
  :func:`load_model` / :func:`unload_model` / :func:`is_model_ready`, the model loading API (in
  explicit model control mode only, with Triton's errors).

How BLS, ``Logger`` and ``get_model_dir`` find the calling model and its server (a context
variable set around every call into the model, plus a registry of the model's modules for the
threads it starts) is described in :mod:`triton_nb.backends._pb_context`; the backend's side of
these objects is :mod:`triton_nb.backends._pb_bridge`.
"""

from __future__ import annotations

import enum
import json
import logging
import weakref
from typing import TYPE_CHECKING, Any

from triton_nb.backends._pb_context import CallContext, current_context, require_server
from triton_nb.backends._pb_errors import TritonError, TritonModelException
from triton_nb.backends._pb_inference import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
    PreferredMemory,
    ResponseIterator,
)
from triton_nb.backends._pb_tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from triton_nb.backends.custom_metrics import CUSTOM_METRICS, CustomMetricError
from triton_nb.errors import TritonNBError

if TYPE_CHECKING:
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
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricKind",
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


class MemoryType(enum.IntEnum):
    """Where BLS outputs should be placed; everything is CPU memory here."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


# --------------------------------------------------------------------------- the calling model


def get_model_dir() -> str:
    """The folder holding the calling model's ``model.py`` (its version folder), as in Triton."""
    context = current_context()
    if context is None:
        raise TritonModelException("get_model_dir(): not called from a model served by triton_nb")
    return context.model_dir


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


_ROOT_LOGGER = logging.getLogger("triton_nb.python_backend")


def _model_logger() -> logging.Logger:
    context = current_context()
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
    context = require_server("is_model_ready()")
    assert context.server is not None
    return bool(context.server.is_model_ready(model_name, int(model_version) if model_version else None))


# Triton core's refusal in every mode but explicit (ModelRepositoryManager::LoadUnloadModel says
# "polling" for mode none too).
_NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


def _control_error(context: CallContext, verb: str, message: str) -> TritonModelException:
    # the stub's prefix, then the backend's own around what the server said (python_be.cc's
    # ProcessMessage names the instance)
    instance = context.instance_name or f"{context.model_name}_0"
    return TritonModelException(
        f"Failed to {verb} model: Failed to process the request for model '{instance}', message: {message}")


def _model_control(what: str) -> tuple[CallContext, ServerHandle]:
    context = require_server(f"{what}()")
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
# Families and series live in triton_nb.backends.custom_metrics.CUSTOM_METRICS (one registry per process,
# as Triton's): a Metric created while a served model's code runs (initialize, execute, finalize,
# or a thread it started) belongs to that model's server and version, is exported on that server's
# /metrics and goes when the version unloads; one created outside any model (a notebook cell, a
# module's top level at import) is exported by every server of the process and lives as long as
# its Metric object. A model's own process (python_process) mirrors its metrics to its server, which
# exports them.


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _metric_owner() -> tuple[object, str, int] | None:
    """(server scope, model, version) of the calling model; None outside a served model."""
    context = current_context()
    if context is None or context.server is None:
        return None
    scope = getattr(getattr(context.server, "stats", None), "custom_scope", None)
    return None if scope is None else (scope, context.model_name, context.model_version)


class Metric:
    """One labelled series of a :class:`MetricFamily`, exported on ``/metrics`` (Triton's
    ``pb_utils.Metric``: ``increment``, ``set``, ``observe``, ``value``, with Triton's errors)."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels = dict(labels)
        try:
            self._handle = CUSTOM_METRICS.metric(family._registered, self.labels, buckets, _metric_owner())
        except CustomMetricError as exc:
            raise TritonModelException(f"Error when creating Metric: {exc}") from None
        family._handles.add(self._handle)  # no reference to the family: its deletion clears this metric

    def _run(self, what: str, operation: Any, *args: float) -> Any:
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
