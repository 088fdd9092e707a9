"""The Python backend: a ``model.py`` written for NVIDIA Triton's Python backend, run in-process.

Each instance loads ``<version>/model.py`` (or ``default_model_filename``), creates its
``TritonPythonModel``, calls ``initialize(args)`` with the keys Triton passes, and answers
batches by wrapping the server's :class:`~triton_nb.tensors.InferRequest` objects as
:class:`triton_nb.backends.pb_utils.InferenceRequest` and converting the returned
``InferenceResponse`` objects back. ``import triton_python_backend_utils`` resolves to
:mod:`triton_nb.backends.pb_utils`. :func:`auto_complete` runs a model's static
``auto_complete_config`` for the server before instances are created.

Loading model code in a shared interpreter
------------------------------------------
Triton runs each instance in its own stub process; here every model shares one interpreter,
so two things that are free in Triton need care:

* **Unique module names.** ``model.py`` is loaded as ``_triton_nb_python_models.<pkg>.model``
  where ``<pkg>`` names the model, version and instance plus a process-wide counter, so two
  repositories (or two servers) with a model of the same name never share a module. ``<pkg>``
  is a package whose ``__path__`` is the version folder, so relative imports
  (``from . import helper``) load the folder's files under the same unique prefix.
* **Sibling modules** (``import fraud_encoding`` of a file or package beside ``model.py``) are top-level
  names, which Python caches process-wide in ``sys.modules``. Every import of model code runs
  inside an :class:`_ImportScope` (under one process-wide lock): it puts the version folder and
  the model folder first on ``sys.path`` (Triton adds both, at the end; first here, so a user's
  working directory or project on ``sys.path`` cannot hide a model's own files), temporarily
  takes out of ``sys.modules`` any module whose top-level name is also a file or package of the
  model's folders (stdlib names and ``triton_python_backend_utils`` excepted), and puts back
  the modules this instance imported before. On the way out, every module imported from inside
  the model folder is moved out of ``sys.modules`` into the instance (``_ImportScope.kept``),
  ``sys.path`` entries the model added inside its folder are remembered for later scopes, and
  the modules taken out are restored. The model's objects keep working through the references
  they hold. So each instance (like each Triton stub) has its own copy of its siblings, and
  ``helper`` of model A never answers ``import helper`` in model B.

  Module execution, ``auto_complete_config``, the constructor and ``initialize`` run inside the
  scope. ``execute``/``finalize`` do not hold the lock (that would serialise every model);
  instead ``model.py`` gets an ``__import__`` that re-enters its scope just for imports of its
  sibling names, so ``import helper`` inside ``execute`` still finds the right file. Imports
  done lazily inside *sibling* modules' functions after loading are not covered (they resolve
  against the process's ``sys.path``); import siblings at module level or in ``initialize``, as
  Triton's examples do. Because the lock is held through ``initialize``, Python models load one
  at a time.

The backend drives the model's pb_utils objects through :mod:`triton_nb.backends._pb_bridge`
(the calling instance, the wrapping of requests, the conversion of responses); how BLS finds the
server is described in :mod:`triton_nb.backends._pb_context` (a context variable set around every
call into the model, plus a registry of the model's modules for threads the model starts).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import json
import logging
import os
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_nb.backends import _pb_bridge as bridge
from triton_nb.backends import pb_utils
from triton_nb.backends.base import Backend, ModelContext, execute_apart
from triton_nb.errors import InternalError, InvalidArgumentError, NotFoundError, TritonNBError, UnavailableError
from triton_nb.tensors import InferRequest, InferResponse

if TYPE_CHECKING:  # the config's protobuf is imported where it is used: a process instance runs without it
    from triton_nb.repository.config import ModelConfig

__all__ = ["USER_READINESS_TIMEOUT_S", "PythonBackend", "PythonModelSettings", "UserReadiness", "auto_complete",
           "complete_config_json", "install_pb_utils"]

log = logging.getLogger(__name__)

PB_UTILS_MODULE = "triton_python_backend_utils"
_PACKAGE_ROOT = "_triton_nb_python_models"
_IMPORT_LOCK = threading.RLock()
_COUNTER = itertools.count(1)
_real_import = builtins.__import__
# Names a model folder must never shadow: the interpreter's own modules and Triton's utils.
_PROTECTED = frozenset(getattr(sys, "stdlib_module_names", ())) | {PB_UTILS_MODULE, "triton_nb"}
_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)
# What model code may raise and be answered as the model's error. SystemExit is one: sys.exit() in a
# model ends a Triton stub process, whose requests then fail; here, unhandled, it would silently end
# the instance's worker thread (or its asyncio loop) and leave every request to it waiting forever.
_MODEL_ERRORS = (Exception, SystemExit)

#: How long a readiness check waits for a model's ``is_ready()`` (python_backend's
#: ``kUserModelReadinessTimeoutMs``).
USER_READINESS_TIMEOUT_S = 5.0


def install_pb_utils() -> None:
    """Make ``import triton_python_backend_utils`` give :mod:`triton_nb.backends.pb_utils`."""
    if sys.modules.get(PB_UTILS_MODULE) is not pb_utils:
        sys.modules[PB_UTILS_MODULE] = pb_utils


# --------------------------------------------------------------------------- import isolation


def _inside(path: str | None, root: str) -> bool:
    if not path:
        return False
    try:
        return os.path.commonpath([os.path.abspath(path), root]) == root
    except ValueError:  # different drives
        return False


def _module_inside(module: Any, root: str) -> bool:
    location = getattr(module, "__file__", None)
    if location:
        return _inside(location, root)
    paths = getattr(module, "__path__", None)  # namespace packages have no __file__
    try:
        return bool(paths) and all(_inside(p, root) for p in paths)
    except TypeError:
        return False


def _top_level_names(folder: str) -> set[str]:
    """The names ``import <name>`` would find in ``folder``: modules, packages, extensions."""
    names: set[str] = set()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return names
    for entry in entries:
        name = entry.name
        if entry.is_dir():
            if name.isidentifier():
                names.add(name)
        elif name.endswith(".py"):
            names.add(name[:-3])
        elif name.endswith(_EXTENSION_SUFFIXES):
            names.add(name.split(".", 1)[0])
    return {n for n in names if n.isidentifier()}


class _ImportScope:
    """Makes a model's folders importable, and its sibling modules private to one instance."""

    def __init__(self, version_dir: str, model_dir: str) -> None:
        self.version_dir = version_dir
        self.model_dir = model_dir
        self.kept: dict[str, types.ModuleType] = {}
        self.extra_paths: list[str] = []
        self.on_new_modules: Any = None  # callback(list of modules) when a scope keeps new modules
        self._active = False
        self._names: frozenset[str] = frozenset()  # sibling names, refreshed on each entry

    def sibling_names(self) -> set[str]:
        names = _top_level_names(self.version_dir) | _top_level_names(self.model_dir)
        for path in self.extra_paths:
            names |= _top_level_names(path)
        names |= {name.partition(".")[0] for name in self.kept}
        return names - _PROTECTED

    def owns(self, top_level_name: str) -> bool:
        """Whether ``import <top_level_name>`` means a file of this model (as of the last scope entry)."""
        return top_level_name in self._names

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with _IMPORT_LOCK:
            if self._active:  # re-entered on this thread (the lock is held)
                yield
                return
            self._active = True
            try:
                names = self._names = frozenset(self.sibling_names())
                # list(): other threads may import while we look (sys.modules must not change under an iterator)
                shadowed = {
                    name: module for name, module in list(sys.modules.items()) if name.partition(".")[0] in names
                }
                for name in shadowed:
                    sys.modules.pop(name, None)
                before = dict(sys.modules)
                sys.modules.update(self.kept)
                front = [self.version_dir, self.model_dir, *self.extra_paths]
                original_path = list(sys.path)
                sys.path[:0] = front
                try:
                    yield
                finally:
                    self._leave(front, original_path, before, shadowed)
            finally:
                self._active = False

    def _leave(self, front: list[str], original_path: list[str], before: dict[str, Any],
               shadowed: dict[str, Any]) -> None:
        for entry in front:
            with contextlib.suppress(ValueError):
                sys.path.remove(entry)
        known = set(original_path)
        for entry in list(sys.path):
            if entry not in known and isinstance(entry, str) and _inside(entry, self.model_dir):
                sys.path.remove(entry)
                if entry not in self.extra_paths and entry not in (self.version_dir, self.model_dir):
                    self.extra_paths.append(entry)
        new_modules = []
        for name, module in list(sys.modules.items()):
            if name.startswith(_PACKAGE_ROOT + "."):
                continue  # unique names: they stay until the instance unloads
            if before.get(name) is module or not _module_inside(module, self.model_dir):
                continue
            sys.modules.pop(name, None)
            if self.kept.get(name) is not module:
                new_modules.append(module)
            self.kept[name] = module
        sys.modules.update(shadowed)
        if new_modules and self.on_new_modules is not None:
            self.on_new_modules(new_modules)


