"""Running a model's warm-up samples on one instance before it serves, as Triton does.

Triton warms every instance of a version when the instance is created — at load, at reload, and
for instances added later — and the version becomes READY only when all of them are warm
(``TritonModelInstance::WarmUp`` in triton-inference-server/core ``src/backend_model_instance.cc``).
The samples bypass the scheduler: they are handed straight to the instance's execute, so no
queue, batcher or other instance is involved. :func:`warm_up_instance` does the same with a
freshly created backend before :func:`triton_nb.server.models.instances.add_instance` gives it to the
scheduler; the samples' tensors come from :func:`triton_nb.repository.warmup.warmup_samples`.

What matches Triton (2.51, checked against a real server):

* one sample at a time, ``count`` times; ``batch_size`` requests of one row each in one execute;
* each request is checked as a user request would be (names, data types, shapes, required
  inputs), with Triton's words; an input the model does not declare is passed along unchecked;
* the responses are not looked at, only their errors: the first sample with an error fails the
  load with Triton's "failed to run warmup sample '<name>': <errors>", here prefixed with the
  model, version and instance;
* the executions count in the version's statistics like any other (Triton's backends report
  them: ``inference_count``, ``execution_count``, ``success``, ``batch_stats``);
* a decoupled model's warm-up waits for each request's final response.

On failure the instance is finalized before the error propagates: it never served, and nothing
else holds it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Protocol

from triton_nb.backends.base import Backend
from triton_nb.errors import InvalidArgumentError, TritonNBError
from triton_nb.repository.warmup import WarmupSample, warmup_samples
from triton_nb.server.models.checks import CheckedVersion, check_request
from triton_nb.server.observability.stats import ModelStats
from triton_nb.tensors import InferRequest, InferResponse

__all__ = ["WarmedVersion", "warm_up_instance"]

log = logging.getLogger(__name__)


class WarmedVersion(CheckedVersion, Protocol):
    """What warming an instance reads of its model version."""

    version_path: Path
    stats: ModelStats

    @property
    def batching(self) -> bool:
        """True when the model batches (``max_batch_size`` > 0)."""


def warm_up_instance(version: WarmedVersion, backend: Backend, instance_name: str) -> None:
    """Run every warm-up sample of ``version``'s config on ``backend`` (the instance
    ``instance_name``, not yet serving); return when it is warm. A sample that cannot be built or
    that fails raises :class:`~triton_nb.errors.InvalidArgumentError` naming the model, version,
    sample and (for data problems) input, after the backend is finalized."""
    if not version.config.model_warmup:
        return
    try:
        try:
            samples = warmup_samples(version.config, version.version_path.parent)
        except TritonNBError as exc:
            raise InvalidArgumentError(f"model '{version.name}' version {version.version}: {exc}") from None
        for sample in samples:
            _run_sample(version, backend, instance_name, sample)
    except BaseException:
        try:
            backend.finalize()
        except Exception:
            log.exception("model '%s' version %s instance %s: finalize after a failed warm-up failed",
                          version.name, version.version, instance_name)
        raise


def _requests(version: WarmedVersion, sample: WarmupSample) -> list[InferRequest]:
    """The sample's batch: ``batch_size`` requests, each checked as a user request would be."""
    requests = []
    for _ in range(sample.batch_size):
        # each request gets its own arrays: a backend may write to what it is given
        request = InferRequest(model_name=version.name, model_version=version.version,
                               inputs={n: a.copy() for n, a in sample.inputs.items()})
        declared = InferRequest(model_name=version.name, model_version=version.version,
                                inputs={n: a for n, a in request.inputs.items() if n in version.inputs})
        try:
            check_request(version, declared)
        except TritonNBError as exc:
            raise InvalidArgumentError(f"model '{version.name}' version {version.version}: warmup sample "
                                       f"'{sample.name}': {exc}") from None
        requests.append(request)
    return requests


def _run_sample(version: WarmedVersion, backend: Backend, instance_name: str, sample: WarmupSample) -> None:
    for iteration in range(1, sample.count + 1):
        log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                  version.name, instance_name, sample.name, iteration)
        errors = _execute(version, backend, _requests(version, sample))
        if errors:
            log.debug("model '%s' instance %s failed to run warmup sample '%s'", version.name, instance_name,
                      sample.name)
            raise InvalidArgumentError(
                f"model '{version.name}' version {version.version} instance '{instance_name}': failed to run "
                f"warmup sample '{sample.name}': {'; '.join(errors)}")


class _Collector:
    """The response sender of one warm-up request of a decoupled model: keeps the errors and
    notes the final response."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.final = threading.Event()

    def __call__(self, response: InferResponse | None, final: bool) -> None:
        if response is not None and response.error is not None:
            self.errors.append(str(response.error))
        if final:
            self.final.set()


def _execute(version: WarmedVersion, backend: Backend, requests: list[InferRequest]) -> list[str]:
    """One execution of the batch on the instance, counted in the version's statistics; the
    error messages of its responses (empty when all succeeded)."""
    collectors = []
    if backend.decoupled:
        for request in requests:
            request.response_sender = collector = _Collector()
            collectors.append(collector)
    started = time.monotonic_ns()
    try:
        responses = backend.execute(requests)
    except Exception as exc:  # the whole batch failed: every request has this error
        return [str(exc) if isinstance(exc, TritonNBError) else f"{type(exc).__name__}: {exc}"]
    for collector in collectors:  # Triton waits for every final response, however long it takes
        collector.final.wait()
    infer_ns = time.monotonic_ns() - started
    if collectors:
        outcomes = [collector.errors for collector in collectors]
    elif responses is None or len(responses) != len(requests):
        count = "no" if responses is None else len(responses)
        return [f"model '{version.name}' returned {count} responses for {len(requests)} requests"]
    else:
        outcomes = [[str(r.error)] if r.error is not None else [] for r in responses]
    finished = time.monotonic_ns()
    stats = version.stats
    stats.record_execution(batch_rows=sum(r.batch_size(version.batching) for r in requests), compute_input_ns=0,
                           compute_infer_ns=infer_ns, compute_output_ns=0)
    stats.record_successes([(finished - r.arrival_ns, 0, r.batch_size(version.batching))
                            for r, errors in zip(requests, outcomes, strict=True) if not errors],
                           compute_input_ns=0, compute_infer_ns=infer_ns, compute_output_ns=0)
    for r, errors in zip(requests, outcomes, strict=True):
        if errors:
            stats.record_request(success=False, request_ns=finished - r.arrival_ns, reason="BACKEND")
    return [error for errors in outcomes for error in errors]
