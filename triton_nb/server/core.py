"""The in-kernel inference server: model manager, model control, request routing, lifecycle.

:class:`InferenceServer` serves a Triton model repository from inside the running process. It
owns its threads — one worker per model instance, plus a poller in ``poll`` mode — and never
touches the caller's thread or event loop, so a Jupyter kernel stays responsive (ipykernel 7
stops driving background asyncio tasks between cells, hence no asyncio here at all).

Model control modes are Triton's: ``none`` (load everything at start; no load/unload calls),
``explicit`` (load what is asked: ``load_models`` at start, then :meth:`load_model`), ``poll``
(load everything, then watch the repository and reload what changed). Each model version has a
state — LOADING, READY, UNAVAILABLE (with a reason), UNLOADING — and a model that fails to load
reports why without affecting the others.

A reload is loaded beside the serving version and swapped in atomically when ready; the old
version answers what it already queued and is then finalized; a failed reload leaves the old
version serving. Batching knobs and instance counts change live (:meth:`update_batching`),
from the next batch on.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.backends.base import Backend, ModelContext
from triton_nb.errors import (
    ForbiddenError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonNBError,
    UnavailableError,
)
from triton_nb.repository.config import (
    CONFIG_FILENAME,
    ModelConfig,
    check_model_config,
    config_from_json,
    config_to_json,
    effective_config,
    is_ensemble,
    load_config,
)
from triton_nb.repository.layout import ModelEntry, RepositoryScan, scan_repository, select_versions
from triton_nb.server.batcher import Scheduler, SchedulerSettings
from triton_nb.server.ensemble import EnsembleScheduler
from triton_nb.server.network import FrontendOptions, NetworkFrontends
from triton_nb.server.stats import ModelStats, ServerStats
from triton_nb.server.types import InferRequest, InferResponse, numpy_to_triton_dtype, triton_to_numpy_dtype

__all__ = ["MODEL_CONTROL_MODES", "InferenceServer", "ModelState", "serve"]

log = logging.getLogger(__name__)

MODEL_CONTROL_MODES = ("none", "explicit", "poll")


class ModelState:
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


def create_backend(context: ModelContext) -> Backend:
    """The backend object for one instance, by ``backend`` in the config."""
    backend = context.config.backend
    if backend == "fil":
        from triton_nb.backends.fil import FilBackend

        return FilBackend(context)
    if backend == "python":
        from triton_nb.backends.python import PythonBackend

        return PythonBackend(context)
    if backend == "onnxruntime":
        from triton_nb.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(context)
    raise InvalidArgumentError(
        f"model '{context.name}': backend '{backend}' is not supported (fil, python, onnxruntime, ensemble)"
    )


@dataclass
class _Version:
    """One loaded, serving model version."""

    name: str
    version: int
    config: ModelConfig
    version_path: Path
    stats: ModelStats
    scheduler: Scheduler | None = None  # None for ensembles
    ensemble: EnsembleScheduler | None = None
    next_instance: int = 0
    # The config's tensors, read once: checking every request against the protobuf is slow.
    inputs: dict[str, _TensorSpec] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    outputs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.inputs = {t.name: _TensorSpec.of(t) for t in self.config.input}
        self.required = frozenset(t.name for t in self.config.input if not t.optional)
        self.outputs = frozenset(t.name for t in self.config.output)

    @property
    def batching(self) -> bool:
        return self.config.max_batch_size > 0


@dataclass(frozen=True)
class _TensorSpec:
    dtype: np.dtype
    dims: tuple[int, ...]
    variable: bool  # some dim is -1

    @classmethod
    def of(cls, tensor: mc.ModelInput) -> _TensorSpec:
        dims = tuple(tensor.dims)
        return cls(triton_to_numpy_dtype(mc.DataType.Name(tensor.data_type)), dims, -1 in dims)


@dataclass
class _Model:
    """Everything the server knows about one model name."""

    name: str
    versions: dict[int, _Version] = field(default_factory=dict)  # the serving set, swapped whole
    states: dict[int, tuple[str, str]] = field(default_factory=dict)  # version -> (state, reason)
    fingerprints: dict[int, str] = field(default_factory=dict)
    override_dir: Path | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)


class InferenceServer:
    """A Triton-compatible server running inside this process.

    Parameters
    ----------
    model_repository:
        The repository folder (Triton's layout).
    model_control_mode:
        ``"none"``, ``"explicit"`` or ``"poll"``, as Triton's ``--model-control-mode``.
    load_models:
        In explicit mode, the models to load at start (``"*"`` for all), as ``--load-model``.
    repository_poll_secs:
        In poll mode, how often the repository is scanned for changes.
    http_port, grpc_port, metrics_port:
        Serve KServe v2 HTTP, Triton gRPC and Prometheus metrics on these ports (0 picks a free
        port; :attr:`http_port` and the others report what was bound). None (the default)
        leaves an endpoint off: in-process calls need no network.
    http_address, grpc_address, metrics_address:
        Interfaces to listen on; loopback unless told otherwise (a warning is logged otherwise).
    max_request_bytes, max_tensor_elements, grpc_max_message_bytes:
        Bounds on one request over the network: body size (after decompression), elements one
        tensor may declare, and gRPC message size.
    exit_timeout_secs:
        On :meth:`stop`, how long requests in flight over the network have to finish before the
        rest are failed (Triton's ``--exit-timeout-secs``).
    http_read_timeout_secs, http_timeout_keep_alive_secs:
        An HTTP request must arrive whole (head and body) within ``http_read_timeout_secs`` of its
        first byte, or it is answered 408 and its connection closed (slow clients); a connection
        with no request under way is closed after ``http_timeout_keep_alive_secs`` idle.
    max_pending_requests:
        Requests that may wait or run at once, server-wide; past it requests are refused at once
        with UNAVAILABLE (503), which bounds memory when clients outpace the models.
    max_string_bytes:
        The longest element a BYTES (string) input may hold, on every path (in-process too). The
        fraud pipeline's strings are a few dozen bytes; the limit stops one enormous value from
        costing the preprocessing its memory and time. Raise it for models that take documents.
    network_model_control:
        Let HTTP and gRPC clients load and unload models (the repository API). Off by default,
        even in explicit mode: a load may carry a ``model.py`` as a file override, which is code
        this process would run for anyone who can reach the port. The notebook's own calls
        (:meth:`load_model`, the magics, the tuner) are not network calls and always work.
    http_restricted_api, grpc_restricted_api:
        Triton's restricted APIs: ``"<group>[,<group>...]:<key>=<value>"`` (or a list of them) lets
        requests to those API groups (health, metadata, inference, shared-memory, model-config,
        model-repository, statistics, trace, logging) through only with that header / gRPC
        metadata; others get 403 / PERMISSION_DENIED.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *,
        model_control_mode: str = "explicit",
        load_models: list[str] | tuple[str, ...] | str = "*",
        repository_poll_secs: float = 15.0,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        http_address: str = "127.0.0.1",
        grpc_address: str = "127.0.0.1",
        metrics_address: str = "127.0.0.1",
        max_request_bytes: int = 64 * 1024 * 1024,
        max_tensor_elements: int = 16 * 1024 * 1024,
        grpc_max_message_bytes: int = 64 * 1024 * 1024,
        exit_timeout_secs: float = 30.0,
        http_read_timeout_secs: float = 60.0,
        http_timeout_keep_alive_secs: float = 75.0,
        http_restricted_api: list[str] | tuple[str, ...] | str = (),
        grpc_restricted_api: list[str] | tuple[str, ...] | str = (),
        max_pending_requests: int = 65536,
        max_string_bytes: int = 1024 * 1024,
        network_model_control: bool = False,
    ) -> None:
        if model_control_mode not in MODEL_CONTROL_MODES:
            raise InvalidArgumentError(
                f"model_control_mode must be one of {', '.join(MODEL_CONTROL_MODES)}, got {model_control_mode!r}"
            )
        if repository_poll_secs <= 0:
            raise InvalidArgumentError(f"repository_poll_secs must be > 0, got {repository_poll_secs}")
        if max_pending_requests < 1:
            raise InvalidArgumentError(f"max_pending_requests must be >= 1, got {max_pending_requests}")
        self.max_pending_requests = max_pending_requests
        if max_string_bytes < 1:
            raise InvalidArgumentError(f"max_string_bytes must be >= 1, got {max_string_bytes}")
        self.max_string_bytes = max_string_bytes
        self.network_model_control = bool(network_model_control)
        self._pending = 0
        self._pending_lock = threading.Lock()
        self.repository = Path(model_repository)
        if not self.repository.is_dir():
            raise NotFoundError(f"model repository {self.repository} does not exist or is not a folder")
        self.model_control_mode = model_control_mode
        self._load_models = [load_models] if isinstance(load_models, str) else list(load_models)
        self.repository_poll_secs = repository_poll_secs
        self.stats = ServerStats()
        self._models: dict[str, _Model] = {}
        self._models_lock = threading.RLock()
        self._started = False
        self._stopped = False
        self._stop_event = threading.Event()
        self._poller: threading.Thread | None = None
        self._frontend_options = FrontendOptions(
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, http_address=http_address,
            grpc_address=grpc_address, metrics_address=metrics_address, max_request_bytes=max_request_bytes,
            max_tensor_elements=max_tensor_elements, grpc_max_message_bytes=grpc_max_message_bytes,
            exit_timeout_secs=exit_timeout_secs, http_read_timeout_secs=http_read_timeout_secs,
            http_timeout_keep_alive_secs=http_timeout_keep_alive_secs,
            http_restricted_api=(http_restricted_api,) if isinstance(http_restricted_api, str) else tuple(
                http_restricted_api),
            grpc_restricted_api=(grpc_restricted_api,) if isinstance(grpc_restricted_api, str) else tuple(
                grpc_restricted_api))
        self._frontends: NetworkFrontends | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="triton-nb-server-"))
        self._retiring: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> InferenceServer:
        """Load the models the control mode says to load; return at once when done."""
        if self._started:
            return self
        self._started = True
        names = self._initial_models()
        for name in names:
            try:
                self.load_model(name, _internal=True)
            except TritonNBError as exc:  # one bad model never stops the others
                log.warning("model '%s' failed to load: %s", name, exc)
        if self.model_control_mode == "poll":
            self._poller = threading.Thread(target=self._poll, name="triton-nb-poller", daemon=True)
            self._poller.start()
        if self._frontend_options.enabled:
            self._frontends = NetworkFrontends(self, self._frontend_options)
            try:
                self._frontends.start()
            except BaseException:
                self._frontends = None
                self.stop()
                raise
        return self

    # ------------------------------------------------------------------ endpoints
    def _port(self, name: str) -> int | None:
        return None if self._frontends is None else self._frontends.ports.get(name)

    @property
    def http_port(self) -> int | None:
        """The port the HTTP front end listens on (None when it is off)."""
        return self._port("http")

    @property
    def grpc_port(self) -> int | None:
        """The port the gRPC front end listens on (None when it is off)."""
        return self._port("grpc")

    @property
    def metrics_port(self) -> int | None:
        """The port of the Prometheus metrics endpoint (None when it is off)."""
        return self._port("metrics")

    @property
    def endpoints(self) -> dict[str, str]:
        """``{"http": "127.0.0.1:8000", ...}`` for the front ends that are on."""
        options = self._frontend_options
        addresses = {"http": options.http_address, "grpc": options.grpc_address, "metrics": options.metrics_address}
        ports = {} if self._frontends is None else self._frontends.ports
        return {name: f"{addresses[name]}:{port}" for name, port in ports.items()}

    def _initial_models(self) -> list[str]:
        scan = scan_repository(self.repository)
        if self.model_control_mode == "explicit" and "*" not in self._load_models:
            unknown = [name for name in self._load_models if name not in scan.models]
            if unknown:
                raise NotFoundError(f"load_models: no model(s) {', '.join(unknown)} in {self.repository}")
            return list(self._load_models)
        return list(scan.models)

    def stop(self) -> None:
        """Fail queued requests, let running batches finish, finalize every instance, join
        every thread. Safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        frontends = self._frontends
        if frontends is not None:
            # requests in flight over the network are answered while the models still serve
            frontends.begin_stop()
            frontends.wait(self._frontend_options.exit_timeout_secs)
        if self._poller is not None:
            self._poller.join()
        with self._models_lock:
            models = list(self._models.values())
        for model in models:
            with model.lock:
                for version in model.versions.values():
                    self._retire_version(version, drain=False, wait=True)
                model.versions = {}
                model.states = {v: (ModelState.UNAVAILABLE, "server stopped") for v in model.states}
        for thread in self._retiring:
            thread.join()
        if frontends is not None and not frontends.wait(10.0):  # what was in flight has been answered
            log.warning("the network front ends did not stop in time; ending them")
            frontends.kill()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> InferenceServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:  # a forgotten server must not leak its temp folder
        if getattr(self, "_workdir", None) is not None and not getattr(self, "_stopped", True):
            shutil.rmtree(self._workdir, ignore_errors=True)

    # ------------------------------------------------------------------ health
    def is_server_live(self) -> bool:
        return self._started and not self._stopped

    def is_server_ready(self) -> bool:
        """Ready when live and every model that was asked for is ready (Triton's strict readiness)."""
        if not self.is_server_live():
            return False
        with self._models_lock:
            return all(
                state == ModelState.READY for model in self._models.values() for state, _ in model.states.values()
            )

    def is_model_ready(self, name: str, version: int = -1) -> bool:
        try:
            self._resolve(name, version)
        except TritonNBError:
            return False
        return True

    # ------------------------------------------------------------------ model control
    def check_network_model_control(self, model: str, action: str) -> None:
        """What the front ends ask before a network client's load or unload (see
        ``network_model_control``). Modes none and poll keep Triton's own refusal."""
        if self.model_control_mode == "explicit" and not self.network_model_control:
            raise ForbiddenError(
                f"model '{model}': {action} over the network is off; start the server with "
                f"network_model_control=True (triton-nb serve: --model-control-mode=explicit) to allow it")

    def _require_explicit(self, action: str) -> None:
        if self.model_control_mode == "poll":
            raise UnavailableError(f"explicit model {action} is not allowed if polling is enabled")
        if self.model_control_mode == "none":
            raise UnavailableError(f"explicit model {action} is not allowed if model control mode is NONE")

    def load_model(
        self,
        name: str,
        config: str | dict[str, Any] | ModelConfig | None = None,
        files: dict[str, bytes | str] | None = None,
        *,
        _internal: bool = False,
    ) -> None:
        """Load (or reload) a model, as Triton's repository load API.

        ``config`` overrides ``config.pbtxt`` (Triton's JSON, a dict, or a ModelConfig);
        ``files`` maps ``"file:<version>/<name>"`` (or ``"<version>/<name>"``) to contents
        (bytes, or base64 text as the HTTP API sends), replacing the model folder's files —
        a config override is then required, as in Triton. Paths are confined to the model
        folder. The new version set is loaded beside the serving one and swapped in when ready.
        """
        if self._stopped:
            raise UnavailableError("the server is stopped")
        if not _internal:
            self._require_explicit("load")
        source = self.repository / name
        if not files and (not source.is_dir() or (config is None and not (source / CONFIG_FILENAME).is_file())):
            raise NotFoundError(f"no model '{name}' in repository {self.repository}")
        model = self._model_record(name)
        with model.lock:
            if files:
                if config is None:
                    raise InvalidArgumentError(
                        f"model '{name}': file overrides need a config override as well (Triton's rule)"
                    )
                source = self._write_overrides(model, files)
            try:
                loaded = self._load_versions(name, source, config)
            except TritonNBError as exc:
                if not model.versions:
                    model.states = {-1: (ModelState.UNAVAILABLE, str(exc))}
                else:  # a failed reload marked its versions LOADING; the serving ones still serve
                    model.states = {v: (ModelState.READY, "") for v in model.versions}
                raise
            old = model.versions
            model.versions = {v.version: v for v in loaded}
            model.states = {v.version: (ModelState.READY, "") for v in loaded}
            model.fingerprints = self._fingerprints(source, loaded)
        for version in old.values():
            self._retire_version(version, drain=True, wait=False)

    def unload_model(self, name: str, *, unload_dependents: bool = False, _internal: bool = False) -> None:
        """Unload every version of a model; queued requests are still answered. Unloading a model
        that is not loaded does nothing, as in Triton."""
        if not _internal:
            self._require_explicit("unload")
        with self._models_lock:
            model = self._models.get(name)
        if model is None or not model.versions:  # nothing to do, and no error: Triton's rule
            log.debug("unload of model '%s', which is not loaded: nothing to do", name)
            return
        with model.lock:
            old = model.versions
            model.versions = {}
            model.states = {v: (ModelState.UNAVAILABLE, "unloaded") for v in old}
        for version in old.values():
            self._retire_version(version, drain=True, wait=True)
            self.stats.remove(name, version.version)
        if unload_dependents:
            for other in self._ensembles_using(name):
                self.unload_model(other, _internal=True)

    def _ensembles_using(self, name: str) -> list[str]:
        with self._models_lock:
            models = list(self._models.values())
        return sorted({
            model.name for model in models for version in model.versions.values()
            if version.ensemble is not None and any(s.model_name == name for s in version.ensemble.steps)
        })

    def _model_record(self, name: str) -> _Model:
        with self._models_lock:
            return self._models.setdefault(name, _Model(name))

    def _write_overrides(self, model: _Model, files: dict[str, bytes | str]) -> Path:
        """Write override files into a private copy of the model folder, confined to it."""
        target = Path(tempfile.mkdtemp(prefix=f"{model.name}-", dir=self._workdir)) / model.name
        target.mkdir()
        for key, content in files.items():
            relative = key.removeprefix("file:")
            path = PurePosixPath(relative)
            if path.is_absolute() or ".." in path.parts or not path.parts or "\\" in relative:
                raise InvalidArgumentError(
                    f"model '{model.name}': file override '{key}' must be a relative path inside the model folder"
                )
            data = content if isinstance(content, bytes) else _decode_base64(key, content)
            destination = target.joinpath(*path.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(data)
        if model.override_dir is not None:
            shutil.rmtree(model.override_dir.parent, ignore_errors=True)
        model.override_dir = target
        return target

    def _read_config(self, name: str, source: Path, override: Any) -> ModelConfig:
        if override is None:
            config = load_config(source / CONFIG_FILENAME)
        elif isinstance(override, ModelConfig):
            config = override
        else:
            config = config_from_json(override, source=f"model '{name}' config override")
        if config.backend == "python" and not (config.input and config.output):
            from triton_nb.backends.python import auto_complete

            versions = sorted(int(p.name) for p in source.iterdir() if p.is_dir() and p.name.isdigit())
            if versions:
                config = auto_complete(config, source / str(versions[-1]))
        effective = effective_config(config, name, gpu_available=_gpu_available())
        problems = [p for p in check_model_config(effective, name) if p.severity == "error"]
        if problems:
            raise InvalidArgumentError("; ".join(str(p) for p in problems))
        return effective

    def _load_versions(self, name: str, source: Path, override: Any) -> list[_Version]:
        config = self._read_config(name, source, override)
        available = sorted(int(p.name) for p in source.iterdir() if p.is_dir() and p.name.isdigit())
        versions = select_versions(config, available)
        if not versions:
            raise NotFoundError(f"model '{name}': no version folder matches the version policy (found {available})")
        if is_ensemble(config):
            self._prepare_ensemble(name, config)
        loaded: list[_Version] = []
        model = self._model_record(name)
        try:
            for number in versions:
                model.states[number] = (ModelState.LOADING, "")
                loaded.append(self._load_version(name, number, config, source))
        except BaseException:
            for version in loaded:
                self._retire_version(version, drain=False, wait=True)
            raise
        return loaded

    def _prepare_ensemble(self, name: str, config: ModelConfig) -> None:
        """Load the composing models, then check the ensemble against their configs."""
        from triton_nb.repository.validate import _check_ensemble

        entries = {}
        for step in config.ensemble_scheduling.step:
            composing = step.model_name
            if composing == name:
                raise InvalidArgumentError(f"ensemble '{name}' lists itself as a step")
            if not self._serving(composing):
                try:
                    self.load_model(composing, _internal=True)
                except TritonNBError as exc:
                    raise UnavailableError(
                        f"ensemble '{name}': composing model '{composing}' failed to load: {exc}") from None
            version = self._resolve(composing, -1)
            entries[composing] = ModelEntry(composing, self.repository / composing, version.config,
                                            versions=[version.version])
        entries[name] = ModelEntry(name, self.repository / name, config, versions=[1])
        problems = [p for p in _check_ensemble(entries[name], RepositoryScan(self.repository, entries))
                    if p.severity == "error"]
        if problems:
            raise InvalidArgumentError("; ".join(str(p) for p in problems))

    def _serving(self, name: str) -> bool:
        with self._models_lock:
            model = self._models.get(name)
        return model is not None and bool(model.versions)

    def _load_version(self, name: str, number: int, config: ModelConfig, source: Path) -> _Version:
        stats = self.stats.model(name, number)
        version = _Version(name, number, config, source / str(number), stats)
        if is_ensemble(config):
            version.ensemble = EnsembleScheduler(name, number, config, self._infer_step)
            return version
        version.scheduler = Scheduler(name, number, SchedulerSettings.from_config(config),
                                      lambda backend, requests: self._run_batch(version, backend, requests))
        try:
            for group in config.instance_group:
                for _ in range(group.count):
                    self._add_instance(version, group, source)
        except BaseException:
            self._retire_version(version, drain=False, wait=True)
            raise
        return version

    def _add_instance(self, version: _Version, group: mc.ModelInstanceGroup, source: Path) -> None:
        index = version.next_instance
        version.next_instance += 1
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        context = ModelContext(
            name=version.name,
            version=version.version,
            config=version.config,
            model_path=source,
            version_path=version.version_path,
            repository_path=self.repository,
            instance_name=f"{group.name}_{index}",
            instance_kind=kind,
            device_id=int(group.gpus[0]) if group.gpus else 0,
            server=self,
        )
        try:
            backend = create_backend(context)
        except TritonNBError:
            raise
        except Exception as exc:  # a backend's own failure: the model's load error, named
            raise InternalError(f"model '{version.name}' version {version.version} failed to load: "
                                f"{type(exc).__name__}: {exc}") from None
        version.scheduler.add_instance(backend, f"triton-nb-{version.name}-{context.instance_name}")

    def _retire_version(self, version: _Version, *, drain: bool, wait: bool) -> None:
        """Stop a version's scheduler and finalize its instances (in the background unless wait)."""
        def retire() -> None:
            if version.scheduler is None:
                return
            # a stopping server waits at most exit_timeout_secs for a batch that is executing
            timeout = self._frontend_options.exit_timeout_secs if self._stopped else None
            for backend in version.scheduler.stop(drain=drain, timeout_s=timeout):
                try:
                    backend.finalize()
                except Exception:
                    log.exception("model '%s' version %s: finalize failed", version.name, version.version)

        if wait:
            retire()
        else:
            thread = threading.Thread(target=retire, name=f"triton-nb-retire-{version.name}", daemon=True)
            # keep only retirements still running: a long-lived server reloads many times
            self._retiring = [t for t in self._retiring if t.is_alive()] + [thread]
            thread.start()

    def _fingerprints(self, source: Path, loaded: list[_Version]) -> dict[int, str]:
        entry = ModelEntry(source.name, source, None)
        return {v.version: entry.fingerprint(v.version) for v in loaded}

    # ------------------------------------------------------------------ polling
    def _poll(self) -> None:
        while not self._stop_event.wait(self.repository_poll_secs):
            try:
                self.poll_once()
            except Exception:
                log.exception("repository poll failed")

    def poll_once(self) -> list[str]:
        """Scan the repository and load new, reload changed and unload removed models (what
        poll mode does every ``repository_poll_secs``); returns the names acted on."""
        scan = scan_repository(self.repository)
        changed = []
        with self._models_lock:
            known = dict(self._models)
        for name, entry in scan.models.items():
            model = known.get(name)
            selected = entry.selected_versions
            wanted = {v: entry.fingerprint(v) for v in selected}
            if model is None or model.fingerprints != wanted or model.override_dir is not None:
                if model is not None and model.override_dir is not None:
                    continue  # an override wins until the model is loaded from the repository again
                changed.append(name)
                try:
                    self.load_model(name, _internal=True)
                except TritonNBError as exc:
                    log.warning("model '%s' failed to load: %s", name, exc)
        for name, model in known.items():
            if name not in scan.models and model.versions:
                changed.append(name)
                self.unload_model(name, _internal=True)
        return changed

    # ------------------------------------------------------------------ live knobs
    def update_batching(self, name: str, version: int = -1, **knobs: Any) -> dict[str, Any]:
        """Change batching knobs of a serving model without a reload, from the next batch on.

        Knobs: ``max_queue_delay_microseconds``, ``preferred_batch_size``, ``max_batch_size``
        (up to the model's configured limit), ``instance_count``, ``preserve_ordering``.
        Returns the knobs now in force.
        """
        allowed = {"max_queue_delay_microseconds", "preferred_batch_size", "max_batch_size", "instance_count",
                   "preserve_ordering"}
        unknown = sorted(set(knobs) - allowed)
        if unknown:
            raise InvalidArgumentError(f"unknown batching knob(s): {', '.join(unknown)}")
        target = self._resolve(name, version)
        if target.scheduler is None:
            raise InvalidArgumentError(f"model '{name}' is an ensemble: tune its composing models instead")
        limit = target.config.max_batch_size
        settings = {k: v for k, v in knobs.items() if k != "instance_count" and v is not None}
        if "max_batch_size" in settings and not 1 <= settings["max_batch_size"] <= limit:
            raise InvalidArgumentError(
                f"model '{name}': max_batch_size {settings['max_batch_size']} must be between 1 and the "
                f"model's limit {limit}")
        if "max_queue_delay_microseconds" in settings and settings["max_queue_delay_microseconds"] < 0:
            raise InvalidArgumentError("max_queue_delay_microseconds must be >= 0")
        current_limit = settings.get("max_batch_size", target.scheduler.settings.max_batch_size)
        if "preferred_batch_size" in settings:
            sizes = tuple(int(s) for s in settings["preferred_batch_size"])
            if any(not 1 <= s <= current_limit for s in sizes):
                raise InvalidArgumentError(f"preferred_batch_size {list(sizes)} must lie within 1..{current_limit}")
            settings["preferred_batch_size"] = sizes
        if settings and not target.scheduler.settings.dynamic_batching and target.batching:
            settings["dynamic_batching"] = True
        updated = target.scheduler.update(**settings)
        count = knobs.get("instance_count")
        if count is not None:
            self._set_instance_count(target, int(count))
        return {
            "max_batch_size": updated.max_batch_size,
            "max_queue_delay_microseconds": updated.max_queue_delay_microseconds,
            "preferred_batch_size": list(updated.preferred_batch_size),
            "preserve_ordering": updated.preserve_ordering,
            "instance_count": target.scheduler.instance_count,
        }

    def _set_instance_count(self, version: _Version, count: int) -> None:
        if count < 1:
            raise InvalidArgumentError(f"instance_count must be >= 1, got {count}")
        current = version.scheduler.instance_count
        group = version.config.instance_group[0]
        source = version.version_path.parent
        for _ in range(count - current):
            self._add_instance(version, group, source)
        if count < current:
            for backend in version.scheduler.retire_instances(current - count):
                backend.finalize()

    # ------------------------------------------------------------------ inference
    def _resolve(self, name: str, version: int = -1) -> _Version:
        with self._models_lock:
            model = self._models.get(name)
        if model is None or (not model.versions and not model.states):
            raise NotFoundError(f"Request for unknown model: '{name}' is not found"
                                + _suggest(name, list(self._models)))
        serving = model.versions
        if not serving:
            state, reason = next(iter(model.states.values()), (ModelState.UNAVAILABLE, ""))
            # Triton's words; the reason is added when it says more than that the model was unloaded
            why = "" if reason == "unloaded" else f" ({state}{': ' + reason if reason else ''})"
            raise NotFoundError(f"Request for unknown model: '{name}' has no available versions{why}")
        if version in (-1, 0):
            return serving[max(serving)]
        if version not in serving:
            raise NotFoundError(f"Request for unknown model: '{name}' version {version} is not found")
        return serving[version]

    def infer_async(self, request: InferRequest) -> Future:
        """Queue a request; the future resolves to an InferResponse or an exception.

        At most ``max_pending_requests`` requests wait or run at once, server-wide: past that a
        request is refused at once (UNAVAILABLE), so clients sending faster than the models serve
        cannot make memory grow without end (a model's ``max_queue_size`` refuses earlier)."""
        with self._pending_lock:
            if self._pending >= self.max_pending_requests:
                raise UnavailableError(
                    f"the server has {self._pending} pending requests (max_pending_requests "
                    f"{self.max_pending_requests}): model '{request.model_name}' request refused")
            self._pending += 1
        try:
            future = self._infer_step(request, self.max_string_bytes)
        except BaseException:
            self._release_pending(None)
            raise
        future.add_done_callback(self._release_pending)
        return future

    def _release_pending(self, _future: Future | None) -> None:
        with self._pending_lock:
            self._pending -= 1

    @property
    def pending_requests(self) -> int:
        """Requests accepted and not yet answered, server-wide (ensemble steps not counted)."""
        return self._pending

    def _infer_step(self, request: InferRequest, max_string_bytes: int | None = None) -> Future:
        """:meth:`infer_async` without the server-wide limit: for the steps of an ensemble the
        limit has already admitted. Steps skip the string-length check (``max_string_bytes``
        None): their strings are the ensemble's own inputs, checked once on the way in, or a
        model's outputs."""
        if self._stopped:
            raise UnavailableError("the server is stopped")
        for attempt in range(3):
            target = self._resolve(request.model_name, request.model_version)
            try:
                _check_request(target, request, target.scheduler.settings.max_batch_size if target.scheduler else None,
                               max_string_bytes)
            except TritonNBError:
                target.stats.record_request(success=False, request_ns=time.monotonic_ns() - request.arrival_ns,
                                            reason="OTHER")
                raise
            if target.ensemble is not None:
                future = target.ensemble.run(request)
                self._track(target, request, future)
                return future
            future: Future = Future()
            try:
                target.scheduler.enqueue(request, future)
            except UnavailableError:
                # A reload swapped this version out between resolve and enqueue: the new one serves.
                if attempt < 2 and self._resolve(request.model_name, request.model_version) is not target:
                    continue
                target.stats.record_request(success=False, request_ns=0, reason="REJECTED")
                raise
            except TritonNBError:
                target.stats.record_request(success=False, request_ns=0, reason="OTHER")
                raise
            self._track(target, request, future)
            return future
        raise InternalError("unreachable")  # pragma: no cover

    def _track(self, target: _Version, request: InferRequest, future: Future) -> None:
        # Triton's pending gauge counts requests waiting to execute: +1 here, -1 when a batch
        # takes the request (_run_batch) or when it leaves the queue without running.
        target.stats.pending_add(1)

        def done(finished: Future) -> None:
            if "queue" not in request.timing or target.ensemble is not None:
                target.stats.pending_add(-1)
            elapsed = time.monotonic_ns() - request.arrival_ns
            error = None if finished.cancelled() else finished.exception()
            ok = not finished.cancelled() and error is None
            timing = request.timing
            target.stats.record_request(
                success=ok, request_ns=elapsed, queue_ns=timing.get("queue", 0),
                compute_input_ns=timing.get("compute_input", 0), compute_infer_ns=timing.get("compute_infer", 0),
                compute_output_ns=timing.get("compute_output", 0),
                batch_size=request.batch_size(target.batching), reason=_failure_reason(finished, error, timing),
            )

        future.add_done_callback(done)

    def infer(self, request: InferRequest, timeout_s: float | None = None) -> InferResponse:
        """Run a request and wait for its response (raises the request's error)."""
        future = self.infer_async(request)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise UnavailableError(
                f"model '{request.model_name}': no response within {timeout_s:g} s (request timed out)") from None

    def _run_batch(self, version: _Version, backend: Backend, requests: list[InferRequest]) -> list[InferResponse]:
        started = time.monotonic_ns()
        for request in requests:
            request.timing["queue"] = started - request.arrival_ns
        version.stats.pending_add(-len(requests))
        before_infer = time.monotonic_ns()
        responses = backend.execute(requests)
        after_infer = time.monotonic_ns()
        if responses is not None:
            responses = [_filter_outputs(version, request, response) for request, response in zip(
                requests, responses, strict=False)]
        finished = time.monotonic_ns()
        timing = {"compute_input": before_infer - started, "compute_infer": after_infer - before_infer,
                  "compute_output": finished - after_infer}
        for request in requests:
            request.timing.update(timing)
        rows = sum(r.batch_size(version.batching) for r in requests)
        version.stats.record_execution(batch_rows=rows, compute_input_ns=timing["compute_input"],
                                       compute_infer_ns=timing["compute_infer"],
                                       compute_output_ns=timing["compute_output"])
        return responses

    # ------------------------------------------------------------------ metadata
    def model_config(self, name: str, version: int = -1) -> ModelConfig:
        """The effective config, with live batching knobs reflected."""
        target = self._resolve(name, version)
        config = ModelConfig()
        config.CopyFrom(target.config)
        if target.scheduler is not None:
            settings = target.scheduler.settings
            if settings.dynamic_batching:
                config.max_batch_size = settings.max_batch_size
                config.dynamic_batching.max_queue_delay_microseconds = settings.max_queue_delay_microseconds
                del config.dynamic_batching.preferred_batch_size[:]
                config.dynamic_batching.preferred_batch_size.extend(settings.preferred_batch_size)
                config.dynamic_batching.preserve_ordering = settings.preserve_ordering
            if config.instance_group:
                config.instance_group[0].count = target.scheduler.instance_count
                del config.instance_group[1:]
        return config

    def input_config(self, name: str, version: int = -1) -> ModelConfig:
        """The loaded config itself, not a copy (read it, never change it): what clients need
        to convert inputs, without the cost of :meth:`model_config` on every request."""
        return self._resolve(name, version).config

    def model_metadata(self, name: str, version: int = -1) -> dict[str, Any]:
        """KServe v2 model metadata."""
        target = self._resolve(name, version)
        config = target.config
        batch = [-1] if config.max_batch_size > 0 else []

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": mc.DataType.Name(t.data_type).removeprefix("TYPE_").replace(
                "STRING", "BYTES"), "shape": batch + list(t.dims)} for t in items]

        with self._models_lock:
            versions = sorted(self._models[name].versions)
        return {
            "name": name,
            "versions": [str(v) for v in versions],
            "platform": config.platform or config.backend,
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository with its versions' states, as Triton's index API."""
        scan = scan_repository(self.repository)
        with self._models_lock:
            models = dict(self._models)
        index = []
        for name in sorted(set(scan.models) | set(models)):
            model = models.get(name)
            states = model.states if model is not None else {}
            if not states:
                if not ready_only:
                    index.append({"name": name})
                continue
            for number, (state, reason) in sorted(states.items()):
                if ready_only and state != ModelState.READY:
                    continue
                entry = {"name": name}
                if number >= 0:
                    entry["version"] = str(number)
                entry["state"] = state
                if reason:  # Triton leaves the key out for models that are fine
                    entry["reason"] = reason
                index.append(entry)
        return index

    def statistics(self, name: str | None = None, version: int | None = None) -> dict[str, Any]:
        # Triton's statistics errors (400, "requested model 'x' is not available") come from the stats
        return self.stats.statistics(name, version)

    def queue_depth(self, name: str, version: int = -1) -> int:
        target = self._resolve(name, version)
        return 0 if target.scheduler is None else target.scheduler.queue_depth()

    def tune(self, model: str, **options: Any) -> Any:
        """The tuning panel for ``model`` (a :class:`triton_nb.widgets.Tuner`), to display in a notebook."""
        from triton_nb.notebook.widgets import Tuner

        return Tuner(self, model, **options)

    def client(self) -> Any:
        """An in-process client with tritonclient-like calls."""
        from triton_nb.client import InProcessClient

        return InProcessClient(self)

    def model_config_json(self, name: str, version: int = -1) -> dict[str, Any]:
        return config_to_json(self.model_config(name, version))

    def output_labels(self, name: str, output: str, version: int = -1) -> list[str] | None:
        """The labels of an output's ``label_filename`` (one per line, in the model folder), for
        the classification extension; None when the output has none."""
        target = self._resolve(name, version)
        spec = next((o for o in target.config.output if o.name == output), None)
        if spec is None or not spec.label_filename:
            return None
        path = target.version_path.parent / spec.label_filename
        try:
            return path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InternalError(f"model '{name}': label file {spec.label_filename!r} cannot be read: {exc}") from None


# ---------------------------------------------------------------------- helpers


def _failure_reason(future: Future, error: BaseException | None, timing: dict[str, int]) -> str:
    """Triton's failure reasons: REJECTED (never ran: timeout, queue), CANCELED, BACKEND."""
    if future.cancelled():
        return "CANCELED"
    if error is None:
        return "OTHER"
    return "BACKEND" if "compute_infer" in timing else "REJECTED"


def _decode_base64(key: str, content: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except ValueError:
        raise InvalidArgumentError(f"file override '{key}' is not valid base64") from None


def _suggest(name: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _gpu_available() -> bool:
    from triton_nb._optional import xgboost_cuda_available

    return xgboost_cuda_available()


def _check_request(target: _Version, request: InferRequest, live_max_batch_size: int | None = None,
                   max_string_bytes: int | None = None) -> None:
    """Names, datatypes and shapes against the config, before the request is queued. The
    messages are Triton's own (``InferenceRequest::Normalize``), so a client sees the same text
    from triton_nb and from Triton.

    ``live_max_batch_size`` is the scheduler's current limit, which a live update may have
    lowered below the config's; ``max_string_bytes`` bounds each element of a BYTES input."""
    name = target.name
    batching = target.config.max_batch_size > 0
    limit = live_max_batch_size or target.config.max_batch_size
    given = request.inputs.keys()
    if not target.required <= given or not given <= target.inputs.keys():
        prefix = f"[request id: {request.request_id or '<id_unknown>'}] "
        missing = [n for n in target.inputs if n in target.required and n not in given]
        if missing or len(given) > len(target.inputs):
            low, high = len(target.required), len(target.inputs)
            expected = f"{high}" if low == high else f"between {low} and {high}"
            raise InvalidArgumentError(
                f"{prefix}expected {expected} inputs but got {len(given)} inputs for model '{name}'. Got input(s) "
                f"{_names(given)}, but missing required input(s) {_names(missing)}. Please provide all required "
                f"input(s).")
        extra = next(n for n in given if n not in target.inputs)
        raise InvalidArgumentError(f"unexpected inference input '{extra}' for model '{name}'")
    batch: int | None = None
    for tensor_name, array in request.inputs.items():
        spec = target.inputs[tensor_name]
        if not isinstance(array, np.ndarray):
            raise InvalidArgumentError(f"model '{name}': input '{tensor_name}' must be a numpy array")
        if array.dtype != spec.dtype and not (spec.dtype.kind == "O" and array.dtype.kind == "S"):
            raise InvalidArgumentError(
                f"[request id: {request.request_id or '<id_unknown>'}] inference input '{tensor_name}' data-type is "
                f"'{_datatype_name(array.dtype)}', but model '{name}' expects '{numpy_to_triton_dtype(spec.dtype)}'")
        if max_string_bytes is not None and spec.dtype.kind == "O":
            _check_string_lengths(name, tensor_name, array, max_string_bytes)
        shape = array.shape
        if batching:
            if len(shape) != len(spec.dims) + 1:
                raise InvalidArgumentError(_shape_message(name, tensor_name, request, spec, shape, batching))
            rows = shape[0]
            if rows < 1 or rows > limit:
                raise InvalidArgumentError(
                    f"[request id: {request.request_id or '<id_unknown>'}] inference request batch-size must be "
                    f"<= {limit} for '{name}'")
            if batch is not None and rows != batch:
                raise InvalidArgumentError(f"model '{name}': inputs have different batch sizes ({batch} and {rows})")
            batch = rows
            shape = shape[1:]
        if shape != spec.dims and (not spec.variable or len(shape) != len(spec.dims) or any(
                d != -1 and d != s for d, s in zip(spec.dims, shape, strict=True))):
            raise InvalidArgumentError(_shape_message(name, tensor_name, request, spec, array.shape, batching))
    for output in request.requested_outputs or ():
        if output not in target.outputs:
            raise InvalidArgumentError(f"unexpected inference output '{output}' for model '{name}'")


def _check_string_lengths(model: str, tensor: str, array: np.ndarray, limit: int) -> None:
    if array.size == 1:  # the one-row request, the common case: no iteration (~0.1 us, not ~0.8)
        value = array.item()
        longest = len(value) if isinstance(value, bytes) else len(value.encode()) if isinstance(value, str) else 0
    elif array.dtype.kind == "S":  # fixed width: the itemsize bounds every element
        if array.dtype.itemsize <= limit:
            return
        longest = max((len(v) for v in array.ravel()), default=0)
    else:
        flat = array.ravel()
        try:
            longest = max(map(len, flat), default=0)  # the common case: all bytes, one C loop
        except TypeError:  # elements that are not strings are the backend's to refuse, not ours
            longest = max((len(v) for v in flat if isinstance(v, bytes | str)), default=0)
        if longest * 4 > limit:  # a str counts characters; UTF-8 may need up to 4 bytes each
            longest = max((len(v.encode() if isinstance(v, str) else v) for v in flat
                           if isinstance(v, bytes | str)), default=0)
    if longest > limit:
        raise InvalidArgumentError(
            f"input '{tensor}' for model '{model}' has a {longest}-byte element, over the {limit}-byte limit "
            f"(max_string_bytes)")


def _names(names: Any) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _shape_message(model: str, tensor: str, request: InferRequest, spec: _TensorSpec, shape: tuple[int, ...],
                   batching: bool) -> str:
    expected = ",".join(str(d) for d in ((-1,) if batching else ()) + spec.dims)
    message = (f"[request id: {request.request_id or '<id_unknown>'}] unexpected shape for input '{tensor}' for "
               f"model '{model}'. Expected [{expected}], got [{','.join(str(d) for d in shape)}]. ")
    if batching:
        message += ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
                    "prepended to each input shape. If you want to specify the full shape including the batch dim "
                    "in your input dims config, try setting max_batch_size to zero. See the model configuration "
                    "docs for more info on max_batch_size.")
    return message


def _datatype_name(dtype: np.dtype) -> str:
    try:
        return numpy_to_triton_dtype(dtype)
    except InvalidArgumentError:  # a numpy type no Triton datatype matches (in-process callers)
        return f"<invalid: numpy {dtype}>"


def _filter_outputs(version: _Version, request: InferRequest, response: InferResponse) -> InferResponse:
    if response.error is not None:
        return response
    response.model_name = version.name
    response.model_version = version.version
    response.request_id = request.request_id
    if request.requested_outputs:
        missing = [o for o in request.requested_outputs if o not in response.outputs]
        if missing:
            response.error = InternalError(f"model '{version.name}' did not produce output(s) {', '.join(missing)}")
            return response
        response.outputs = {o: response.outputs[o] for o in request.requested_outputs}
    return response


def serve(model_repository: str | os.PathLike[str], **options: Any) -> InferenceServer:
    """Start an in-process server on a model repository and return it, running.

    Options are :class:`InferenceServer`'s. The server runs on its own threads; the calling
    thread (a notebook cell) returns at once. Use it as a context manager, or call ``stop()``.
    """
    return InferenceServer(model_repository, **options).start()
