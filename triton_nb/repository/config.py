"""Triton model configuration: ``config.pbtxt`` read, written, completed and checked.

Configs are ``tritonclient.grpc.model_config_pb2.ModelConfig`` messages, read and written with
protobuf's own ``text_format`` and ``json_format``: there is no hand-written parser, and a field
the schema does not know is an error, as it is in Triton.

* :func:`load_config` / :func:`parse_config` / :func:`format_config` / :func:`save_config` —
  the text format (``config.pbtxt``);
* :func:`config_to_json` / :func:`config_from_json` — Triton's JSON conventions (proto field
  names, enums as strings, 64-bit integers as numbers, as Triton's ``/config`` endpoint does);
* :func:`effective_config` — the defaults Triton applies to an incomplete config, so the server
  and the validator see the same thing;
* :func:`check_model_config` — the per-model rules (backend files, FIL's tensors and
  parameters, ensemble restrictions), each problem naming the model, file and field.
  Rules across models (ensemble steps) are in :mod:`triton_nb.repository.validate`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.repository.fields import check_fields
from triton_nb.repository.fil_semantics import answer_row_dims

__all__ = [
    "CONFIG_FILENAME",
    "FIL_MODEL_FILENAMES",
    "ModelConfig",
    "Problem",
    "check_model_config",
    "config_from_json",
    "config_to_json",
    "effective_config",
    "fil_parameters",
    "format_config",
    "load_config",
    "model_filename",
    "parse_config",
    "preferred_batch_sizes",
    "save_config",
]

ModelConfig = mc.ModelConfig
CONFIG_FILENAME = "config.pbtxt"
#: The model_type FIL reads when a config names none: XGBoost's legacy binary format.
_FIL_DEFAULT_MODEL_TYPE = "xgboost"

#: Triton FIL backend: the file each ``model_type`` loads from a version folder.
FIL_MODEL_FILENAMES: dict[str, str] = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}

#: The file other backends load when ``default_model_filename`` is not set.
_BACKEND_MODEL_FILENAMES = {"python": "model.py", "onnxruntime": "model.onnx"}

# FIL parameters: name -> allowed values (None: any value of the stated kind).
_FIL_BOOLEAN = ("true", "false")
_FIL_PARAMETERS: dict[str, tuple[str, ...] | None] = {
    "model_type": tuple(FIL_MODEL_FILENAMES),
    "output_class": _FIL_BOOLEAN,
    "predict_proba": _FIL_BOOLEAN,
    "threshold": None,
    "storage_type": ("AUTO", "DENSE", "SPARSE", "SPARSE8"),
    "algo": ("ALGO_AUTO", "NAIVE", "TREE_REORG", "BATCH_TREE_REORG"),
    "threads_per_tree": None,
    "blocks_per_sm": None,
    "transfer_threshold": None,
    "use_experimental_optimizations": _FIL_BOOLEAN,
    "layout": ("depth_first", "breadth_first", "layered"),
    "chunk_size": None,
    "is_classifier": _FIL_BOOLEAN,
    "cpu_nthread": None,
    "xgboost_allow_unknown_field": _FIL_BOOLEAN,
}
_FIL_NUMERIC = {"threshold": float, "threads_per_tree": int, "blocks_per_sm": int,
                "transfer_threshold": int, "cpu_nthread": int, "chunk_size": int}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a repository: where it is and what Triton would say about it."""

    model: str
    file: str
    field: str
    message: str
    severity: str = "error"  # or "warning": Triton loads the model anyway

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{self.severity}: model '{self.model}': {where}: {self.message}"


# --------------------------------------------------------------------------- text and JSON


