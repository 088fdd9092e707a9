"""Every field of Triton's ``ModelConfig``: served as Triton serves it, refused, or warned about.

A repository that real Triton serves with implicit sequence state, a rate limiter or ragged batches
must not run differently here without a word. :data:`FIELD_RULES` therefore names each field
path of the ``model_config.proto`` schema (``input.reshape``, ``instance_group.rate_limiter``)
with what triton_nb does with it:

* ``SERVED`` — it does what Triton does (the children of a served message have rules of their own);
* ``REFUSED`` — triton_nb cannot do it: a config that sets it fails to load, and
  ``triton-nb validate`` reports an error naming the model, the field and the reason;
* ``WARNED`` — Triton itself ignores it in the situations triton_nb serves (a GPU knob for
  CPU instances, a TensorRT-only flag, a feature behind a server flag that is off by default):
  the model loads, with one warning at load, in ``validate`` and in ``%triton status``;
* ``DIFFERS`` — triton_nb serves it where real Triton, for this model, does not (implicit state
  for a Python model): the model loads, with the same warning, so that an exported repository
  holds no surprise when Triton serves it.

Some rules depend on the model: ``reshape`` is applied by the ONNX Runtime backend only, so it
is refused for the others. :func:`check_fields` walks the fields a config sets (protobuf's
``ListFields``: proto3 scalars at their defaults are not "set", as in Triton) against the table.
A test walks the schema's descriptor, so a field that a later ``tritonclient`` adds to the schema
fails the suite until it has a rule here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from tritonclient.grpc.model_config_pb2 import ModelConfig

__all__ = ["DIFFERS", "FIELD_RULES", "REFUSED", "SERVED", "WARNED", "FieldFinding", "FieldRule", "check_fields"]

SERVED = "served"
REFUSED = "refused"
WARNED = "warned"
DIFFERS = "differs"


@dataclass(frozen=True)
class FieldRule:
    """What triton_nb does with one field path; ``reason`` says why for the other two statuses."""

    status: str
    reason: str = ""
    #: For a rule that depends on the model: the status for this config (else ``status`` applies).
    when: Callable[[ModelConfig], str] | None = None

    def status_for(self, config: ModelConfig) -> str:
        return self.when(config) if self.when is not None else self.status


def _served_by_onnxruntime(config: ModelConfig) -> str:
    onnx = config.backend == "onnxruntime" or config.platform == "onnxruntime_onnx"
    return SERVED if onnx else REFUSED


def _cacheable(config: ModelConfig) -> str:
    # Triton refuses a cache on a decoupled model at load, whether or not the server has a cache
    return REFUSED if config.response_cache.enable and config.model_transaction_policy.decoupled else SERVED


def _sequence_backend(config: ModelConfig) -> str:
    return SERVED if config.backend == "python" else REFUSED


def _python_based_runtime(config: ModelConfig) -> str:
    # Triton sets runtime: "model.py" itself for a Python-based backend (a backend directory's
    # NAME/model.py), which the server resolves the same way; a built-in backend has no such file
    builtin = config.backend in ("fil", "python", "onnxruntime")
    return SERVED if config.runtime == "model.py" and not builtin else REFUSED


def _metric_families(config: ModelConfig) -> str:
    # Triton core's MetricReporterConfig: buckets of other families are ignored, with a warning
    families = {control.metric_identifier.family for control in config.model_metrics.metric_control}
    return SERVED if families <= {"nv_inference_first_response_histogram_ms"} else WARNED


def _sorted_buckets(config: ModelConfig) -> str:
    for control in config.model_metrics.metric_control:
        buckets = list(control.histogram_options.buckets)
        if any(buckets[i] >= buckets[i + 1] for i in range(len(buckets) - 1)):
            return REFUSED
    return SERVED


def _unless_default(pinned: Any) -> str:
    # enable: true is Triton's default (the effective config fills it in): nothing to say
    return SERVED if pinned.enable else WARNED


_GPU_KNOB = ("a GPU-side setting: Triton applies it to GPU instances only and ignores it for KIND_CPU; "
             "triton_nb applies it to none")
_TENSORRT = "used by Triton's TensorRT backend only; no backend triton_nb serves reads it"
_RAGGED = "ragged batching is not implemented: triton_nb batches requests of equal non-batch shapes only"

FIELD_RULES: dict[str, FieldRule] = {
    "name": FieldRule(SERVED),
    "platform": FieldRule(SERVED),
    "backend": FieldRule(SERVED),
    "runtime": FieldRule(REFUSED, "a backend runtime other than a Python-based backend's model.py (a shared "
                                  "library) cannot be loaded; leave it unset", when=_python_based_runtime),
    "version_policy": FieldRule(SERVED),
    "version_policy.latest": FieldRule(SERVED),
    "version_policy.latest.num_versions": FieldRule(SERVED),
    "version_policy.all": FieldRule(SERVED),
    "version_policy.specific": FieldRule(SERVED),
    "version_policy.specific.versions": FieldRule(SERVED),
    "max_batch_size": FieldRule(SERVED),
    "input": FieldRule(SERVED),
    "input.name": FieldRule(SERVED),
    "input.data_type": FieldRule(SERVED),
    "input.format": FieldRule(WARNED, "a layout hint (NHWC/NCHW) for image models that Triton passes on to "
                                      "backends; none triton_nb serves reads it"),
    "input.dims": FieldRule(SERVED),
    "input.reshape": FieldRule(SERVED, "triton_nb applies reshape in the ONNX Runtime backend only",
                               when=_served_by_onnxruntime),
    "input.reshape.shape": FieldRule(SERVED),
    "input.is_shape_tensor": FieldRule(REFUSED, "shape tensors are a TensorRT feature; triton_nb serves none"),
    "input.allow_ragged_batch": FieldRule(REFUSED, _RAGGED),
    "input.optional": FieldRule(SERVED),
    "input.is_non_linear_format_io": FieldRule(WARNED, _TENSORRT),
    "output": FieldRule(SERVED),
    "output.name": FieldRule(SERVED),
    "output.data_type": FieldRule(SERVED),
    "output.dims": FieldRule(SERVED),
    "output.reshape": FieldRule(SERVED, "triton_nb applies reshape in the ONNX Runtime backend only",
                                when=_served_by_onnxruntime),
    "output.reshape.shape": FieldRule(SERVED),
    "output.label_filename": FieldRule(SERVED),
    "output.is_shape_tensor": FieldRule(REFUSED, "shape tensors are a TensorRT feature; triton_nb serves none"),
    "output.is_non_linear_format_io": FieldRule(WARNED, _TENSORRT),
    "batch_input": FieldRule(REFUSED, _RAGGED),
    "batch_output": FieldRule(REFUSED, _RAGGED),
    "optimization": FieldRule(SERVED),
    "optimization.graph": FieldRule(SERVED),
    "optimization.graph.level": FieldRule(SERVED),  # the ONNX Runtime backend's graph optimization level
    "optimization.priority": FieldRule(WARNED, "a CUDA stream priority for GPU backends; Triton ignores it on CPU"),
    "optimization.cuda": FieldRule(WARNED, _GPU_KNOB),
    "optimization.execution_accelerators": FieldRule(WARNED, "accelerators (TensorRT, OpenVINO) for ONNX Runtime "
                                                             "and TensorFlow; triton_nb's ONNX Runtime backend runs "
                                                             "its default execution providers"),
    "optimization.input_pinned_memory": FieldRule(WARNED, _GPU_KNOB, when=lambda config: _unless_default(
        config.optimization.input_pinned_memory)),
    "optimization.output_pinned_memory": FieldRule(WARNED, _GPU_KNOB, when=lambda config: _unless_default(
        config.optimization.output_pinned_memory)),
    "optimization.input_pinned_memory.enable": FieldRule(SERVED),
    "optimization.output_pinned_memory.enable": FieldRule(SERVED),
    "optimization.gather_kernel_buffer_threshold": FieldRule(WARNED, _GPU_KNOB),
    "optimization.eager_batching": FieldRule(WARNED, "lets Triton's rate limiter start a batch before the "
                                                     "resources of every instance are known; triton_nb's rate "
                                                     "limiter has no such choice to make"),
    "dynamic_batching": FieldRule(SERVED),
    "dynamic_batching.preferred_batch_size": FieldRule(SERVED),
    "dynamic_batching.max_queue_delay_microseconds": FieldRule(SERVED),
    "dynamic_batching.preserve_ordering": FieldRule(SERVED),
    "dynamic_batching.priority_levels": FieldRule(SERVED),
    "dynamic_batching.default_priority_level": FieldRule(SERVED),
    "dynamic_batching.default_queue_policy": FieldRule(SERVED),
    "dynamic_batching.default_queue_policy.timeout_action": FieldRule(SERVED),
    "dynamic_batching.default_queue_policy.default_timeout_microseconds": FieldRule(SERVED),
    "dynamic_batching.default_queue_policy.allow_timeout_override": FieldRule(SERVED),
    "dynamic_batching.default_queue_policy.max_queue_size": FieldRule(SERVED),
    "dynamic_batching.priority_queue_policy": FieldRule(SERVED),
    "sequence_batching": FieldRule(SERVED, "the sequence batcher is implemented for Python-backend models only: "
                                           "the others would get control tensors they do not read",
                                   when=_sequence_backend),
    "sequence_batching.direct": FieldRule(SERVED),
    "sequence_batching.direct.max_queue_delay_microseconds": FieldRule(SERVED),
    "sequence_batching.direct.minimum_slot_utilization": FieldRule(SERVED),
    "sequence_batching.oldest": FieldRule(SERVED),
    "sequence_batching.oldest.max_candidate_sequences": FieldRule(SERVED),
    "sequence_batching.oldest.preferred_batch_size": FieldRule(SERVED),
    "sequence_batching.oldest.max_queue_delay_microseconds": FieldRule(SERVED),
    "sequence_batching.oldest.preserve_ordering": FieldRule(SERVED),
    "sequence_batching.max_sequence_idle_microseconds": FieldRule(SERVED),
    "sequence_batching.control_input": FieldRule(SERVED),
    "sequence_batching.control_input.name": FieldRule(SERVED),
    "sequence_batching.control_input.control": FieldRule(SERVED),
    "sequence_batching.control_input.control.kind": FieldRule(SERVED),
    "sequence_batching.control_input.control.int32_false_true": FieldRule(SERVED),
    "sequence_batching.control_input.control.fp32_false_true": FieldRule(SERVED),
    "sequence_batching.control_input.control.bool_false_true": FieldRule(SERVED),
    "sequence_batching.control_input.control.data_type": FieldRule(SERVED),
    "sequence_batching.state": FieldRule(DIFFERS, "real Triton's Python backend hands the model the state input "
                                                  "but never carries the model's output state into it (only the "
                                                  "onnxruntime, tensorrt and pytorch backends do), so there every "
                                                  "request sees the initial state; triton_nb carries it"),
    "sequence_batching.state.input_name": FieldRule(SERVED),
    "sequence_batching.state.output_name": FieldRule(SERVED),
    "sequence_batching.state.data_type": FieldRule(SERVED),
    "sequence_batching.state.dims": FieldRule(SERVED),
    "sequence_batching.state.initial_state": FieldRule(SERVED),
    "sequence_batching.state.initial_state.data_type": FieldRule(SERVED),
    "sequence_batching.state.initial_state.dims": FieldRule(SERVED),
    "sequence_batching.state.initial_state.zero_data": FieldRule(SERVED),
    "sequence_batching.state.initial_state.data_file": FieldRule(SERVED),
    "sequence_batching.state.initial_state.name": FieldRule(SERVED),
    "sequence_batching.state.use_same_buffer_for_input_output": FieldRule(
        WARNED, "a buffer-placement knob for backends that write the state in place (TRITONBACKEND_StateBuffer); "
                "a Python model's state here is the array it returns"),
    "sequence_batching.state.use_growable_memory": FieldRule(
        WARNED, "a GPU memory knob (CUDA virtual memory for growing state); triton_nb keeps state in host memory"),
    "sequence_batching.iterative_sequence": FieldRule(REFUSED, "iterative sequences (request rescheduling) are not "
                                                               "implemented"),
    "ensemble_scheduling": FieldRule(SERVED),
    "ensemble_scheduling.step": FieldRule(SERVED),
    "ensemble_scheduling.step.model_name": FieldRule(SERVED),
    "ensemble_scheduling.step.model_version": FieldRule(SERVED),
    "ensemble_scheduling.step.input_map": FieldRule(SERVED),
    "ensemble_scheduling.step.output_map": FieldRule(SERVED),
    "ensemble_scheduling.step.model_namespace": FieldRule(WARNED, "Triton reads it only with --model-namespacing "
                                                                  "(off by default), which triton_nb does not offer"),
    # Triton 2.63's per-step in-flight limit (triton_nb.server.scheduling.ensemble)
    "ensemble_scheduling.max_inflight_requests": FieldRule(SERVED),
    "instance_group": FieldRule(SERVED),
    "instance_group.name": FieldRule(SERVED),
    "instance_group.kind": FieldRule(SERVED),
    "instance_group.count": FieldRule(SERVED),
    # applied with rate_limit="execution_count" (--rate-limit); ignored with "off", the default, as in Triton
    "instance_group.rate_limiter": FieldRule(SERVED),
    "instance_group.rate_limiter.resources": FieldRule(SERVED),
    "instance_group.rate_limiter.resources.name": FieldRule(SERVED),
    "instance_group.rate_limiter.resources.global": FieldRule(SERVED),
    "instance_group.rate_limiter.resources.count": FieldRule(SERVED),
    "instance_group.rate_limiter.priority": FieldRule(SERVED),
    "instance_group.gpus": FieldRule(SERVED),
    "instance_group.secondary_devices": FieldRule(REFUSED, "secondary devices (NVDLA) are not supported"),
    "instance_group.profile": FieldRule(WARNED, _TENSORRT),
    "instance_group.passive": FieldRule(REFUSED, "passive instances (loaded but never scheduled) are not "
                                                 "supported: triton_nb would schedule them"),
    "instance_group.host_policy": FieldRule(WARNED, "a NUMA host policy that Triton applies only with "
                                                    "--host-policy settings; triton_nb does not pin memory or threads"),
    "default_model_filename": FieldRule(SERVED),
    "cc_model_filenames": FieldRule(WARNED, "per-GPU-architecture model files; Triton reads them for GPU "
                                            "instances only and triton_nb always loads default_model_filename"),
    "metric_tags": FieldRule(REFUSED, "extra labels on the model's metrics are not supported"),
    "parameters": FieldRule(SERVED),  # the backend's own: each backend checks what it reads
    "model_warmup": FieldRule(SERVED),
    "model_warmup.name": FieldRule(SERVED),
    "model_warmup.batch_size": FieldRule(SERVED),
    "model_warmup.inputs": FieldRule(SERVED),
    "model_warmup.count": FieldRule(SERVED),
    "model_operations": FieldRule(REFUSED, "custom operation libraries (op_library_filename) are not loaded"),
    "model_transaction_policy": FieldRule(SERVED),
    "model_transaction_policy.decoupled": FieldRule(SERVED),
    "model_repository_agents": FieldRule(REFUSED, "repository agents (such as checksum) are not supported"),
    "response_cache": FieldRule(SERVED),
    "response_cache.enable": FieldRule(SERVED, "Response Cache does not currently support a model with 'decoupled' "
                                               "transaction policy (Triton refuses it too). Please disable the "
                                               "response cache.", when=_cacheable),
    # histogram buckets of nv_inference_first_response_histogram_ms (with --metrics-config
    # histogram_latencies=true): the one family Triton lets a model customize
    "model_metrics": FieldRule(SERVED),
    "model_metrics.metric_control": FieldRule(SERVED),
    "model_metrics.metric_control.metric_identifier": FieldRule(SERVED),
    "model_metrics.metric_control.metric_identifier.family": FieldRule(
        WARNED, "only nv_inference_first_response_histogram_ms takes custom buckets; Triton warns that any other "
                "family 'is not a customizable metric in Triton core' and ignores it", when=_metric_families),
    "model_metrics.metric_control.histogram_options": FieldRule(SERVED),
    "model_metrics.metric_control.histogram_options.buckets": FieldRule(
        REFUSED, "histogram buckets must be strictly increasing (prometheus-cpp refuses others)",
        when=_sorted_buckets),
}


def _set_fields(message: Message, prefix: str, where: str) -> Iterator[tuple[str, str]]:
    """(schema path, path with indices) of every field set in ``message``, depth first; a map is
    one field (its entries are the backend's or the scheduler's to read)."""
    for descriptor, value in message.ListFields():
        path = f"{prefix}{descriptor.name}"
        is_map = descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry
        if descriptor.message_type is None or is_map:
            yield path, f"{where}{descriptor.name}"
            continue
        items: list[Any] = list(value) if descriptor.is_repeated else [value]
        yield path, f"{where}{descriptor.name}"
        for index, item in enumerate(items):
            shown = f"{where}{descriptor.name}[{index}]." if descriptor.is_repeated else f"{where}{descriptor.name}."
            yield from _set_fields(item, f"{path}.", shown)


@dataclass(frozen=True)
class FieldFinding:
    """A field that a config sets and triton_nb does not serve: ``severity`` is ``error``
    (refused) or ``warning`` (no effect, as in Triton); ``field`` is its path with indices."""

    severity: str
    field: str
    message: str


def check_fields(config: ModelConfig) -> list[FieldFinding]:
    """A finding for every field ``config`` sets that triton_nb refuses (an error) or that Triton
    ignores in this situation (a warning), with the reason (the config checks add the model and
    file). A field under a refused or warned message is reported once, at that message, and a
    field set on several tensors or groups once, at the first."""
    problems: list[FieldFinding] = []
    reported: list[str] = []  # paths already reported: neither they (at another index) nor their children again
    differing: set[str] = set()  # DIFFERS paths already reported (at another index)
    for path, where in _set_fields(config, "", ""):
        if any(path == done or path.startswith(done + ".") for done in reported):
            continue
        rule = FIELD_RULES.get(path)
        if rule is None:  # a schema field this table does not know yet: refuse rather than ignore
            rule = FieldRule(REFUSED, "triton_nb does not know this field")
        status = rule.status_for(config)
        if status == SERVED or path in differing:
            continue
        if status == DIFFERS:  # served: its children are judged on their own
            differing.add(path)
            problems.append(FieldFinding("warning", where, f"served differently from Triton: {rule.reason}"))
            continue
        reported.append(path)
        if status == REFUSED:
            problems.append(FieldFinding("error", where, f"not supported by triton_nb: {rule.reason}"))
        else:
            problems.append(FieldFinding("warning", where, f"has no effect here: {rule.reason}"))
    return problems
