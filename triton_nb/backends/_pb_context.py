"""Which model instance the running model code belongs to: what BLS, ``Logger``, ``get_model_dir``
and custom metrics of :mod:`triton_nb.backends.pb_utils` need to know.

A model builds ``pb_utils.InferenceRequest(model_name=...)`` with no reference to any server,
and several triton_nb servers may live in one process. The Python backend therefore runs every
call into model code (``initialize``, ``execute``, ``finalize``, ``auto_complete_config``)
inside :func:`calling`, which sets a context variable to the calling instance's
:class:`CallContext` (its server handle, model name and logger). Context variables are per
thread and per asyncio task (copied into tasks the model creates), so concurrent instances of
different servers never see each other's context. Threads a model starts itself begin with an
empty context; for them, the backend registers the globals of the model's modules
(:func:`register_owner`) and :func:`current_context` walks the caller's stack to the nearest
frame running model code.

The backend reaches this module through :mod:`triton_nb.backends._pb_bridge` (the writing side:
:func:`calling`, :func:`register_owner`, :func:`unregister_owner`); pb_utils reads it
(:func:`current_context`, :func:`require_server`) on whatever thread model code runs.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import TYPE_CHECKING

from triton_nb.backends._pb_errors import TritonModelException

if TYPE_CHECKING:
    from triton_nb.backends.base import ServerHandle

__all__ = ["CallContext", "calling", "current_context", "register_owner", "require_server", "unregister_owner"]


@dataclass(frozen=True)
class CallContext:
    """The model instance that model code runs for: what BLS, Logger and get_model_dir need."""

    model_name: str
    model_version: int
    server: ServerHandle | None
    logger: logging.Logger
    model_dir: str  # the folder of model.py, as pb_utils.get_model_dir() returns it
    instance_name: str = ""  # "<group name>_<index>", as Triton names the instance ("" if not told)


_CURRENT: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("triton_nb_pb_utils_call", default=None)

# id(module globals) -> (weak reference to the module, context), for threads a model starts.
_OWNERS: dict[int, tuple[weakref.ref[ModuleType], CallContext]] = {}
_OWNERS_LOCK = threading.Lock()


@contextlib.contextmanager
def calling(context: CallContext) -> Iterator[None]:
    """Run model code on behalf of ``context`` (set around every call into a model)."""
    token = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def register_owner(module: ModuleType, context: CallContext) -> None:
    """Code defined in ``module`` runs for ``context`` (found by walking a thread's stack)."""
    with _OWNERS_LOCK:
        _OWNERS[id(module.__dict__)] = (weakref.ref(module), context)


def unregister_owner(module: ModuleType) -> None:
    """Forget ``module`` (its instance unloads)."""
    with _OWNERS_LOCK:
        entry = _OWNERS.get(id(module.__dict__))
        if entry is not None and entry[0]() is module:
            del _OWNERS[id(module.__dict__)]


def current_context() -> CallContext | None:
    """The instance the calling code runs for; None outside any served model."""
    context = _CURRENT.get()
    if context is not None:
        return context
    if not _OWNERS:
        return None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        entry = _OWNERS.get(id(frame.f_globals))
        if entry is not None:
            module = entry[0]()
            if module is not None and module.__dict__ is frame.f_globals:
                return entry[1]
        frame = frame.f_back
    return None


def require_server(what: str) -> CallContext:
    """The calling instance, which must have a server to call (``what`` names the call)."""
    context = current_context()
    if context is None or context.server is None:
        where = f"model '{context.model_name}'" if context is not None else "this code"
        raise TritonModelException(
            f"{what}: no triton_nb server is reachable from {where}; BLS requests can be sent only from a "
            "Python model's execute() (or threads it starts) while it is served by a triton_nb server"
        )
    return context
