"""``triton_nb.widgets.Tuner``: the tuning panel (ipywidgets), see :mod:`triton_nb.notebook.widgets`."""

from triton_nb.notebook.widgets import Tuner

__all__ = ["Tuner"]
