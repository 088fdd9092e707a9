"""The public in-kernel server: the engine plus the conveniences that live above it.

:class:`InferenceServer` is :class:`triton_nb.server.core.Server` — same parameters, same
behaviour — with the two calls a notebook wants on the server object itself: :meth:`client`
(an :class:`~triton_nb.client.InProcessClient`) and :meth:`tune` (the ipywidgets tuning panel).
They are defined here, above the client and the notebook layer, because nothing under
:mod:`triton_nb.server` may depend on those; :func:`serve` starts one and returns it running.

Contract: an ``InferenceServer`` is a ``Server`` (``isinstance`` holds) and satisfies
:class:`triton_nb.server.service.InferenceService`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from triton_nb.server.core import Server
from triton_nb.server.settings import ServerSettings

if TYPE_CHECKING:
    from triton_nb.client import InProcessClient
    from triton_nb.notebook.widgets import Tuner

__all__ = ["InferenceServer", "serve"]


class InferenceServer(Server):
    # The parameters are the engine's: its documentation, under this class's own first line.
    __doc__ = ("A Triton-compatible server running inside this process, with :meth:`client` and :meth:`tune`.\n\n"
               + (Server.__doc__ or "").partition("\n\n")[2])

    def client(self) -> InProcessClient:
        """An in-process client with tritonclient-like calls."""
        from triton_nb.client import InProcessClient

        return InProcessClient(self)

    def tune(self, model: str, **options: Any) -> Tuner:
        """The tuning panel for ``model`` (a :class:`triton_nb.notebook.widgets.Tuner`), to display in
        a notebook: knobs to turn live, and buttons that measure and sweep. ``options`` are the
        panel's (``tuned_model=``, ``input_data=``, ...).

        Not to be confused with :func:`triton_nb.perf.tune`, the search itself (no widgets: it
        measures every candidate config and returns the ranking), which the panel's **Sweep**
        button runs."""
        from triton_nb.notebook.widgets import Tuner  # ipywidgets and matplotlib load only when asked

        return Tuner(self, model, **options)


def serve(
    model_repository: str | os.PathLike[str], settings: ServerSettings | None = None, **options: Any
) -> InferenceServer:
    """Start an in-process server on a model repository and return it, running.

    ``settings`` and ``options`` are :class:`InferenceServer`'s: a
    :class:`~triton_nb.ServerSettings`, and its fields as keywords (``cache_size_bytes=N``, for
    one, gives it Triton's response cache, which models with ``response_cache { enable: true }``
    use). The server runs on its own threads; the calling thread (a notebook cell) returns at once.
    Use it as a context manager, or call ``stop()``.
    """
    return InferenceServer(model_repository, settings, **options).start()
