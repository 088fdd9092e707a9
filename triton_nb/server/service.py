"""The service interface: what the front ends, the in-process client and perf call on a server.

:class:`InferenceService` is the one seam between the server and everything that talks to it —
the HTTP and gRPC front ends (:mod:`triton_nb.server.frontends.http.app`,
:mod:`triton_nb.server.frontends.grpc.servicer`, :mod:`triton_nb.server.frontends.network`), the in-process
client (:mod:`triton_nb.client`) and the load generator and tuner (:mod:`triton_nb.perf`). They type
against it and import this module, never the server's implementation (:mod:`triton_nb.server.core`),
so no arrow runs from the server back up to them. :class:`triton_nb.server.core.Server` satisfies it.

Contract: every call may run on any thread; errors are :class:`~triton_nb.errors.TritonNBError`
subclasses, whose status the front ends map to HTTP and gRPC (:func:`triton_nb.errors.wire_status`);
``version`` -1 means the model's highest serving version; results are plain data (dicts, lists,
:class:`~triton_nb.repository.config.ModelConfig`) the caller may keep, except where a docstring
says otherwise.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from triton_nb.repository.config import ModelConfig
from triton_nb.tensors import InferRequest, InferResponse

__all__ = ["InferenceService"]


@runtime_checkable
class InferenceService(Protocol):
    """A Triton-compatible server, as its callers see it."""

    # ------------------------------------------------------------------ health
    def is_server_live(self) -> bool:
        """Started and not stopped."""

    def is_server_ready(self) -> bool:
        """Live, and every model that was asked for is ready (Triton's strict readiness)."""

    def is_model_ready(self, name: str, version: int | None = None) -> bool:
        """A version of ``name`` (``version``, or the highest) is serving."""

    # ------------------------------------------------------------------ inference
    def infer_async(self, request: InferRequest) -> Future[InferResponse]:
        """Queue a request; the future resolves to its response or fails with its error. Raises at
        once when the request is refused (unknown model, bad input, server full)."""

    def infer(self, request: InferRequest, timeout_s: float | None = None) -> InferResponse:
        """Run a request and wait for its response (raises the request's error)."""

    def infer_carried_async(self, request: InferRequest) -> list[Future[InferResponse]] | None:
        """Queue the requests ``request`` carries: requests of one signature a front end decoded
        together, their inputs joined along the batch (``carried_rows``, the rows of each, and
        ``carried_request_ids``, in order). One future each, in order; each request is admitted,
        checked, counted and answered or failed as if it came alone. None, with nothing queued or
        counted, where the server cannot take them so (the front end then sends them one by one)."""

    def infer_together(self) -> AbstractContextManager[None]:
        """``with service.infer_together():`` around :meth:`infer_async` calls for a burst of requests
        received at once, on one thread: work they set off together (an ensemble's first step)
        starts together when the block ends, so that it may be carried as one request."""

    # ------------------------------------------------------------------ metadata
    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The effective config, with live batching knobs reflected (a copy)."""

    def model_config_json(self, name: str, version: int | None = None) -> dict[str, Any]:
        """:meth:`model_config` as Triton's JSON."""

    def input_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The loaded config itself, to read (never change) on every request: what converting
        inputs and encoding outputs need, without the cost of a copy."""

    def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        """KServe v2 model metadata."""

    def output_labels(self, name: str, output: str, version: int | None = None) -> list[str] | None:
        """The labels of an output's ``label_filename`` (the classification extension); None
        when the output has none."""

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository with its versions' states, as Triton's index API."""

    def statistics(self, name: str | None = None, version: int | None = None) -> dict[str, Any]:
        """Triton's statistics-extension JSON, of one model (and version) or of all."""

    def metrics_text(self) -> bytes:
        """The Prometheus exposition of the server's metrics, with Triton's ``nv_inference_*`` names."""

    @property
    def endpoints(self) -> dict[str, str]:
        """``{"http": "127.0.0.1:8000", ...}`` for the network front ends that are on."""

    # ------------------------------------------------------------------ model control
    def check_network_model_control(self, model: str, action: str) -> None:
        """Raise unless a network client may ``action`` ("load", "unload") ``model``."""

    def load_model(self, name: str, config: str | dict[str, Any] | ModelConfig | None = None,
                   files: dict[str, bytes | str] | None = None) -> None:
        """Load or reload a model, as Triton's repository load API (config and file overrides)."""

    def unload_model(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload every version of a model, as Triton's repository unload API."""

    def register_model_repository(self, repository: str | os.PathLike[str],
                                  mapping: dict[str, str] | None = None) -> list[str]:
        """Serve another repository's models beside the server's own (names mapped per folder)."""

    def unregister_model_repository(self, repository: str | os.PathLike[str]) -> None:
        """Stop serving a registered repository's models."""

    def update_batching(self, name: str, version: int | None = None, **knobs: Any) -> dict[str, Any]:
        """Change batching knobs and instance count of a serving model live; returns those in force."""

    def wait_warm(self, name: str, version: int | None = None, timeout_s: float | None = None) -> bool:
        """Wait until a model's instances serve at their steady speed (FIL's compiled engine
        ready; an ensemble's composing models); False when ``timeout_s`` passed first."""