def _slug(text: str) -> str:
    return re.sub(r"\W", "_", text) or "_"


def _ensure_root_package() -> None:
    if _PACKAGE_ROOT not in sys.modules:
        root = types.ModuleType(_PACKAGE_ROOT, "Python-backend models loaded by triton_nb (one package per instance).")
        root.__path__ = []
        root.__spec__ = importlib.machinery.ModuleSpec(_PACKAGE_ROOT, None, is_package=True)
        root.__spec__.submodule_search_locations = []
        sys.modules[_PACKAGE_ROOT] = root


class _LoadedModule:
    """``model.py`` of one instance, loaded under a unique name, with its import scope."""

    def __init__(self, model_name: str, version: int, instance: str, version_path: Path, model_path: Path,
                 filename: str, code_dir: Path | None = None) -> None:
        """``code_dir``: a Python-based backend's folder, whose ``model.py`` runs instead of the
        version folder's; its folder alone is the import scope, as Triton's stub puts only it on
        ``sys.path`` (the model keeps its own folder for its files and ``get_model_dir()``)."""
        self.model_name = model_name
        self.version_dir = os.path.abspath(version_path)
        self.model_dir = os.path.abspath(model_path)
        self.code_dir = os.path.abspath(code_dir) if code_dir is not None else self.version_dir
        self.file = os.path.join(self.code_dir, filename)
        self.scope = (_ImportScope(self.code_dir, self.code_dir) if code_dir is not None
                      else _ImportScope(self.version_dir, self.model_dir))
        self.package = f"{_PACKAGE_ROOT}.{_slug(model_name)}_v{version}_{_slug(instance)}_{next(_COUNTER)}"
        self.module: types.ModuleType | None = None

    def load(self) -> types.ModuleType:
        if not os.path.isfile(self.file):
            raise NotFoundError(f"model '{self.model_name}': no Python model file at {self.file}")
        install_pb_utils()
        stem = _slug(Path(self.file).stem)
        with _IMPORT_LOCK:
            _ensure_root_package()
            package = types.ModuleType(self.package)
            package.__path__ = [self.code_dir]
            package.__spec__ = importlib.machinery.ModuleSpec(self.package, None, is_package=True)
            package.__spec__.submodule_search_locations = [self.code_dir]
            package.__package__ = self.package
            sys.modules[self.package] = package
            name = f"{self.package}.{stem}"
            spec = importlib.util.spec_from_file_location(name, self.file)
            if spec is None or spec.loader is None:
                raise InternalError(f"model '{self.model_name}': cannot load {self.file}")
            module = importlib.util.module_from_spec(spec)
            module.__dict__["__builtins__"] = self._builtins()
            sys.modules[name] = module
            try:
                with self.scope.active():
                    spec.loader.exec_module(module)
            except BaseException as exc:
                self.unload()
                if isinstance(exc, _MODEL_ERRORS):
                    raise InternalError(
                        f"model '{self.model_name}': failed to load {self.file}: {_describe(exc)}"
                    ) from exc
                raise
        self.module = module
        return module

    def _builtins(self) -> dict[str, Any]:
        """model.py's builtins: ``__import__`` re-enters the import scope for its sibling names."""
        scope = self.scope

        def scoped_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                          level: int = 0) -> Any:
            if level == 0 and scope.owns(name.partition(".")[0]):
                with scope.active():
                    return _real_import(name, globals, locals, fromlist, level)
            return _real_import(name, globals, locals, fromlist, level)

        namespace = dict(builtins.__dict__)
        namespace["__import__"] = scoped_import
        return namespace

    def modules(self) -> list[types.ModuleType]:
        """Every module holding this instance's code (for the BLS owner registry)."""
        mine = [m for n, m in list(sys.modules.items()) if n == self.package or n.startswith(self.package + ".")]
        return mine + list(self.scope.kept.values())

    def unload(self) -> None:
        with _IMPORT_LOCK:
            for name in [n for n in list(sys.modules) if n == self.package or n.startswith(self.package + ".")]:
                sys.modules.pop(name, None)
        self.scope.kept.clear()
        self.module = None


