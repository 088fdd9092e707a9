"""Model instances: creating the backend objects of a version and running a batch on one.

A model version has ``instance_group.count`` instances; each is one backend object (fil, python
or onnxruntime, by the config's ``backend``) on a worker thread of the version's scheduler.
:func:`add_instance` builds the instance's :class:`~triton_nb.backends.base.ModelContext`,
creates the backend (construct = load) and hands it to the scheduler; :func:`set_instance_count`
adds or retires instances of a serving version; :func:`run_batch` is what a worker calls for
each batch: it times the queue, compute_input, compute_infer and compute_output phases of every
request, keeps the requested outputs and records the execution in the version's statistics.

Contract: a backend's own load failure becomes the model's
:class:`~triton_nb.errors.InternalError`, naming the model, version and exception; errors of the
package's hierarchy pass unchanged. A version is read and changed only through
:class:`ServedVersion` (the model manager's per-version record satisfies it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.backends.backend_config import PythonBackendOptions
from triton_nb.backends.base import Backend, ModelContext, ServerHandle
from triton_nb.backends.registry import backend_factory
from triton_nb.errors import InternalError, InvalidArgumentError, TritonNBError
from triton_nb.server.models.checks import CheckedVersion, filter_outputs
from triton_nb.server.models.warmup import warm_up_instance
from triton_nb.server.observability.stats import ModelStats
from triton_nb.server.scheduling.batcher import Scheduler
from triton_nb.server.scheduling.rate_limiter import RateLimiter, Resource
from triton_nb.tensors import InferRequest, InferResponse

__all__ = ["InstanceOptions", "ServedVersion", "add_instance", "create_backend", "set_instance_count"]


class ServedVersion(CheckedVersion, Protocol):
    """What instance creation and batch execution read and change of one loaded model version."""

    version_path: Path
    stats: ModelStats
    scheduler: Scheduler | None  # None for ensembles, which have no instances
    next_instance: int  # the index the next instance's name takes
    rate_limiter: RateLimiter | None  # the server's, when it rate-limits

    @property
    def batching(self) -> bool:
        """True when the model batches (``max_batch_size`` > 0)."""


@dataclass(frozen=True)
class InstanceOptions:
    """The server's settings for creating instances: where Python-based backends are looked up,
    and whether Python models run as threads or as processes (``"thread"`` or ``"process"``)."""

    backend_directory: Path | None = None
    python_instances: str = "thread"
    #: the Python backend's --backend-config settings, which its process instances read
    python_backend: PythonBackendOptions = field(default_factory=PythonBackendOptions)


def create_backend(context: ModelContext, backend_directory: Path | None = None) -> Backend:
    """The backend object for one instance, by ``backend`` in the config (resolved as
    :mod:`triton_nb.backends.registry` says: registered, entry point, backend directory, built-in)."""
    factory = backend_factory(context.config.backend, model=context.name, backend_directory=backend_directory)
    backend = factory(context)
    if not isinstance(backend, Backend):
        raise InvalidArgumentError(f"model '{context.name}': backend '{context.config.backend}' gave a "
                                   f"{type(backend).__name__}, not a triton_nb.backends.base.Backend")
    return backend


def add_instance(version: ServedVersion, group: mc.ModelInstanceGroup, source: Path, *, repository: Path,
                 server: ServerHandle | None, options: InstanceOptions = InstanceOptions()) -> None:
    """Load one more instance of ``version`` (from the model folder ``source``) and start serving
    with it; ``server`` is what the instance may call back (BLS)."""
    index = version.next_instance
    version.next_instance += 1
    kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
    context = ModelContext(
        name=version.name,
        version=version.version,
        config=version.config,
        model_path=source,
        version_path=version.version_path,
        repository_path=repository,
        instance_name=f"{group.name}_{index}",
        instance_kind=kind,
        device_id=int(group.gpus[0]) if group.gpus else 0,
        server=server,
        python_instances=options.python_instances,
        python_backend=options.python_backend,
    )
    try:
        backend = create_backend(context, options.backend_directory)
    except TritonNBError:
        raise
    except Exception as exc:  # a backend's own failure: the model's load error, named
        raise InternalError(f"model '{version.name}' version {version.version} failed to load: "
                            f"{type(exc).__name__}: {exc}") from None
    warm_up_instance(version, backend, context.instance_name)  # model_warmup, before it serves (Triton's rule)
    gate = None
    if version.rate_limiter is not None:
        try:
            gate = version.rate_limiter.register(version.name, context.device_id, _resources(group),
                                                 group.rate_limiter.priority)
        except TritonNBError:
            backend.finalize()
            raise
    version.scheduler.add_instance(backend, f"triton-nb-{version.name}-{context.instance_name}", gate)


def _resources(group: mc.ModelInstanceGroup) -> list[Resource]:
    return [Resource(r.name, int(r.count), bool(getattr(r, "global"))) for r in group.rate_limiter.resources]


def set_instance_count(version: ServedVersion, count: int, *, repository: Path, server: ServerHandle | None,
                       options: InstanceOptions = InstanceOptions()) -> None:
    """Grow or shrink a serving version's first instance group to ``count`` instances, live:
    new instances load beside the serving ones; retired ones finish their batch, then finalize."""
    if count < 1:
        raise InvalidArgumentError(f"instance_count must be >= 1, got {count}")
    current = version.scheduler.instance_count
    group = version.config.instance_group[0]
    source = version.version_path.parent
    for _ in range(count - current):
        add_instance(version, group, source, repository=repository, server=server, options=options)
    if count < current:
        for backend in version.scheduler.retire_instances(current - count):
            backend.finalize()


def run_batch(version: ServedVersion, backend: Backend, requests: list[InferRequest]) -> list[InferResponse]:
    """Execute one batch on one instance: the scheduler's worker calls this for every batch."""
    started = time.monotonic_ns()
    counted = 0
    for request in requests:
        request.timing["queue"] = started - request.arrival_ns
        counted += len(request.carried_rows) or 1  # counted_requests(), without a call per request
    version.stats.pending_add(-counted)
    before_infer = time.monotonic_ns()
    responses = backend.execute(requests)
    after_infer = time.monotonic_ns()
    if responses is not None:
        responses = [filter_outputs(version, request, response) for request, response in zip(
            requests, responses, strict=False)]
    finished = time.monotonic_ns()
    timing = {"compute_input": before_infer - started, "compute_infer": after_infer - before_infer,
              "compute_output": finished - after_infer}
    for request in requests:
        request.timing.update(timing)
    batching = version.batching
    rows = sum(r.batch_size(batching) for r in requests)
    version.stats.record_execution(batch_rows=rows, compute_input_ns=timing["compute_input"],
                                   compute_infer_ns=timing["compute_infer"],
                                   compute_output_ns=timing["compute_output"])
    return responses