def parse_config(text: str, source: str = CONFIG_FILENAME) -> ModelConfig:
    """Parse ``config.pbtxt`` text; a syntax error or unknown field names ``source`` and the line."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise InvalidArgumentError(f"{source}: {exc}") from None
    return config


def load_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read a ``config.pbtxt`` file (or the one inside a model folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILENAME
    if not path.is_file():
        raise NotFoundError(f"no model configuration at {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"{path}: not UTF-8 text ({exc})") from None
    return parse_config(text, source=str(path))


def format_config(config: ModelConfig) -> str:
    """The text format, as Triton and its docs write it."""
    return text_format.MessageToString(config)


def save_config(config: ModelConfig, path: str | os.PathLike[str]) -> Path:
    """Write ``config.pbtxt`` (``path`` may be the model folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILENAME
    path.write_text(format_config(config), encoding="utf-8")
    return path


def _int64_to_numbers(value: Any, descriptor: Any) -> Any:
    """json_format writes 64-bit integers as strings; Triton's JSON has them as numbers."""
    if not isinstance(value, dict):
        return value
    for name, item in value.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        wide = field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64)
        if field.message_type is not None:
            entry = field.message_type
            if entry.GetOptions().map_entry:  # map<string, Message>: convert each value
                value_field = entry.fields_by_name["value"]
                if value_field.message_type is not None:
                    value[name] = {k: _int64_to_numbers(v, value_field.message_type) for k, v in item.items()}
                continue
            if isinstance(item, list):
                value[name] = [_int64_to_numbers(v, entry) for v in item]
            else:
                value[name] = _int64_to_numbers(item, entry)
        elif wide:
            value[name] = [int(v) for v in item] if isinstance(item, list) else int(item)
    return value


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton's JSON: proto field names, enum names, numbers for int64, and
    fields left at their defaults printed too (``"kind": "KIND_AUTO"``, ``"count": 0``), as
    Triton's model-configuration endpoint prints them."""
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _int64_to_numbers(data, ModelConfig.DESCRIPTOR)