class _ModelExit(RuntimeError):
    """A model's ``sys.exit()`` inside ``async def execute``, carried out of the event loop as an error."""

    def __init__(self, exit_: SystemExit) -> None:
        super().__init__(_describe(exit_))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _ModelExit):
        return str(exc)
    if isinstance(exc, (pb_utils.TritonModelException, TritonNBError)):
        return str(exc) or type(exc).__name__
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def model_filename(config: ModelConfig, code_dir: Path | None = None) -> str:
    """The file to load: a Python-based backend's is always its folder's model.py."""
    return "model.py" if code_dir is not None else config.default_model_filename or "model.py"


@dataclass(frozen=True)
class PythonModelSettings:
    """What an instance reads of its model's config, as plain values: a process instance
    (:mod:`triton_nb.backends.python_process`) receives these, not the protobuf config."""

    config_json: str  # the effective config, as initialize(args)["model_config"] carries it
    decoupled: bool
    output_names: tuple[str, ...]
    filename: str  # the model file in the version folder

    @classmethod
    def from_config(cls, config: ModelConfig) -> PythonModelSettings:
        from triton_nb.repository.config import config_to_json

        return cls(json.dumps(config_to_json(config)), bool(config.model_transaction_policy.decoupled),
                   tuple(tensor.name for tensor in config.output), model_filename(config))


