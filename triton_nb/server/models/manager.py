"""The model manager: which model versions are loaded, in what state, and which one a request gets.

:class:`ModelManager` keeps one record per model name (:class:`ManagedModel`) holding its serving
versions (:class:`ManagedVersion`: config, statistics, scheduler or ensemble), each version's state —
LOADING, READY, UNAVAILABLE (with a reason), UNLOADING (:class:`ModelState`) — and the
fingerprints poll mode compares. It loads, reloads, unloads and polls the repository; writes a
load's file overrides into a private copy of the model folder; and resolves a name and version
to the version that serves it (:meth:`ModelManager.resolve`, with Triton's "Request for unknown
model" errors and a did-you-mean suggestion).

Contract:

* a reload is loaded beside the serving versions and swapped in whole, under the model's lock,
  when every version is ready; the old versions answer what they already queued and are then
  finalized in the background; a failed reload leaves the old versions serving and READY;
* a model that fails to load reports why (its state and reason) without affecting the others;
* the manager applies no model-control policy (which mode allows which call is the facade's,
  :class:`triton_nb.server.core.Server`); once :meth:`ModelManager.begin_stop` was called it
  refuses loads, and :meth:`ModelManager.stop` retires every version.
"""

from __future__ import annotations

import base64
import difflib
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from triton_nb.backends.base import ServerHandle
from triton_nb.backends.registry import BACKEND_MODEL_FILENAME, python_auto_complete, resolve_backend
from triton_nb.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, TritonNBError, UnavailableError
from triton_nb.repository.config import (
    ModelConfig,
    check_model_config,
    config_from_json,
    effective_config,
    is_ensemble,
)
from triton_nb.repository.layout import (
    ModelEntry,
    RepositoryScan,
    is_model_folder,
    read_model_config,
    scan_repository,
    select_versions,
)
from triton_nb.server.models.checks import TensorSpec
from triton_nb.server.models.instances import InstanceOptions, add_instance, run_batch
from triton_nb.server.observability.stats import ModelStats, ServerStats
from triton_nb.server.scheduling.batcher import Scheduler, SchedulerSettings
from triton_nb.server.scheduling.ensemble import EnsembleScheduler, Submit
from triton_nb.server.scheduling.rate_limiter import RateLimiter
from triton_nb.server.scheduling.sequence import SequenceScheduler

__all__ = ["ModelManager", "ModelState"]

log = logging.getLogger(__name__)