def config_from_json(data: dict[str, Any] | str, source: str = "config JSON") -> ModelConfig:
    """Parse Triton's JSON form (as ``parameters.config`` of a repository load request)."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{source}: expected a JSON object, got {type(data).__name__}")
    config = ModelConfig()
    try:
        json_format.ParseDict(data, config)
    except json_format.ParseError as exc:
        raise InvalidArgumentError(f"{source}: {exc}") from None
    return config


# --------------------------------------------------------------------------- Triton's defaults


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == "ensemble"


def effective_config(
    config: ModelConfig, folder_name: str | None = None, *, gpu_available: bool = False
) -> ModelConfig:
    """A copy of ``config`` completed the way Triton completes it when loading.

    ``name`` defaults to the model folder's name; ``version_policy`` to ``latest { num_versions:
    1 }``; a non-ensemble model without instance groups gets one group of count 1, and each
    group's ``count`` (0 -> 1), ``kind`` (``KIND_AUTO`` -> GPU when a GPU is there, else CPU) and
    ``name`` are filled in; ``onnxruntime_onnx`` and ``onnxruntime`` imply each other; a
    non-ensemble model's ``optimization`` gets Triton's pinned-memory defaults (``enable: true``
    for input and output, unless set), a Python model ``default_model_filename: "model.py"`` and
    an ensemble an empty ``model_transaction_policy``, so that the config has the fields real
    Triton's has; a sequence batcher without ``max_sequence_idle_microseconds`` gets Triton's 1 s.
    """
    effective = ModelConfig()
    effective.CopyFrom(config)
    if folder_name is not None:
        if not effective.name:
            effective.name = folder_name
        elif effective.name != folder_name:
            raise InvalidArgumentError(
                f"model '{folder_name}': {CONFIG_FILENAME}: name: '{effective.name}' does not match the "
                f"model folder name '{folder_name}'"
            )
    if effective.version_policy.WhichOneof("policy_choice") is None:
        effective.version_policy.latest.num_versions = 1
    if effective.platform == "onnxruntime_onnx" and not effective.backend:
        effective.backend = "onnxruntime"
    elif effective.backend == "onnxruntime" and not effective.platform:
        effective.platform = "onnxruntime_onnx"
    if effective.HasField("sequence_batching") and not effective.sequence_batching.max_sequence_idle_microseconds:
        effective.sequence_batching.max_sequence_idle_microseconds = 1_000_000  # Triton's default, shown in its config
    if is_ensemble(effective):
        effective.model_transaction_policy.SetInParent()  # Triton shows {"decoupled": false} for ensembles
    else:
        if effective.backend == "python" and not effective.default_model_filename:
            effective.default_model_filename = "model.py"  # the Python backend's auto-complete sets it
        # Triton's own defaults, which its config JSON shows: pinned host buffers for GPU copies
        for pinned in ("input_pinned_memory", "output_pinned_memory"):
            if not effective.optimization.HasField(pinned):
                getattr(effective.optimization, pinned).enable = True
        default_kind = mc.ModelInstanceGroup.KIND_GPU if gpu_available else mc.ModelInstanceGroup.KIND_CPU
        if not effective.instance_group:
            group = effective.instance_group.add()
            group.name = effective.name
            group.kind = default_kind
            group.count = 1
        for index, group in enumerate(effective.instance_group):
            if group.count < 1:
                group.count = 1
            if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
                group.kind = default_kind
            if not group.name:
                group.name = f"{effective.name}_{index}"
    return effective


def preferred_batch_sizes(config: ModelConfig) -> list[int]:
    """The batch sizes the dynamic batcher aims for: the configured ones, or ``[max_batch_size]``."""
    sizes = list(config.dynamic_batching.preferred_batch_size)
    return sizes or ([config.max_batch_size] if config.max_batch_size > 0 else [])


def fil_parameters(config: ModelConfig) -> dict[str, str]:
    """The string values of ``parameters``, as the FIL backend reads them."""
    return {name: value.string_value for name, value in config.parameters.items()}


def model_filename(config: ModelConfig) -> str | None:
    """The file a version folder must hold for this model (None for ensembles)."""
    if is_ensemble(config):
        return None
    if config.default_model_filename:
        return config.default_model_filename
    if config.backend == "fil":
        return FIL_MODEL_FILENAMES.get(fil_parameters(config).get("model_type", _FIL_DEFAULT_MODEL_TYPE))
    return _BACKEND_MODEL_FILENAMES.get(config.backend)


# --------------------------------------------------------------------------- per-model rules


def _dims(tensor: Any) -> list[int]:
    return list(tensor.dims)


def check_model_config(config: ModelConfig, model: str, file: str = CONFIG_FILENAME) -> list[Problem]:
    """The rules one config must satisfy on its own; an empty list when it is fine."""
    problems: list[Problem] = []

    def problem(field: str, message: str, severity: str = "error") -> None:
        problems.append(Problem(model, file, field, message, severity))

    if config.max_batch_size < 0:
        problem("max_batch_size", f"must be >= 0, got {config.max_batch_size}")
    if not config.backend and not config.platform:
        problem("backend", "neither 'backend' nor 'platform' is set")
    names = [t.name for t in config.input]
    if len(set(names)) != len(names):
        problem("input", "input names must be unique")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for i, tensor in enumerate(tensors):
            where = f"{kind}[{i}]"
            if not tensor.name:
                problem(f"{where}.name", "must be set")
            if tensor.data_type == mc.TYPE_INVALID:
                problem(f"{where}.data_type", f"tensor '{tensor.name}' needs a data_type")
            if any(d < -1 or d == 0 for d in tensor.dims) and not tensor.HasField("reshape"):
                problem(f"{where}.dims", f"tensor '{tensor.name}' has invalid dims {_dims(tensor)} "
                        "(each must be > 0, or -1 for variable size)")
    if config.HasField("dynamic_batching"):
        if config.max_batch_size == 0:
            problem("dynamic_batching", "dynamic batching needs max_batch_size > 0")
        for size in config.dynamic_batching.preferred_batch_size:
            if size < 1 or (config.max_batch_size and size > config.max_batch_size):
                problem("dynamic_batching.preferred_batch_size",
                        f"{size} must be between 1 and max_batch_size ({config.max_batch_size})")
    if config.HasField("sequence_batching"):
        problems.extend(_check_sequence(config, model, file))
    if is_ensemble(config):
        if config.instance_group:
            problem("instance_group", "an ensemble must not have instance groups")
        if config.HasField("optimization"):
            problem("optimization", "an ensemble must not have an optimization setting")
        if config.model_warmup:
            problem("model_warmup", "an ensemble must not have model warmup")
        if not config.ensemble_scheduling.step:
            problem("ensemble_scheduling.step", "an ensemble needs at least one step")
    elif config.backend == "fil":
        problems.extend(_check_fil(config, model, file))
    elif config.backend == "python":
        problems.extend(_check_python(config, model, file))
    elif config.backend != "onnxruntime":
        problem("backend", f"backend '{config.backend}' is not built in (fil, python, onnxruntime, platform "
                "ensemble): the server must find it registered (triton_nb.backends.register_backend), as an entry "
                f"point in group 'triton_nb.backends', or as {config.backend}/model.py in its backend directory",
                severity="warning")
    for finding in check_fields(config):  # nothing set is ignored without a word
        problem(finding.field, finding.message, severity=finding.severity)
    return problems


_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)


def _check_sequence(config: ModelConfig, model: str, file: str) -> list[Problem]:
    """Triton's load-time checks of ``sequence_batching`` (model_config_utils.cc), in its words:
    the control inputs the sequence batcher would otherwise build wrongly."""
    batching = config.sequence_batching
    kinds = mc.ModelSequenceBatching.Control
    where = "sequence_batching.control_input"
    problems: list[Problem] = []

    def problem(field: str, message: str) -> None:
        problems.append(Problem(model, file, field, message))

    names: set[str] = set()
    seen: set[int] = set()
    for i, control_input in enumerate(batching.control_input):
        if not control_input.name:
            problem(f"{where}[{i}].name", f"sequence batching control tensor must have a name for {model}")
        elif control_input.name in names:
            problem(f"{where}[{i}].name", f"sequence batching control tensor '{control_input.name}' is specified "
                    f"for multiple control kinds for {model}")
        names.add(control_input.name)
        for control in control_input.control:
            kind = kinds.Kind.Name(control.kind)
            if control.kind in seen:
                problem(f"{where}[{i}].control", f"sequence batching specifies multiple {kind} tensors for {model}")
            seen.add(control.kind)
            given = [values for values in (control.int32_false_true, control.fp32_false_true,
                                           control.bool_false_true) if values]
            if control.kind == kinds.CONTROL_SEQUENCE_CORRID:
                if given:
                    problem(f"{where}[{i}].control", "sequence batching must not specify either "
                            f"'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {kind} for {model}")
                elif control.data_type not in _CORRID_TYPES:
                    problem(f"{where}[{i}].control.data_type", f"unexpected data type for control {kind} for "
                            f"{model}. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 "
                            "and TYPE_STRING")
            elif not given:
                problem(f"{where}[{i}].control", "sequence batching must specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {model}")
            elif len(given) > 1:
                problem(f"{where}[{i}].control", "sequence batching specifies more than one from "
                        f"'int32_false_true', 'fp32_false_true' and 'bool_false_true' for {kind} for {model}")
            elif len(given[0]) != 2:
                problem(f"{where}[{i}].control", f"sequence batching control values must have exactly 2 entries "
                        f"for {kind} for {model}")
    utilization = batching.direct.minimum_slot_utilization
    if not 0.0 <= utilization <= 1.0:
        problem("sequence_batching.direct.minimum_slot_utilization",
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model}")
    return problems


_MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"


def _check_python(config: ModelConfig, model: str, file: str) -> list[Problem]:
    """EXECUTION_ENV_PATH stays inside the model folder. Real Triton takes any path, but an
    environment is code that runs; a repository that points outside itself is not self-contained
    either, and a load over the network (a config override) must not reach the server's disk."""
    parameter = config.parameters.get("EXECUTION_ENV_PATH")
    if parameter is None:
        return []
    value = parameter.string_value
    inside = value.startswith(_MODEL_DIRECTORY + "/") and ".." not in value.split("/") and "\\" not in value
    if inside:
        return []
    return [Problem(model, file, "parameters.EXECUTION_ENV_PATH",
                    f"'{value}' must be inside the model folder: '{_MODEL_DIRECTORY}/<archive>.tar.gz' "
                    "without '..'")]


