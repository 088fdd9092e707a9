"""Deprecated path of the tuning panel: import :class:`Tuner` from :mod:`triton_nb.notebook.widgets`
(the one module of the notebook's widgets, beside its magics), or open it with ``server.tune(model)``.

``triton_nb.widgets.Tuner`` still works for a release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triton_nb.notebook.widgets import Tuner

__all__ = ["Tuner"]


def __getattr__(name: str) -> Any:
    # Warned on use, not on import, so that the warning points at the line that reaches for it
    if name == "Tuner":
        from triton_nb._deprecation import warn_deprecated
        from triton_nb.notebook.widgets import Tuner

        warn_deprecated("triton_nb.widgets is deprecated: import Tuner from triton_nb.notebook.widgets "
                        "(or use server.tune(model))", stacklevel=3)
        return Tuner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
