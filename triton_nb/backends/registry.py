"""Which code serves a model: the ``backend`` a config names, resolved to a backend factory.

Triton loads ``backend: "NAME"`` from its backend directory: a shared library
``libtriton_NAME.so``, or a *Python-based backend* — a ``NAME/model.py`` there that the Python
backend runs for every model whose config names ``NAME`` (python_backend ``src/pb_stub.cc``,
``ModelContext::Init``: the model keeps its own folder, files and parameters; only the code comes
from the backend folder). triton_nb resolves a name, in this order:

1. a factory registered in this process with :func:`register_backend`;
2. an entry point named ``NAME`` in the group ``triton_nb.backends`` of an installed
   distribution (``[project.entry-points."triton_nb.backends"] NAME = "pkg.module:Factory"``);
3. a Python-based backend: ``<backend directory>/NAME/model.py`` (``serve(...,
   backend_directory=DIR)``, ``triton-nb serve --backend-directory DIR``), run as Triton's
   Python backend runs it;
4. the built-ins: ``fil``, ``python``, ``onnxruntime``.

A name found nowhere fails the load with what was searched. A factory is any callable taking the
instance's :class:`~triton_nb.backends.base.ModelContext` and returning a
:class:`~triton_nb.backends.base.Backend` — usually the ``Backend`` subclass itself; see that
module for the contract (one object per instance, one batch at a time on the instance's own
thread, per-request errors in the response, an exception fails the batch).
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from triton_nb.backends.base import Backend, ModelContext
from triton_nb.errors import InvalidArgumentError

if TYPE_CHECKING:
    from triton_nb.repository.config import ModelConfig

__all__ = ["BUILTIN_BACKENDS", "ENTRY_POINT_GROUP", "BackendFactory", "ResolvedBackend", "backend_factory",
           "python_auto_complete", "python_instance", "register_backend", "registered_backends", "resolve_backend",
           "unregister_backend"]

BackendFactory = Callable[[ModelContext], Backend]

#: The entry-point group installed distributions declare backends in.
ENTRY_POINT_GROUP = "triton_nb.backends"
#: The backends triton_nb ships.
BUILTIN_BACKENDS = ("fil", "python", "onnxruntime")
#: The file a Python-based backend's folder holds (Triton's name for it).
BACKEND_MODEL_FILENAME = "model.py"

_lock = threading.Lock()
_registered: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory, *, replace: bool = False) -> None:
    """Serve models whose config says ``backend: "name"`` with ``factory`` (a ``Backend``
    subclass, or any callable taking a ``ModelContext``). Models loaded afterwards use it; a
    name registered twice is an error unless ``replace``. A built-in name may be registered,
    and then wins (to wrap or replace a built-in backend)."""
    if not isinstance(name, str) or not name or "/" in name or name != name.strip():
        raise InvalidArgumentError(f"backend name must be a non-empty name without '/' or spaces, got {name!r}")
    if not callable(factory):
        raise InvalidArgumentError(f"backend '{name}': the factory must be callable (a Backend subclass), "
                                   f"got {type(factory).__name__}")
    with _lock:
        if name in _registered and not replace and _registered[name] is not factory:
            raise InvalidArgumentError(f"backend '{name}' is already registered (pass replace=True to replace it)")
        _registered[name] = factory


def unregister_backend(name: str) -> None:
    """Forget a registered backend (models already loaded keep their instances)."""
    with _lock:
        _registered.pop(name, None)


def registered_backends() -> dict[str, BackendFactory]:
    """The backends registered in this process, by name."""
    with _lock:
        return dict(_registered)


def _entry_point(name: str) -> BackendFactory | None:
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == name:
            try:
                factory = entry.load()
            except Exception as exc:  # the distribution's bug: the load error says whose
                raise InvalidArgumentError(f"backend '{name}': entry point {entry.value!r} of group "
                                           f"'{ENTRY_POINT_GROUP}' failed to import: {type(exc).__name__}: "
                                           f"{exc}") from exc
            if not callable(factory):
                raise InvalidArgumentError(f"backend '{name}': entry point {entry.value!r} is not callable")
            return factory
    return None


def _in_a_process(config: ModelConfig, name: str, model_path: Path,
                  python_instances: str) -> tuple[str | None, dict[str, str] | None] | None:
    """Where a Python model runs: None for threads of this process; else ``(interpreter, env)``
    for processes of its own — this interpreter (None, None) with ``python_instances="process"``,
    or always, with ``EXECUTION_ENV_PATH``, its packed environment's."""
    parameters = config.parameters
    env_path = parameters["EXECUTION_ENV_PATH"].string_value if "EXECUTION_ENV_PATH" in parameters else ""
    if not env_path:
        return (None, None) if python_instances == "process" else None
    from triton_nb.backends.execution_env import execution_environment

    environment = execution_environment(name, env_path, model_path)
    return environment.interpreter, environment.process_env()


