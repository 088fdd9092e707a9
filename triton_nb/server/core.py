"""The in-kernel inference server: the facade over lifecycle, model control and request routing.

:class:`Server` serves a Triton model repository from inside the running process. It owns its
threads — one worker per model instance, plus a poller in ``poll`` mode, plus the network front
ends when asked — and never touches the caller's thread or event loop, so a Jupyter kernel stays
responsive (ipykernel 7 stops driving background asyncio tasks between cells, hence no asyncio
here at all). It satisfies :class:`triton_nb.server.service.InferenceService`, the interface the
front ends, the in-process client and perf call; the conveniences built on it (``client()``,
``tune()``) live above, in :class:`triton_nb.serving.InferenceServer`.

Model control modes are Triton's: ``none`` (load everything at start; no load/unload calls),
``explicit`` (load what is asked: ``load_models`` at start, then :meth:`Server.load_model`),
``poll`` (load everything, then watch the repository and reload what changed). The facade
applies the mode; the model manager (:mod:`triton_nb.server.models.manager`) does the loading,
versioning and resolving, and a model that fails to load reports why without affecting the
others. A request is checked (:mod:`triton_nb.server.models.checks`), queued on its version's scheduler
or ensemble, and executed by an instance (:mod:`triton_nb.server.models.instances`). Batching knobs and
instance counts change live (:meth:`Server.update_batching`), from the next batch on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from tritonclient.grpc import model_config_pb2 as mc

from triton_nb._deprecation import version_or_latest
from triton_nb.backends.backend_config import parse_backend_config
from triton_nb.errors import (
    ForbiddenError,
    InternalError,
    InvalidArgumentError,
    ModelLoadFailedError,
    NotFoundError,
    TritonNBError,
    UnavailableError,
)
from triton_nb.repository.config import ModelConfig, config_to_json
from triton_nb.repository.layout import scan_repository
from triton_nb.server.cache import CacheCollector, CacheSwitches, ResponseCache, ServerCache
from triton_nb.server.collector import freeze_while_serving, unfreeze_after_serving
from triton_nb.server.frontends.network import FrontendOptions, NetworkFrontends
from triton_nb.server.frontends.shared_memory import SharedMemoryRegistry
from triton_nb.server.models.checks import CheckedVersion, check_carried_request, check_request
from triton_nb.server.models.instances import InstanceOptions, set_instance_count
from triton_nb.server.models.manager import ManagedModel, ManagedVersion, ModelManager
from triton_nb.server.observability.logs import LogSettings
from triton_nb.server.observability.stats import ModelStats, ServerStats
from triton_nb.server.scheduling.futures import ResponseFuture
from triton_nb.server.scheduling.rate_limiter import RateLimiter
from triton_nb.server.scheduling.together import Together
from triton_nb.server.settings import ServerSettings, parameters_doc
from triton_nb.tensors import InferRequest, InferResponse

__all__ = ["Server"]

log = logging.getLogger(__name__)


_S = TypeVar("_S", bound="Server")  # start() and __enter__ return the subclass they are called on


class Server:
    __doc__ = """A Triton-compatible server running inside this process (the engine; the public class,
    with ``client()`` and ``tune()``, is :class:`triton_nb.InferenceServer`).

    Parameters
    ----------
    model_repository : str or os.PathLike
        The repository folder (Triton's layout).
    settings : ServerSettings, optional
        The options, validated (:class:`triton_nb.ServerSettings`; the defaults when omitted).
        :attr:`settings` holds what the server runs with.
    **options
        The fields of :class:`~triton_nb.ServerSettings`, one by one as keywords (they override
        ``settings``; an unknown name is a TypeError naming it), listed under Other Parameters.

    Other Parameters
    ----------------
""" + parameters_doc() + "\n"

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        settings: ServerSettings | None = None,
        **options: Any,
    ) -> None:
        self.settings = ServerSettings.from_options(settings, **options)
        settings = self.settings
        self._froze_gc = False
        self._pending = 0
        self._pending_lock = threading.Lock()
        self.repository = Path(model_repository)
        if not self.repository.is_dir():
            raise NotFoundError(f"model repository {self.repository} does not exist or is not a folder")
        self.stats = ServerStats(settings.metrics_config, cpu_metrics=settings.cpu_metrics, custom_metrics=True)
        self._started = False
        self._stopped = False
        self._frontend_options = FrontendOptions(
            http_port=settings.http_port, grpc_port=settings.grpc_port, metrics_port=settings.metrics_port,
            http_address=settings.http_address, grpc_address=settings.grpc_address,
            metrics_address=settings.metrics_address, max_request_bytes=settings.max_request_bytes,
            max_tensor_elements=settings.max_tensor_elements, grpc_max_message_bytes=settings.grpc_max_message_bytes,
            exit_timeout_secs=settings.exit_timeout_secs, http_read_timeout_secs=settings.http_read_timeout_secs,
            http_timeout_keep_alive_secs=settings.http_timeout_keep_alive_secs,
            http_restricted_api=settings.http_restricted_api, grpc_restricted_api=settings.grpc_restricted_api,
            server_id=settings.server_id,
            # SageMaker's front end reads its model and ping mode from the environment, as Triton's does
            sagemaker_port=settings.sagemaker_port if settings.allow_sagemaker else None,
            sagemaker_address=settings.http_address,
            sagemaker_default_model=os.environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME",
                                                   "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"),
            sagemaker_ping_mode=os.environ.get("SAGEMAKER_TRITON_PING_MODE", "ready"),
            sagemaker_model_data=str(self.repository.absolute()))
        #: Triton's logging settings (``--log-*``), which the logging extension changes live
        self.log_settings = LogSettings.from_settings(settings)
        self._frontends: NetworkFrontends | None = None
        # Triton's system shared-memory regions, shared by the HTTP and gRPC front ends (and
        # usable in-process: server.shared_memory.register(name, key, byte_size, offset))
        self.shared_memory = SharedMemoryRegistry()
        # Triton's --rate-limit: with "off" (its default) every rate_limiter block is ignored, as there
        limiter = RateLimiter(settings.rate_limit_resources) if settings.rate_limit == "execution_count" else None
        self._backend_config = parse_backend_config(settings.backend_config)
        self._instance_options = InstanceOptions(settings.backend_directory, settings.python_instances,
                                                 self._backend_config.python)
        self._manager = ModelManager(self.repository, self.stats, server=self, infer_step=self._infer_step,
                                     exit_timeout_secs=settings.exit_timeout_secs, rate_limiter=limiter,
                                     instance_options=self._instance_options,
                                     auto_complete_config=not settings.disable_auto_complete_config)
        # bound once: resolving is on every request's path, and a delegating method costs a frame
        self._resolve: Callable[[str, int], ManagedVersion] = self._manager.resolve
        # the first-response histogram's buckets come from the serving version's model_metrics
        self.stats.model_metrics = lambda name, version: self._resolve(name, version).config.model_metrics
        self._cache_switches = CacheSwitches(self._resolve)
        self.stats.cache_series = self._cache_switches.series
        # None without a cache: the one attribute a request's path reads for it
        self._cache: ServerCache | None = None
        if settings.cache_size_bytes:
            self._cache = ServerCache(settings.cache_size_bytes, self._cache_switches, self._infer_step)
            self.stats.registry.register(CacheCollector(self._cache.store))

    @property
    def model_control_mode(self) -> str:
        """``"none"``, ``"explicit"`` or ``"poll"`` (what backends check before pb_utils' model loading)."""
        return self.settings.model_control_mode

    # ------------------------------------------------------------------ lifecycle
    def start(self: _S) -> _S:
        """Load the models the control mode says to load; return at once when done."""
        if self._started:
            return self
        self._started = True
        self.log_settings.open()
        for spec, why in self._backend_config.inert:
            log.warning("--backend-config=%s has no effect here: %s", spec, why)
        failed = self._load_initial_models()
        if failed and self.settings.exit_on_error:
            # tritonserver's words, the models named; the states as they are before stopping marks them all stopped
            error = ModelLoadFailedError("failed to load all models: " + "; ".join(
                f"'{name}': {reason}" for name, reason in failed.items()), self.repository_index())
            self.stop()
            raise error
        if self.model_control_mode == "poll":
            self._manager.start_polling(self.settings.repository_poll_secs)
        if self._frontend_options.enabled:
            self._frontends = NetworkFrontends(self, self._frontend_options, self.log_settings)
            try:
                self._frontends.start()
            except BaseException:
                self._frontends = None
                self.stop()
                raise
        if self.settings.freeze_gc:
            freeze_while_serving()
            self._froze_gc = True
        return self

    def _load_initial_models(self) -> dict[str, str]:
        """Load what the control mode loads at start: with ``model_load_thread_count`` above 1,
        that many at once, the ensembles after (their composing models are loaded by then); each
        failure is tried ``model_load_retry_count`` more times. Returns the failures' reasons."""
        names = self._initial_models()
        failed: dict[str, str] = {}

        def load(name: str) -> None:
            for attempt in range(self.settings.model_load_retry_count + 1):
                if self._manager.serving(name):  # loaded already, as a composing model of an ensemble before it
                    return
                try:
                    self._manager.load(name)
                except TritonNBError as exc:  # one bad model never stops the others
                    failed[name] = str(exc)
                    log.warning("model '%s' failed to load%s: %s", name,
                                f" (attempt {attempt + 1})" if self.settings.model_load_retry_count else "", exc)
                else:
                    failed.pop(name, None)
                    return

        threads = self.settings.model_load_thread_count
        if threads == 1 or len(names) < 2:
            for name in names:
                load(name)
            return failed
        from concurrent.futures import ThreadPoolExecutor

        scan = scan_repository(self.repository, auto_complete_config=not self.settings.disable_auto_complete_config)
        ensembles = [name for name in names if name in scan.models and scan.models[name].config is not None
                     and scan.models[name].config.platform == "ensemble"]
        with ThreadPoolExecutor(threads, thread_name_prefix="triton-nb-load") as pool:
            list(pool.map(load, [name for name in names if name not in ensembles]))
        for name in ensembles:  # an ensemble's load checks it against its composing models' configs
            load(name)
        return failed

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
        addresses = {"http": options.http_address, "grpc": options.grpc_address, "metrics": options.metrics_address,
                     "sagemaker": options.sagemaker_address}
        ports = {} if self._frontends is None else self._frontends.ports
        return {name: f"{addresses[name]}:{port}" for name, port in ports.items()}

    def _initial_models(self) -> list[str]:
        scan = scan_repository(self.repository,
                               auto_complete_config=not self.settings.disable_auto_complete_config)
        wanted = self.settings.load_models
        if self.model_control_mode == "explicit" and "*" not in wanted:
            unknown = [name for name in wanted if name not in scan.models]
            if unknown:
                raise NotFoundError(f"load_models: no model(s) {', '.join(unknown)} in {self.repository}")
            return list(wanted)
        return list(scan.models)

    def stop(self) -> None:
        """Fail queued requests, let running batches finish, finalize every instance, join
        every thread. Safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        self._manager.begin_stop()
        frontends = self._frontends
        if frontends is not None:
            # requests in flight over the network are answered while the models still serve
            frontends.begin_stop()
            frontends.wait(self._frontend_options.exit_timeout_secs)
        self._manager.stop()
        if frontends is not None and not frontends.wait(10.0):  # what was in flight has been answered
            log.warning("the network front ends did not stop in time; ending them")
            frontends.kill()
        self.shared_memory.close()  # unmap what clients left registered, as Triton does at exit
        self.stats.close()  # custom metrics the models still hold leave the process registry
        if self._froze_gc:
            self._froze_gc = False
            unfreeze_after_serving()
        self.log_settings.close()

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ health
    def is_server_live(self) -> bool:
        return self._started and not self._stopped

    def is_server_ready(self) -> bool:
        """Ready when live and, with ``strict_readiness`` (the default), every model that was asked
        for is ready, each loaded version's instances included (Triton 2.67: a Python model's
        ``is_ready()``); without it, whenever live (tritonserver's ``--strict-readiness``)."""
        if not self.is_server_live():
            return False
        if not self.settings.strict_readiness:
            return True
        if not self._manager.all_ready():
            return False
        with self._manager.models_lock:
            loaded = [version for model in self._manager.models.values() for version in model.versions.values()]
        return all(self._instances_ready(version) for version in loaded)

    def is_model_ready(self, name: str, version: int | None = None) -> bool:
        """Whether ``name`` (at ``version``) serves: loaded, and every instance ready, which asks
        a Python model's ``is_ready()`` where it defines one (Triton 2.67)."""
        try:
            target = self._target(name, version)
        except TritonNBError:
            return False
        return self._instances_ready(target)

    @staticmethod
    def _instances_ready(target: Any) -> bool:
        """Triton's ``TritonModel::IsReady``: every instance's check passes (an ensemble's always do)."""
        if target.ensemble is not None:
            return True
        try:
            for instance in target.scheduler.instances():
                check = getattr(instance, "check_ready", None)
                if check is not None:
                    check()
        except TritonNBError as exc:
            log.info("model '%s' version %s is not ready: %s", target.name, target.version, exc)
            return False
        return True

    # ------------------------------------------------------------------ model control
    def check_network_model_control(self, model: str, action: str) -> None:
        """What the front ends ask before a network client's load or unload (see
        ``network_model_control``). Modes none and poll keep Triton's own refusal."""
        if self.model_control_mode == "explicit" and not self.settings.network_model_control:
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
        self._require_explicit("load")
        self._manager.load(name, config, files)

    def register_model_repository(self, repository: str | os.PathLike[str],
                                  mapping: dict[str, str] | None = None) -> list[str]:
        """Serve another repository's models beside this server's, as Triton's
        ``TRITONSERVER_ServerRegisterModelRepository`` (what SageMaker's multi-model endpoints use):
        each model folder under its name, or the name ``mapping`` gives the folder. Nothing loads
        until :meth:`load_model`. A name another repository serves is refused
        (:class:`~triton_nb.errors.AlreadyExistsError`), as is a repository registered twice.
        Returns the model names it brings."""
        return self._manager.register_repository(Path(repository), mapping)

    def unregister_model_repository(self, repository: str | os.PathLike[str]) -> None:
        """Stop serving a registered repository's models; unload them first."""
        self._manager.unregister_repository(Path(repository))

    def unload_model(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload every version of a model; queued requests are still answered. Unloading a model
        that is not loaded does nothing, as in Triton."""
        self._require_explicit("unload")
        self._manager.unload(name, unload_dependents=unload_dependents)

    def poll_once(self) -> list[str]:
        """Scan the repository and load new, reload changed and unload removed models (what
        poll mode does every ``repository_poll_secs``); returns the names acted on."""
        return self._manager.poll_once()

    @property
    def _models(self) -> dict[str, ManagedModel]:
        """The model manager's records by name, for diagnostics that look inside (read only)."""
        return self._manager.models

    # ------------------------------------------------------------------ live knobs
    def update_batching(self, name: str, version: int | None = None, **knobs: Any) -> dict[str, Any]:
        """Change batching knobs of a serving model without a reload, from the next batch on.

        Knobs: ``max_queue_delay_microseconds``, ``preferred_batch_size``, ``max_batch_size``
        (up to the model's configured limit), ``instance_count``, ``preserve_ordering``, and
        ``dynamic_batching`` (False: Triton's default scheduler, one request per execution; True:
        the dynamic batcher, also implied by any batching knob). Returns the knobs now in force.
        """
        allowed = {"max_queue_delay_microseconds", "preferred_batch_size", "max_batch_size", "instance_count",
                   "preserve_ordering", "dynamic_batching"}
        unknown = sorted(set(knobs) - allowed)
        if unknown:
            raise InvalidArgumentError(f"unknown batching knob(s): {', '.join(unknown)}")
        target = self._target(name, version)
        if target.scheduler is None:
            raise InvalidArgumentError(f"model '{name}' is an ensemble: tune its composing models instead")
        limit = target.config.max_batch_size
        settings = {k: v for k, v in knobs.items() if k != "instance_count" and v is not None}
        if "dynamic_batching" in settings:
            settings["dynamic_batching"] = bool(settings["dynamic_batching"])
            if settings["dynamic_batching"] and not target.batching:
                raise InvalidArgumentError(f"model '{name}' does not batch (max_batch_size 0): dynamic batching "
                                           "cannot be turned on")
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
        if settings and "dynamic_batching" not in settings and target.batching:
            settings["dynamic_batching"] = True
        updated = target.scheduler.update(**settings)
        count = knobs.get("instance_count")
        if count is not None:
            set_instance_count(target, int(count), repository=self.repository, server=self,
                               options=self._instance_options)
        return {
            "max_batch_size": updated.max_batch_size,
            "max_queue_delay_microseconds": updated.max_queue_delay_microseconds,
            "preferred_batch_size": list(updated.preferred_batch_size),
            "preserve_ordering": updated.preserve_ordering,
            "dynamic_batching": updated.dynamic_batching,
            "instance_count": target.scheduler.instance_count,
        }

    @property
    def cache_size_bytes(self) -> int | None:
        """The response cache's size in bytes; None when the server has no cache."""
        return None if self._cache is None else self._cache.store.size_bytes

    @property
    def response_cache(self) -> ResponseCache | None:
        """The response cache (entries, counters, ``clear()``); None when the server has none."""
        return None if self._cache is None else self._cache.store

    def update_response_cache(self, name: str, version: int | None = None, *, enable: bool,
                              drop_entries: bool = False) -> bool:
        """Turn the response cache on or off for a serving model without a reload, from its next
        request, until the model is reloaded (its config's ``response_cache`` then decides again);
        :meth:`model_config` shows the setting in force. Turning it on needs a server with a cache
        (``cache_size_bytes``) and a model that is not decoupled. The model's entries stay in the
        cache while its use of it is off, unless ``drop_entries`` (then it starts cold, as after a
        reload: what the tuner does before measuring a config). Returns the setting now in force."""
        target = self._target(name, version)
        if enable and self._cache is None:
            raise InvalidArgumentError(
                f"model '{name}': the server has no response cache to enable (start it with cache_size_bytes=N, "
                "or triton-nb serve --cache-config local,size=N)")
        self._cache_switches.set(target, bool(enable))
        if drop_entries:
            self._cache_switches.forget(target)
        return self._cache_switches.enabled(target)

    def wait_warm(self, name: str, version: int | None = None, timeout_s: float | None = None) -> bool:
        """Wait until every instance of a model serves at its steady speed — the FIL backend's
        compiled engine, which it builds in the background after the load, ready — and return
        True; False when ``timeout_s`` passed first. An ensemble waits for its composing models."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        target = self._target(name, version)
        if target.ensemble is not None:
            return all(self.wait_warm(step.model_name, None if step.model_version < 0 else step.model_version,
                                      None if deadline is None else max(0.0, deadline - time.monotonic()))
                       for step in target.ensemble.plan)
        return all(backend.wait_warm(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for backend in target.scheduler.instances())

    # ------------------------------------------------------------------ inference
    def infer_async(self, request: InferRequest) -> Future:
        """Queue a request; the future resolves to an InferResponse or an exception.

        At most ``max_pending_requests`` requests wait or run at once, server-wide: past that a
        request is refused at once (UNAVAILABLE), so clients sending faster than the models serve
        cannot make memory grow without end (a model's ``max_queue_size`` refuses earlier)."""
        with self._pending_lock:
            if self._pending >= self.settings.max_pending_requests:
                raise UnavailableError(
                    f"the server has {self._pending} pending requests (max_pending_requests "
                    f"{self.settings.max_pending_requests}): model '{request.model_name}' request refused")
            self._pending += 1
        try:
            future = self._infer_step(request, self.settings.max_string_bytes)
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

    def _infer_step(self, request: InferRequest, max_string_bytes: int | None = None,
                    given: Callable[[CheckedVersion], bool] | None = None) -> Future:
        """:meth:`infer_async` without the server-wide limit: for the steps of an ensemble the
        limit has already admitted. Steps skip the string-length check (``max_string_bytes``
        None): their strings are the ensemble's own inputs, checked once on the way in, or a
        model's outputs. ``given(target)`` tells whether the request's inputs already passed a
        check equal to the resolved version's (an ensemble's first step: the ensemble's inputs),
        which leaves only the batch size to check."""
        if self._stopped:
            raise UnavailableError("the server is stopped")
        sender = request.response_sender
        for attempt in range(3):
            target = self._resolve(request.model_name, request.model_version)
            try:
                check_request(target, request, target.scheduler.settings.max_batch_size if target.scheduler else None,
                               max_string_bytes, given=given is not None and given(target))
            except TritonNBError:
                # refused before it was scheduled: an error returned, no response sent (Triton's InferAsync)
                target.stats.record_request(success=False, request_ns=time.monotonic_ns() - request.arrival_ns,
                                            reason="OTHER", first_response=False)
                raise
            lookup = None
            if self._cache is not None:  # a hit is answered (and counted) here, never queued
                lookup = self._cache.lookup(target, request)
                if isinstance(lookup, Future):
                    return lookup
            if target.ensemble is not None:
                future = target.ensemble.run(request)  # it counts its requests itself, as the batcher does
                return future if lookup is None else lookup.finish(future)
            future = ResponseFuture()
            if sender is not None and target.stats.observes_first_responses:
                request.response_sender = _observing_first_response(sender, target.stats, request.arrival_ns)
            try:
                target.scheduler.enqueue(request, future)
            except UnavailableError:
                # A reload swapped this version out between resolve and enqueue: the new one serves.
                if attempt < 2 and self._resolve(request.model_name, request.model_version) is not target:
                    continue
                target.stats.record_request(success=False, request_ns=0, reason="REJECTED", first_response=False)
                raise
            except TritonNBError:
                target.stats.record_request(success=False, request_ns=0, reason="OTHER", first_response=False)
                raise
            # the scheduler counts it: pending, then success or failure with its batch
            return future if lookup is None else lookup.finish(future)
        raise InternalError("unreachable")  # pragma: no cover

    def infer_carried_async(self, request: InferRequest) -> list[Future] | None:
        """See :meth:`InferenceService.infer_carried_async`. Taken where the requests would all be
        admitted (``max_pending_requests``) and pass their checks, and the model is an ensemble
        whose chain road takes them (``EnsembleScheduler.takes_carried``) with no response cache
        to look them up in; each is then counted as a pending request until it is answered."""
        count = len(request.carried_rows)
        if self._stopped or count < 2 or len(request.carried_request_ids) != count:
            return None
        try:
            target = self._resolve(request.model_name, request.model_version)
        except TritonNBError:  # unknown or not ready: each request is refused alone
            return None
        ensemble = target.ensemble
        if ensemble is None or not ensemble.takes_carried(request) or (
                self._cache is not None and self._cache.switches.enabled(target)):
            return None
        try:
            limit = target.scheduler.settings.max_batch_size if target.scheduler else None
            check_carried_request(target, request, limit, self.settings.max_string_bytes)
        except TritonNBError:  # each request is refused alone, with its own message and count
            return None
        with self._pending_lock:
            if self._pending + count > self.settings.max_pending_requests:
                return None
            self._pending += count
        try:
            futures = ensemble.run_carried(request)
        except BaseException:
            with self._pending_lock:
                self._pending -= count
            raise
        for future in futures:
            future.add_done_callback(self._release_pending)
        return futures

    def infer_together(self) -> Together:
        """See :meth:`InferenceService.infer_together`: an ensemble's runs started inside submit
        their first step together when it ends (``EnsembleScheduler``'s chain), one carried request
        where the step's model takes one."""
        return Together("requests received together")

    def infer(self, request: InferRequest, timeout_s: float | None = None) -> InferResponse:
        """Run a request and wait for its response (raises the request's error)."""
        future = self.infer_async(request)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise UnavailableError(
                f"model '{request.model_name}': no response within {timeout_s:g} s (request timed out)") from None

    # ------------------------------------------------------------------ metadata
    def model_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The effective config, with live batching knobs reflected, as the protobuf
        ``ModelConfig`` (what gRPC's ModelConfig answers); :meth:`model_config_json` gives
        Triton's JSON form. ``version``: a number, or None for the one the version policy serves."""
        return self._effective_config(self._target(name, version))

    def _target(self, name: str, version: int | None) -> ManagedVersion:
        """The loaded version a public call names (None: the latest, the manager's -1)."""
        number = version_or_latest(version, stacklevel=5)
        return self._resolve(name, -1 if number is None else number)

    def _effective_config(self, target: ManagedVersion) -> ModelConfig:
        config = ModelConfig()
        config.CopyFrom(target.config)
        if target.scheduler is not None:
            settings = target.scheduler.settings
            if not settings.dynamic_batching:
                config.ClearField("dynamic_batching")  # turned off live, or never configured
            else:
                config.max_batch_size = settings.max_batch_size
                config.dynamic_batching.max_queue_delay_microseconds = settings.max_queue_delay_microseconds
                del config.dynamic_batching.preferred_batch_size[:]
                config.dynamic_batching.preferred_batch_size.extend(settings.preferred_batch_size)
                config.dynamic_batching.preserve_ordering = settings.preserve_ordering
            if config.instance_group:
                config.instance_group[0].count = target.scheduler.instance_count
                del config.instance_group[1:]
        live_cache = self._cache_switches.live(target)
        if live_cache is not None:  # set by update_response_cache
            config.response_cache.enable = live_cache
        return config

    def input_config(self, name: str, version: int | None = None) -> ModelConfig:
        """The loaded config itself, not a copy (read it, never change it): what clients need
        to convert inputs, without the cost of :meth:`model_config` on every request."""
        if version is None:  # the usual case, on every request's path: resolved without a frame more
            return self._resolve(name, -1).config
        return self._target(name, version).config

    def model_metadata(self, name: str, version: int | None = None) -> dict[str, Any]:
        """KServe v2 model metadata."""
        target = self._target(name, version)
        config = target.config
        batch = [-1] if config.max_batch_size > 0 else []

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": mc.DataType.Name(t.data_type).removeprefix("TYPE_").replace(
                "STRING", "BYTES"), "shape": batch + list(t.dims)} for t in items]

        return {
            "name": name,
            "versions": [str(v) for v in self._manager.serving_versions(name)],
            "platform": config.platform or config.backend,
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository with its versions' states, as Triton's index API."""
        return self._manager.repository_index(ready_only)

    def statistics(self, name: str | None = None, version: int | None = None) -> dict[str, Any]:
        """Triton's statistics-extension JSON: of every model (``name`` None), or of ``name``'s
        versions, all of them (``version`` None, as Triton's API has it) or one."""
        # Triton's statistics errors (400, "requested model 'x' is not available") come from the stats
        return self.stats.statistics(name, version)

    def config_warnings(self, name: str) -> list[str]:
        """What the last load of ``name`` warned about: config fields set that have no effect here,
        as in Triton (a GPU knob on CPU instances, a rate limiter without ``--rate-limit``)."""
        return list(self._manager.config_warnings.get(name, []))

    def queue_depth(self, name: str, version: int | None = None) -> int:
        target = self._target(name, version)
        return 0 if target.scheduler is None else target.scheduler.queue_depth()

    def metrics_text(self) -> bytes:
        """The Prometheus ``/metrics`` text of the server's models, with Triton's names."""
        return self.stats.prometheus_text()

    def model_config_json(self, name: str, version: int | None = None) -> dict[str, Any]:
        """:meth:`model_config` in Triton's JSON form (what HTTP's ``/config`` answers, and
        what :meth:`triton_nb.transport.Transport.model_config_json` returns)."""
        return config_to_json(self._effective_config(self._target(name, version)))

    def output_labels(self, name: str, output: str, version: int | None = None) -> list[str] | None:
        """The labels of an output's ``label_filename`` (one per line, in the model folder), for
        the classification extension; None when the output has none."""
        target = self._target(name, version)
        spec = next((o for o in target.config.output if o.name == output), None)
        if spec is None or not spec.label_filename:
            return None
        path = target.version_path.parent / spec.label_filename
        try:
            return path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InternalError(f"model '{name}': label file {spec.label_filename!r} cannot be read: {exc}") from None


def _observing_first_response(sender: Callable[[InferResponse | None, bool], None], stats: ModelStats,
                              arrival_ns: int) -> Callable[[InferResponse | None, bool], None]:
    """``sender``, observing the request's first response in ``stats``' first-response histogram
    as it is sent (Triton's ``InferenceResponse::Send``; a final flag alone is no response)."""
    sent = [False]

    def send(response: InferResponse | None, final: bool) -> None:
        if response is not None and not sent[0]:
            sent[0] = True
            stats.observe_first_response(time.monotonic_ns() - arrival_ns)
        sender(response, final)

    return send