# --------------------------------------------------------------------------- auto-complete


def auto_complete(config: ModelConfig, version_path: Path, code_dir: Path | None = None) -> ModelConfig:
    """Run ``TritonPythonModel.auto_complete_config`` (when the model defines it) on ``config``.

    Called by the server before creating instances, with the config as read (the version
    folder says which ``model.py``). Returns the completed config; ``config`` is not changed.
    As in Triton, the module is loaded in a throw-away namespace: nothing created here is
    visible to the instances. A model that runs in processes of its own has this run there
    (:func:`triton_nb.backends.python_process.auto_complete_in_process`), with its interpreter.
    ``code_dir``: a Python-based backend's folder, whose ``model.py`` is the one to ask.
    """
    from triton_nb.repository.config import ModelConfig, config_from_json, config_to_json

    name = config.name or Path(version_path).parent.name
    completed = complete_config_json(config_to_json(config), name, version_path, model_filename(config, code_dir),
                                     code_dir)
    if completed is None:
        unchanged = ModelConfig()
        unchanged.CopyFrom(config)
        return unchanged
    return config_from_json(completed, source=f"model '{name}': auto_complete_config result")


def complete_config_json(data: dict[str, Any], name: str, version_path: str | Path,
                         filename: str, code_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The model's ``auto_complete_config`` on ``data`` (the config in Triton's JSON form): the
    completed config as JSON, or None when the model defines no hook. Needs no protobuf, so a
    model's own process runs it too."""
    version_path = Path(version_path)
    loaded = _LoadedModule(name, _version_of(version_path), "autocomplete", version_path, version_path.parent,
                           filename, code_dir=None if code_dir is None else Path(code_dir))
    module = loaded.load()
    context = bridge.CallContext(name, _version_of(version_path), None,
                                 logging.getLogger(f"triton_nb.python_backend.{name}"), loaded.version_dir)
    try:
        model_class = getattr(module, "TritonPythonModel", None)
        hook = getattr(model_class, "auto_complete_config", None)
        if hook is None:
            return None
        data = dict(data)
        if not data.get("name"):
            data["name"] = name  # for the messages of pb_utils.ModelConfig
        with loaded.scope.active(), bridge.calling(context):
            try:
                result = hook(pb_utils.ModelConfig(data))
            except ValueError as exc:
                raise InvalidArgumentError(f"model '{name}': auto_complete_config: {exc}") from exc
            except _MODEL_ERRORS as exc:
                raise InternalError(f"model '{name}': auto_complete_config failed: {_describe(exc)}") from exc
        if not isinstance(result, pb_utils.ModelConfig):
            raise InternalError(
                f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object."
            )
        return result.as_dict()
    finally:
        loaded.unload()