def _check_fil(config: ModelConfig, model: str, file: str) -> list[Problem]:
    problems: list[Problem] = []

    def problem(field: str, message: str) -> None:
        problems.append(Problem(model, file, field, message))

    parameters = fil_parameters(config)
    for name, value in parameters.items():
        if name == "treeshap_output":
            problems.append(Problem(model, file, f"parameters.{name}", "not a FIL parameter: the FIL backend "
                                    "computes SHAP values when an output is named 'treeshap_output'", "warning"))
            continue
        if name not in _FIL_PARAMETERS:
            problems.append(Problem(model, file, f"parameters.{name}", "not a FIL backend parameter", "warning"))
            continue
        allowed = _FIL_PARAMETERS[name]
        if allowed is not None and value not in allowed:
            problem(f"parameters.{name}", f"'{value}' is not one of {', '.join(allowed)}")
        elif name in _FIL_NUMERIC:
            try:
                _FIL_NUMERIC[name](value)
            except ValueError:
                problem(f"parameters.{name}", f"'{value}' is not a number")
    # FIL reads model_type with a default, "xgboost" (the legacy binary xgboost.model), and output_class
    # and, for a classifier, threshold without one (fil_backend's shared_state.h): those two refuse the
    # load in rapids-triton's words. is_classifier is the name since FIL 25.09; output_class still works there.
    classifier = parameters.get("is_classifier", parameters.get("output_class"))
    if classifier is None:
        problem("parameters.output_class", "Required parameter output_class not found in config ('true' for a "
                                           "classifier, 'false' for a regressor; FIL 25.09 and later also take "
                                           "is_classifier)")
    elif classifier == "true" and "threshold" not in parameters:
        problem("parameters.threshold", "Required parameter threshold not found in config (FIL needs it when "
                                        "output_class is 'true')")
    if len(config.input) != 1 or config.input[0].name != "input__0":
        problem("input", "the FIL backend takes exactly one input, named 'input__0'")
    elif config.input[0].data_type != mc.TYPE_FP32:
        problem("input[0].data_type", "input__0 must be TYPE_FP32")
    outputs = {tensor.name: tensor for tensor in config.output}
    if "output__0" not in outputs:
        problem("output", "the FIL backend produces an output named 'output__0'")
    for name, tensor in outputs.items():
        if name not in ("output__0", "treeshap_output"):
            problem("output", f"'{name}' is not an output of the FIL backend (output__0, treeshap_output)")
        elif tensor.data_type != mc.TYPE_FP32:
            problem("output", f"{name} must be TYPE_FP32")
    if "treeshap_output" in outputs and len(config.input) == 1:
        features = _dims(config.input[0])
        shap_dims = _dims(outputs["treeshap_output"])
        if features and features[-1] > 0 and shap_dims and shap_dims[-1] not in (-1, features[-1] + 1):
            problem("output", f"treeshap_output dims {shap_dims} must end in num_features + 1 = {features[-1] + 1}")
    answers = {}
    for name, tensor in outputs.items():
        try:
            answers[name] = answer_row_dims(tensor.dims)
        except ValueError as exc:
            problem("output", f"{name} {exc}")
    is_class_output = classifier == "true" and parameters.get("predict_proba") != "true"
    if is_class_output and answers.get("output__0", ()) != ():
        problem("output", f"output__0 of a classifier without predict_proba has dims [1] (one value a row), not "
                    f"{_dims(outputs['output__0'])}")
    return problems
