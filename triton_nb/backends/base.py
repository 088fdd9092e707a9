"""What every backend implements: one object per model instance, executing batches.

The server creates ``instance_group.count`` backend objects per model version (one per
instance), each on its own worker thread, and hands each a batch at a time — a list of
:class:`~triton_nb.tensors.InferRequest` whose inputs the server has already checked
against the model's config (names, datatypes, shapes, batch size). A backend answers with one
:class:`~triton_nb.tensors.InferResponse` per request, in order:

* an error that concerns one request goes in that response's ``error`` (the others succeed);
* an exception raised from :meth:`Backend.execute` fails the whole batch;
* a decoupled model (``model_transaction_policy { decoupled: true }``) returns ``None`` and
  streams through each request's ``response_sender``.

Backends never see requests for other models and never block on the server, except through
:class:`ServerHandle` (calls to other models from a Python model, "BLS"), which the server
passes in the :class:`ModelContext`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from triton_nb.backends.backend_config import PythonBackendOptions
from triton_nb.tensors import CarriedResponses, InferRequest, InferResponse

if TYPE_CHECKING:  # protobuf stays out of a Python model's own process, which imports this module
    from triton_nb.repository.config import ModelConfig

__all__ = ["Backend", "ModelContext", "ServerHandle", "execute_apart"]


class ServerHandle(Protocol):
    """The part of the server a backend may call: inference on other models (BLS) and, for
    ``pb_utils.load_model`` / ``unload_model``, the model control API."""

    #: ``"none"``, ``"explicit"`` or ``"poll"``: pb_utils' model loading API needs ``"explicit"``.
    model_control_mode: str

    def infer(self, request: InferRequest) -> InferResponse:
        """Run a request through the target model's scheduler and wait for its response."""

    def infer_async(self, request: InferRequest) -> Future[InferResponse]:
        """Same, without waiting."""

    def is_model_ready(self, name: str, version: int | None = None) -> bool: ...

    def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) a model, with an optional JSON config and ``"file:<path>"`` overrides."""

    def unload_model(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload every version of a model."""


@dataclass(frozen=True)
class ModelContext:
    """Everything one model instance needs to load."""

    name: str
    version: int
    config: ModelConfig  # the effective config (Triton's defaults applied)
    model_path: Path  # <repository>/<model>
    version_path: Path  # <repository>/<model>/<version>
    repository_path: Path
    instance_name: str  # "<group name>_<index>", as Triton names instances
    instance_kind: str = "KIND_CPU"  # KIND_CPU or KIND_GPU (KIND_AUTO is resolved before)
    device_id: int = 0
    server: ServerHandle | None = None
    #: How the server runs Python-model instances: "thread" (in this process) or "process" (a
    #: process each, as Triton's stubs); a model with EXECUTION_ENV_PATH runs in processes anyway.
    python_instances: str = "thread"
    #: The Python backend's ``--backend-config`` settings (process instances read them).
    python_backend: PythonBackendOptions = field(default_factory=PythonBackendOptions)


class Backend(ABC):
    """One instance of one model version. Construct = load; raise to fail the load."""

    #: True when responses stream through ``InferRequest.response_sender``.
    decoupled: bool = False
    #: True when the backend takes one request carrying several requests' rows
    #: (``InferRequest.carried_rows``) and answers each of them as it would have answered them
    #: batched apart: a tree model (each output row depends on its input row alone, and a batch
    #: fails as a whole), or a Python model, which hands the model the carried requests apart. An
    #: ensemble may then hand such a model a formed batch as one request.
    accepts_carried: bool = False

    def __init__(self, context: ModelContext) -> None:
        self.context = context

    @abstractmethod
    def execute(self, requests: list[InferRequest]) -> list[InferResponse] | None:
        """Answer a batch: one response per request, in order (None when decoupled)."""

    def wait_warm(self, timeout_s: float | None = None) -> bool:
        """Wait until the instance serves at its steady speed (a backend that builds a faster
        engine in the background after the load, as FIL's compiled library, finishes it);
        True when it does. Most backends are warm once loaded."""
        return True

    def check_ready(self) -> None:  # noqa: B027 - optional hook, like TRITONBACKEND_ModelInstanceReady
        """Raise the error that says why the instance is not ready; return when it is. The model's
        readiness asks every instance (Triton's ``TritonModel::IsReady``); most are ready once loaded."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, like Triton's finalize
        """Release what the instance holds; called once when the version unloads."""


def execute_apart(requests: list[InferRequest],
                  execute: Callable[[list[InferRequest]], list[InferResponse] | None]) -> list[InferResponse] | None:
    """Run ``execute`` (a batch call that answers each request alone, as a Python model does) with
    every carried request in ``requests`` (``InferRequest.carried_rows``) handed over as the
    requests it carries, each with its own rows (views) and id, and answer it with one response:
    their outputs joined, or, where they cannot be, :class:`~triton_nb.tensors.CarriedResponses`."""
    if not any(request.carried_rows for request in requests):
        return execute(requests)
    apart: list[InferRequest] = []
    spans: list[tuple[int, int]] = []
    for request in requests:
        first = len(apart)
        apart.extend(request.carried_apart() if request.carried_rows else (request,))
        spans.append((first, len(apart)))
    responses = execute(apart)
    if responses is None:  # (a decoupled model never takes carried requests)
        return None
    return [responses[first] if not request.carried_rows else _joined(request, responses[first:end])
            for request, (first, end) in zip(requests, spans, strict=True)]


def _joined(request: InferRequest, parts: list[InferResponse]) -> InferResponse:
    """One response to a carried request from its carried requests' responses: their outputs joined
    row-wise where every one succeeded with as many rows as it sent, else each kept apart."""
    first = parts[0]
    names = first.outputs.keys()
    joinable = all(part.error is None and part.outputs.keys() == names
                   and all(array.ndim and array.shape[0] == rows for array in part.outputs.values())
                   for part, rows in zip(parts, request.carried_rows, strict=True))
    if joinable:
        try:
            outputs = {name: np.concatenate([part.outputs[name] for part in parts]) for name in names}
        except ValueError:  # shapes past the batch dimension that differ
            pass
        else:
            return InferResponse(first.model_name, first.model_version, outputs, request.request_id)
    return InferResponse(first.model_name, first.model_version, request_id=request.request_id,
                         error=CarriedResponses(parts))