def _version_of(version_path: Path) -> int:
    try:
        return int(version_path.name)
    except ValueError:
        return -1


# --------------------------------------------------------------------------- the backend


class _EventLoop:
    """The event loop of one instance's ``async def execute`` (Triton runs one per stub)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=f"{name}-asyncio", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self, timeout: float = 5.0) -> None:
        async def cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_default_executor()

        with contextlib.suppress(Exception):
            self.submit(cancel_all()).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        if not self.loop.is_running():
            self.loop.close()


class UserReadiness:
    """A model's own ``is_ready()`` behind its instance's readiness, as python_backend 2.67's
    ``RunUserModelReadinessCheck``: asked at every readiness check (never cached); while one call
    runs, other checks wait for its answer instead of calling the model again; a check that waits
    more than :data:`USER_READINESS_TIMEOUT_S` finds the instance not ready (UNAVAILABLE), and the
    call still running answers the next check."""

    def __init__(self, instance_name: str) -> None:
        self._instance = instance_name
        self._lock = threading.Lock()
        self._running: Future[bool] | None = None

    def check(self, start: Callable[[], Future[bool]]) -> None:
        """Return when the model says it is ready; else raise why not. ``start`` begins a call
        of the model's ``is_ready()`` and returns its future answer (or error)."""
        with self._lock:
            running, joined = self._running, self._running is not None
            if running is None:
                running = self._running = start()
        running.add_done_callback(self._finished)
        try:
            ready = running.result(timeout=USER_READINESS_TIMEOUT_S)
        except TimeoutError:
            raise UnavailableError("Timed out waiting for in-flight is_ready() response" if joined else
                                   "Timed out waiting for user-defined is_ready() response") from None
        if not ready:
            raise UnavailableError(f"Model '{self._instance}' is not ready (user-defined check failed).")

    def _finished(self, future: Future[bool]) -> None:
        with self._lock:
            if self._running is future:
                self._running = None