def python_instance(context: ModelContext, backend_folder: Path | None = None) -> Backend:
    """A Python-model instance as the server runs them: a thread of this process, or a process
    of its own (``python_instances="process"``, or always with ``EXECUTION_ENV_PATH``, whose
    interpreter it then runs)."""
    where = _in_a_process(context.config, context.name, context.model_path, context.python_instances)
    if where is None:
        from triton_nb.backends.python import PythonBackend

        return PythonBackend(context, backend_folder=backend_folder)
    from triton_nb.backends.python_process import ProcessPythonBackend

    interpreter, env = where
    return ProcessPythonBackend(context, backend_folder=backend_folder, interpreter=interpreter, env=env)


def python_auto_complete(config: ModelConfig, version_path: Path, model_path: Path, *,
                         python_instances: str = "thread", code_dir: Path | None = None) -> ModelConfig:
    """A Python model's ``auto_complete_config``, run where its instances will run (the same
    choice as :func:`python_instance`): in this interpreter for thread instances, else in a
    process of its own with the instances' interpreter. ``code_dir``: a Python-based backend's
    folder, whose ``model.py`` runs for the model."""
    where = _in_a_process(config, config.name or model_path.name, model_path, python_instances)
    if where is None:
        from triton_nb.backends.python import auto_complete

        return auto_complete(config, version_path, code_dir=code_dir)
    from triton_nb.backends.python_process import auto_complete_in_process

    interpreter, env = where
    return auto_complete_in_process(config, version_path, interpreter=interpreter, env=env, code_dir=code_dir)


def _python_based(name: str, backend_directory: Path) -> BackendFactory | None:
    folder = backend_directory / name
    if not (folder / BACKEND_MODEL_FILENAME).is_file():
        return None

    def factory(context: ModelContext) -> Backend:
        return python_instance(context, folder)

    return factory


def _builtin(name: str) -> BackendFactory | None:
    # imported on first use: a FIL-only repository need not import onnxruntime, nor the other way round
    if name == "fil":
        from triton_nb.backends.fil import FilBackend

        return FilBackend
    if name == "python":
        return python_instance
    if name == "onnxruntime":
        from triton_nb.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend
    return None


@dataclass(frozen=True)
class ResolvedBackend:
    """Where a backend name was found: the factory, and for a Python-based backend its folder
    (Triton then reports the model's ``runtime`` as ``model.py``)."""

    factory: BackendFactory
    source: str  # "registered", "entry point", "backend directory" or "built-in"
    folder: Path | None = None


def resolve_backend(name: str, *, model: str, backend_directory: str | Path | None = None) -> ResolvedBackend:
    """Find ``backend: name`` for ``model`` in the order of the module docstring; raises
    :class:`InvalidArgumentError` listing every place searched."""
    with _lock:
        factory = _registered.get(name)
    if factory is not None:
        return ResolvedBackend(factory, "registered")
    if name:
        factory = _entry_point(name)
        if factory is not None:
            return ResolvedBackend(factory, "entry point")
        if backend_directory is not None:
            folder = Path(backend_directory) / name
            factory = _python_based(name, Path(backend_directory))
            if factory is not None:
                return ResolvedBackend(factory, "backend directory", folder)
    factory = _builtin(name)
    if factory is not None:
        return ResolvedBackend(factory, "built-in")
    searched = [f"registered backends ({', '.join(sorted(registered_backends())) or 'none'})",
                f"entry points in group '{ENTRY_POINT_GROUP}'"]
    searched.append(f"{Path(backend_directory) / name / BACKEND_MODEL_FILENAME}" if backend_directory is not None
                    else "no backend directory (serve(backend_directory=...), --backend-directory)")
    searched.append(f"built-ins ({', '.join(BUILTIN_BACKENDS)}, and platform ensemble)")
    raise InvalidArgumentError(f"model '{model}': backend '{name}' was not found; searched: {'; '.join(searched)}")


def backend_factory(name: str, *, model: str, backend_directory: str | Path | None = None) -> BackendFactory:
    """The factory that serves ``backend: name`` for ``model`` (see :func:`resolve_backend`)."""
    return resolve_backend(name, model=model, backend_directory=backend_directory).factory