class ModelState:
    """The states of a model version, with Triton's names."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass
class ManagedVersion:
    """One loaded, serving model version."""

    name: str
    version: int
    config: ModelConfig
    version_path: Path
    stats: ModelStats
    scheduler: Scheduler | None = None  # None for ensembles
    ensemble: EnsembleScheduler | None = None
    next_instance: int = 0
    rate_limiter: RateLimiter | None = None  # the server's, when it rate-limits (--rate-limit execution_count)
    # The config's tensors, read once: checking every request against the protobuf is slow.
    inputs: dict[str, TensorSpec] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    outputs: frozenset[str] = frozenset()
    conforming: dict = field(default_factory=dict)  # the request checks' table (checks._conforms)

    def __post_init__(self) -> None:
        self.inputs = {t.name: TensorSpec.of(t) for t in self.config.input}
        self.required = frozenset(t.name for t in self.config.input if not t.optional)
        self.outputs = frozenset(t.name for t in self.config.output)

    @property
    def batching(self) -> bool:
        return self.config.max_batch_size > 0


@dataclass
class ManagedModel:
    """Everything the server knows about one model name."""

    name: str
    versions: dict[int, ManagedVersion] = field(default_factory=dict)  # the serving set, swapped whole
    states: dict[int, tuple[str, str]] = field(default_factory=dict)  # version -> (state, reason)
    fingerprints: dict[int, str] = field(default_factory=dict)
    override_dir: Path | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)


class ModelManager:
    """The loaded models of one repository.

    Parameters
    ----------
    repository:
        The repository folder (Triton's layout).
    stats:
        Where each version's statistics live (a version's are removed when it unloads).
    server:
        What model instances may call back (BLS), handed to each backend in its context.
    infer_step:
        How an ensemble submits the request of one of its steps.
    exit_timeout_secs:
        Once stopping, how long retiring a version waits for a batch that is executing.
    rate_limiter:
        The server's rate limiter, shared by every model's instances (None: no rate limiting).
    """

    def __init__(self, repository: Path, stats: ServerStats, *, server: ServerHandle, infer_step: Submit,
                 exit_timeout_secs: float, rate_limiter: RateLimiter | None = None,
                 instance_options: InstanceOptions | None = None, auto_complete_config: bool = True) -> None:
        self.repository = repository
        self.auto_complete_config = auto_complete_config  # off: tritonserver's --disable-auto-complete-config
        self.instance_options = instance_options or InstanceOptions()
        self.backend_directory = self.instance_options.backend_directory
        self.rate_limiter = rate_limiter
        self.stats = stats
        self._server = server
        self._infer_step = infer_step
        self._exit_timeout_secs = exit_timeout_secs
        self.models: dict[str, ManagedModel] = {}  # changed under models_lock; resolve reads it bare
        self.models_lock = threading.RLock()
        self._stopping = False
        self._stop_event = threading.Event()
        self._poller: threading.Thread | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="triton-nb-server-"))
        self._retiring: list[threading.Thread] = []
        # The config warnings of each model's last load (fields Triton ignores here), for status views.
        self.config_warnings: dict[str, list[str]] = {}
        # Repositories registered beside the server's own (Triton's RegisterModelRepository): the model
        # folder of each name they serve, and the names each brought
        self._registered_folders: dict[str, Path] = {}
        self._registered: dict[Path, list[str]] = {}

    def __del__(self) -> None:  # a forgotten server must not leak its temp folder
        if getattr(self, "_workdir", None) is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    # ------------------------------------------------------------------ stopping
    def begin_stop(self) -> None:
        """Refuse loads from now on, end polling, and bound how long retirements wait."""
        self._stopping = True
        self._stop_event.set()

    def stop(self) -> None:
        """Retire every version without draining (queued requests fail), finalize every
        instance, join every thread, and remove the override files."""
        self.begin_stop()
        if self._poller is not None:
            self._poller.join()
        with self.models_lock:
            models = list(self.models.values())
        for model in models:
            with model.lock:
                for version in model.versions.values():
                    self._retire_version(version, drain=False, wait=True)
                model.versions = {}
                model.states = {v: (ModelState.UNAVAILABLE, "server stopped") for v in model.states}
        for thread in self._retiring:
            thread.join()
        shutil.rmtree(self._workdir, ignore_errors=True)

    # ------------------------------------------------------------------ queries
    def _accepts_carried(self, name: str, version: int, rows: int) -> bool:
        """Whether ``name`` takes one request carrying ``rows`` rows of several ensemble requests
        with nothing a user sees changed: it batches dynamically (so those requests would be
        batched anyway), the rows fit ``max_batch_size``, no queue is bounded (``max_queue_size``
        counts requests, a carried one is several) and every instance's backend
        ``accepts_carried``."""
        try:
            target = self.resolve(name, version)
        except TritonNBError:
            return False
        scheduler = target.scheduler
        if scheduler is None:
            return False
        settings = scheduler.settings
        if not settings.dynamic_batching or not 0 < rows <= settings.max_batch_size:
            return False
        policies = [settings.default_queue_policy, *(policy for _, policy in settings.priority_queue_policy)]
        if any(policy.max_queue_size for policy in policies):
            return False
        backends = scheduler.instances()
        return bool(backends) and all(getattr(backend, "accepts_carried", False) for backend in backends)

    def resolve(self, name: str, version: int = -1) -> ManagedVersion:
        """The version serving ``name`` at ``version`` (-1 or 0: the highest), else NotFoundError
        in Triton's words."""
        # no lock: a dict read is atomic, and a lock taken by every request is one more place for
        # the threads that send them to queue (triton_nb._locks)
        model = self.models.get(name)
        if model is None or (not model.versions and not model.states):
            raise NotFoundError(f"Request for unknown model: '{name}' is not found"
                                + _suggest(name, list(self.models)))
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

    def serving_versions(self, name: str) -> list[int]:
        """The version numbers now serving ``name``, ascending."""
        with self.models_lock:
            model = self.models.get(name)
            return sorted(model.versions) if model is not None else []

    def all_ready(self) -> bool:
        """Every version of every model that was asked for is READY, or was unloaded on purpose (an
        unload leaves a strictly ready Triton ready: checked against tritonserver 2.51)."""
        with self.models_lock:
            return all(
                state == ModelState.READY or reason == "unloaded"
                for model in self.models.values() for state, reason in model.states.values()
            )

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository with its versions' states, as Triton's index API."""
        scan = scan_repository(self.repository, auto_complete_config=self.auto_complete_config)
        with self.models_lock:
            models = dict(self.models)
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

    # ------------------------------------------------------------------ registered repositories
    def register_repository(self, repository: Path, mapping: dict[str, str] | None = None) -> list[str]:
        """Serve the models of another repository beside the server's own, as Triton's
        ``RegisterModelRepository``: each model folder under its folder's name, or under the name
        ``mapping`` gives that folder. Nothing is loaded. Returns the names it brings.

        Triton without model namespacing: a name that another repository already serves is
        refused (409), as a repository registered twice is.
        """
        path = Path(repository).absolute()
        if not path.is_dir():
            raise InvalidArgumentError(f"failed to register '{repository}', repository not found")
        mapping = dict(mapping or {})
        with self.models_lock:
            if path in self._registered:
                raise AlreadyExistsError(f"model repository '{repository}' has already been registered")
            folders = {mapping.get(folder.name, folder.name): folder for folder in sorted(path.iterdir())
                       if is_model_folder(folder, auto_complete_config=self.auto_complete_config)}
            for name in folders:
                if name in self._registered_folders or (self.repository / name).is_dir():
                    raise AlreadyExistsError(f"failed to register '{name}', there is a conflicting mapping for "
                                             f"'{name}'")
            self._registered[path] = list(folders)
            self._registered_folders.update(folders)
        return list(folders)

    def unregister_repository(self, repository: Path) -> None:
        """Stop serving a registered repository's models (the caller unloads them first)."""
        path = Path(repository).absolute()
        with self.models_lock:
            names = self._registered.pop(path, None)
            if names is None:
                raise NotFoundError(f"failed to unregister '{repository}', repository not found")
            for name in names:
                self._registered_folders.pop(name, None)

    def model_folder(self, name: str) -> Path:
        """The folder model ``name`` is read from: a registered repository's, else the server's own."""
        return self._registered_folders.get(name) or self.repository / name

    # ------------------------------------------------------------------ load / unload
    def load(self, name: str, config: str | dict[str, Any] | ModelConfig | None = None,
             files: dict[str, bytes | str] | None = None) -> None:
        """Load (or reload) a model: the new version set is loaded beside the serving one and
        swapped in when ready (see :meth:`triton_nb.server.core.Server.load_model`)."""
        if self._stopping:
            raise UnavailableError("the server is stopped")
        source = self.model_folder(name)
        if not files and (not source.is_dir() or (
                config is None and not is_model_folder(source, auto_complete_config=self.auto_complete_config))):
            if source.is_dir() and not self.auto_complete_config:
                read_model_config(source, auto_complete_config=False)  # raises Triton's refusal of such a folder
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
            for version in loaded:  # a reloaded version's statistics start from zero, as in Triton
                self.stats.install(version.stats)
            for number in old.keys() - model.versions.keys():  # versions the reload dropped
                self.stats.remove(name, number)
        for version in old.values():
            self._retire_version(version, drain=True, wait=False)

    def unload(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload every version of a model; queued requests are still answered. Unloading a model
        that is not loaded does nothing, as in Triton."""
        with self.models_lock:
            model = self.models.get(name)
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
                self.unload(other)

    def _ensembles_using(self, name: str) -> list[str]:
        with self.models_lock:
            models = list(self.models.values())
        return sorted({
            model.name for model in models for version in model.versions.values()
            if version.ensemble is not None and any(s.model_name == name for s in version.ensemble.steps)
        })

    def _model_record(self, name: str) -> ManagedModel:
        with self.models_lock:
            return self.models.setdefault(name, ManagedModel(name))

    def _write_overrides(self, model: ManagedModel, files: dict[str, bytes | str]) -> Path:
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
            config = read_model_config(source, auto_complete_config=self.auto_complete_config)
            if source.name != name and config.name in ("", source.name):
                config.name = name  # a folder a registered repository maps to another name serves under it
        elif isinstance(override, ModelConfig):
            config = override
        else:
            config = config_from_json(override, source=f"model '{name}' config override")
        found = None  # the backend, when auto-complete needed it first
        if self.auto_complete_config and config.backend and not (config.input and config.output):
            # A Python model's auto_complete_config, and, as in Triton, a Python-based backend's
            # (its model.py in the backend directory runs for the model)
            if config.backend != "python":
                found = resolve_backend(config.backend, model=name, backend_directory=self.backend_directory)
            code_dir = found.folder if found is not None else None
            versions = sorted(int(p.name) for p in source.iterdir() if p.is_dir() and p.name.isdigit())
            if versions and (config.backend == "python" or code_dir is not None):
                # run where the instances will run: a model's own process has its own imports
                config = python_auto_complete(config, source / str(versions[-1]), source, code_dir=code_dir,
                                              python_instances=self.instance_options.python_instances)
        effective = effective_config(config, name, gpu_available=_gpu_available())
        checked = check_model_config(effective, name)
        problems = [p for p in checked if p.severity == "error"]
        if problems:
            raise InvalidArgumentError("; ".join(str(p) for p in problems))
        if not is_ensemble(effective):
            # found now, or the load fails naming what was searched; found, the config check's
            # "not built in" warning (all validate can say without a server) has nothing to add
            if found is None or effective.backend != config.backend:
                found = resolve_backend(effective.backend, model=name, backend_directory=self.backend_directory)
            if found.source != "built-in":
                checked = [p for p in checked if p.field != "backend"]
            if found.folder is not None and not effective.runtime:
                effective.runtime = BACKEND_MODEL_FILENAME  # what Triton reports for a Python-based backend
        warnings = [f"{p.field}: {p.message}" for p in checked if p.severity == "warning"]
        if warnings != self.config_warnings.get(name, []):  # once per load that changes them, not per poll
            for warning in warnings:
                log.warning("model '%s': %s", name, warning)
        self.config_warnings[name] = warnings
        return effective

    def _load_versions(self, name: str, source: Path, override: Any) -> list[ManagedVersion]:
        config = self._read_config(name, source, override)
        available = sorted(int(p.name) for p in source.iterdir() if p.is_dir() and p.name.isdigit())
        versions = select_versions(config, available)
        if not versions:
            raise NotFoundError(f"model '{name}': no version folder matches the version policy (found {available})")
        if is_ensemble(config):
            self._prepare_ensemble(name, config)
        loaded: list[ManagedVersion] = []
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
        from triton_nb.repository.validate import check_ensemble

        entries = {}
        for step in config.ensemble_scheduling.step:
            composing = step.model_name
            if composing == name:
                raise InvalidArgumentError(f"ensemble '{name}' lists itself as a step")
            if not self.serving(composing):
                try:
                    self.load(composing)
                except TritonNBError as exc:
                    raise UnavailableError(
                        f"ensemble '{name}': composing model '{composing}' failed to load: {exc}") from None
            version = self.resolve(composing, -1)
            entries[composing] = ModelEntry(composing, self.model_folder(composing), version.config,
                                            versions=[version.version])
        entries[name] = ModelEntry(name, self.model_folder(name), config, versions=[1])
        problems = [p for p in check_ensemble(entries[name], RepositoryScan(self.repository, entries))
                    if p.severity == "error"]
        if problems:
            raise InvalidArgumentError("; ".join(str(p) for p in problems))

    def serving(self, name: str) -> bool:
        """Whether some version of ``name`` serves now."""
        with self.models_lock:
            model = self.models.get(name)
        return model is not None and bool(model.versions)

    def _load_version(self, name: str, number: int, config: ModelConfig, source: Path) -> ManagedVersion:
        serving = number in self._model_record(name).versions
        # a reload counts apart until it is swapped in: its warm-up must not add to the serving counts
        stats = self.stats.fresh(name, number) if serving else self.stats.model(name, number)
        version = ManagedVersion(name, number, config, source / str(number), stats, rate_limiter=self.rate_limiter)
        if is_ensemble(config):
            version.ensemble = EnsembleScheduler(name, number, config, self._infer_step, stats=stats,
                                                 carry=self._accepts_carried, input_specs=version.inputs)
            return version
        def run(backend: object, requests: list) -> list:
            return run_batch(version, backend, requests)

        if config.HasField("sequence_batching"):
            version.scheduler = SequenceScheduler(name, number, config, run, model_path=source, stats=stats)
        else:
            version.scheduler = Scheduler(name, number, SchedulerSettings.from_config(config), run, stats=stats)
        try:
            for group in config.instance_group:
                for _ in range(group.count):
                    add_instance(version, group, source, repository=self.model_folder(name).parent, server=self._server,
                                 options=self.instance_options)
        except BaseException:
            self._retire_version(version, drain=False, wait=True)
            raise
        return version

    def _retire_version(self, version: ManagedVersion, *, drain: bool, wait: bool) -> None:
        """Stop a version's scheduler and finalize its instances (in the background unless wait)."""
        def retire() -> None:
            if version.scheduler is None:
                return
            # a stopping server waits at most exit_timeout_secs for a batch that is executing
            timeout = self._exit_timeout_secs if self._stopping else None
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

    def _fingerprints(self, source: Path, loaded: list[ManagedVersion]) -> dict[int, str]:
        entry = ModelEntry(source.name, source, None)
        return {v.version: entry.fingerprint(v.version) for v in loaded}

    # ------------------------------------------------------------------ polling
    def start_polling(self, interval_secs: float) -> None:
        """Poll the repository every ``interval_secs`` on a thread of its own, until stopped."""
        self._poller = threading.Thread(target=self._poll, args=(interval_secs,), name="triton-nb-poller",
                                        daemon=True)
        self._poller.start()

    def _poll(self, interval_secs: float) -> None:
        while not self._stop_event.wait(interval_secs):
            try:
                self.poll_once()
            except Exception:
                log.exception("repository poll failed")

    def poll_once(self) -> list[str]:
        """Scan the repository and load new, reload changed and unload removed models; returns
        the names acted on."""
        scan = scan_repository(self.repository, auto_complete_config=self.auto_complete_config)
        changed = []
        with self.models_lock:
            known = dict(self.models)
        for name, entry in scan.models.items():
            model = known.get(name)
            selected = entry.selected_versions
            wanted = {v: entry.fingerprint(v) for v in selected}
            if model is None or model.fingerprints != wanted or model.override_dir is not None:
                if model is not None and model.override_dir is not None:
                    continue  # an override wins until the model is loaded from the repository again
                changed.append(name)
                try:
                    self.load(name)
                except TritonNBError as exc:
                    log.warning("model '%s' failed to load: %s", name, exc)
        for name, model in known.items():
            if name not in scan.models and name not in self._registered_folders and model.versions:
                changed.append(name)
                self.unload(name)
        return changed


# ---------------------------------------------------------------------- helpers


def _decode_base64(key: str, content: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except ValueError:
        raise InvalidArgumentError(f"file override '{key}' is not valid base64") from None


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _gpu_available() -> bool:
    from triton_nb._optional import xgboost_cuda_available

    return xgboost_cuda_available()