class PythonBackend(Backend):
    """One instance of a Triton Python-backend model."""

    #: Whether the model defines ``is_ready()`` (which its readiness then asks).
    has_is_ready = False

    def __init__(self, context: ModelContext, *, backend_folder: Path | None = None,
                 settings: PythonModelSettings | None = None) -> None:
        """``backend_folder``: run a Python-based backend's ``model.py`` (from that folder of a
        backend directory) for this model, as Triton's Python backend does for a config whose
        ``backend`` names it; None runs the model's own ``<version>/model.py``. ``settings``:
        the config's values when ``context.config`` is not there (a process instance)."""
        super().__init__(context)
        if settings is None:
            settings = PythonModelSettings.from_config(context.config)
        self.settings = settings
        self.name = context.name
        self.decoupled = settings.decoupled
        # A decoupled model streams its answers through each request's sender: those cannot be joined.
        self.accepts_carried = not self.decoupled  # (see execute_apart)
        self._output_names = list(settings.output_names)
        self._logger = logging.getLogger(f"triton_nb.python_backend.{context.name}")
        filename = "model.py" if backend_folder is not None else settings.filename
        self._loaded = _LoadedModule(context.name, context.version, context.instance_name, context.version_path,
                                     context.model_path, filename, code_dir=backend_folder)
        self._call = bridge.CallContext(context.name, context.version, context.server, self._logger,
                                        self._loaded.version_dir)
        self._loaded.scope.on_new_modules = self._own
        self._events: _EventLoop | None = None
        self._events_lock = threading.Lock()
        self._background: set[Future[Any]] = set()
        self._finalized = False
        module = self._loaded.load()
        self._own(self._loaded.modules())
        try:
            model_class = getattr(module, "TritonPythonModel", None)
            if model_class is None:
                raise InternalError(f"{self._loaded.file} does not define class TritonPythonModel")
            with self._loaded.scope.active(), bridge.calling(self._call):
                self._model = model_class()
                initialize = getattr(self._model, "initialize", None)
                if initialize is not None:
                    outcome = initialize(self._initialize_args())
                    if inspect.iscoroutine(outcome):
                        self._run_coroutine(outcome)
            if not hasattr(self._model, "execute"):
                raise InternalError(f"Python model {self._loaded.file} does not implement `execute` method.")
            # looked up once after initialize, as python_backend's stub does
            self.has_is_ready = hasattr(self._model, "is_ready")
            self._readiness = UserReadiness(context.instance_name)
        except _MODEL_ERRORS as exc:
            self._release()
            raise InternalError(f"model '{self.name}' initialize failed: {_describe(exc)}") from exc

    # -- loading -------------------------------------------------------------------------
    def _initialize_args(self) -> dict[str, str]:
        context = self.context
        kind = context.instance_kind.removeprefix("KIND_")
        return {
            "model_config": self.settings.config_json,
            "model_instance_kind": kind,
            "model_instance_name": context.instance_name,
            "model_instance_device_id": str(context.device_id),
            "model_repository": str(context.model_path),
            "model_version": str(context.version),
            "model_name": context.name,
        }

    def _own(self, modules: list[types.ModuleType]) -> None:
        for module in modules:
            bridge.register_owner(module, self._call)

    def _release(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
        for module in self._loaded.modules():
            bridge.unregister_owner(module)
        self._loaded.unload()

    # -- readiness -----------------------------------------------------------------------
    def check_ready(self) -> None:
        """The model's ``is_ready()`` where it defines one (Triton 2.67); ready otherwise."""
        if self.has_is_ready and not self._finalized:
            self._readiness.check(self._start_is_ready)

    def _start_is_ready(self) -> Future[bool]:
        # on a thread of its own: a model that hangs in is_ready() costs the check its time limit,
        # not the caller's thread
        future: Future[bool] = Future()

        def run() -> None:
            try:
                future.set_result(self.call_is_ready())
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, daemon=True, name=f"triton-nb-{self.context.instance_name}-is-ready").start()
        return future

    def call_is_ready(self) -> bool:
        """The model's ``is_ready()``, as python_backend's stub calls it: awaited when it is a
        coroutine; an exception, or an answer that is not a bool, is an error (not ready)."""
        try:
            with bridge.calling(self._call):
                answer = self._model.is_ready()
                if inspect.iscoroutine(answer):
                    answer = self._run_coroutine(answer)
        except _MODEL_ERRORS as exc:
            raise InternalError(f"model '{self.name}': is_ready() failed: {_describe(exc)}") from exc
        if not isinstance(answer, bool):
            raise InternalError(f"model '{self.name}': is_ready() must return a boolean value, "
                                f"got {type(answer).__name__}")
        return answer

    # -- executing -----------------------------------------------------------------------
    def execute(self, requests: list[InferRequest]) -> list[InferResponse] | None:
        # a carried request (an ensemble step's formed batch) reaches the model as the requests it carries
        return execute_apart(requests, self._execute)

    def _execute(self, requests: list[InferRequest]) -> list[InferResponse] | None:
        wrapped = [self._wrap(request) for request in requests]
        try:
            with bridge.calling(self._call):
                result = self._model.execute(wrapped)
                if inspect.iscoroutine(result):
                    if self.decoupled:  # as Triton: run in the background, the next batch may start
                        self._run_background(result, wrapped)
                        return None
                    result = self._run_coroutine(result)
        except _MODEL_ERRORS as exc:
            bridge.close_senders(wrapped)
            self._logger.error("model '%s': execute failed", self.name, exc_info=True)
            raise InternalError(
                f"Failed to process the request(s) for model '{self.name}', message: {_describe(exc)}"
            ) from exc
        if self.decoupled:
            if result is not None:
                bridge.close_senders(wrapped)
                raise InternalError(
                    f"Python model '{self.name}' is using the decoupled mode and the execute function must return None."
                )
            return None
        return bridge.server_responses(requests, wrapped, result, self.name, self.context.version)

    def _wrap(self, request: InferRequest) -> pb_utils.InferenceRequest:
        forward = self._forwarder(request) if self.decoupled else None
        return bridge.served_request(request, decoupled=self.decoupled, output_names=self._output_names,
                                     forward=forward)

    def _forwarder(self, request: InferRequest) -> bridge.Forward:
        def forward(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            sender = request.response_sender
            if sender is None:
                raise pb_utils.TritonModelException(
                    f"model '{self.name}': this request has no response sender (the server did not stream it)"
                )
            converted = (bridge.server_response(request, response, self.name, self.context.version)
                         if response is not None else None)
            sender(converted, final)

        return forward

    # -- async execute -------------------------------------------------------------------
    def _event_loop(self) -> _EventLoop:
        with self._events_lock:
            if self._events is None:
                self._events = _EventLoop(self.context.instance_name)
            return self._events

    async def _in_context(self, coroutine: Any) -> Any:
        with bridge.calling(self._call):
            try:
                return await coroutine
            except SystemExit as exc:  # asyncio lets it stop the loop, and the awaiting thread would wait forever
                raise _ModelExit(exc) from exc

    def _run_coroutine(self, coroutine: Any) -> Any:
        return self._event_loop().submit(self._in_context(coroutine)).result()

    def _run_background(self, coroutine: Any, wrapped: list[pb_utils.InferenceRequest]) -> None:
        future = self._event_loop().submit(self._in_context(coroutine))
        self._background.add(future)

        def done(f: Future[Any]) -> None:
            self._background.discard(f)
            if f.cancelled():
                error: BaseException = InternalError(f"model '{self.name}': async execute was cancelled")
            elif f.exception() is not None:
                error = f.exception()  # type: ignore[assignment]
                self._logger.error("model '%s': async execute failed", self.name, exc_info=error)
            elif f.result() is not None:
                error = InternalError(f"Python model '{self.name}' is using the decoupled mode and the execute "
                                      "function must return None.")
            else:
                return
            self._fail_open_requests(wrapped, error)

        future.add_done_callback(done)

    def _fail_open_requests(self, wrapped: list[pb_utils.InferenceRequest], error: BaseException) -> None:
        """Finish, with an error, every request of a failed background batch not yet finished."""
        message = f"Failed to process the request(s) for model '{self.name}', message: {_describe(error)}"
        for request in bridge.close_open_requests(wrapped):
            target = request.response_sender
            if target is not None:
                failed = InferResponse.failed(request, InternalError(message), self.context.version)
                with contextlib.suppress(Exception):
                    target(failed, True)

    # -- unloading -----------------------------------------------------------------------
    def finalize(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        if self._events is not None:
            self._events.close()
            self._events = None
        hook = getattr(self._model, "finalize", None)
        if hook is not None:
            try:
                with bridge.calling(self._call):
                    outcome = hook()
                    if inspect.iscoroutine(outcome):
                        asyncio.run(outcome)
            except _MODEL_ERRORS:
                self._logger.exception("model '%s': finalize raised; the instance is unloaded anyway", self.name)
        self._model = None
        self._release()
