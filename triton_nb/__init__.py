"""triton_nb: train, export and serve tabular models the way NVIDIA Triton does, from a notebook.

The public API is what ``__all__`` lists; everything else is private implementation.
"""

from triton_nb import errors, fraud
from triton_nb._version import __version__
from triton_nb.client import InferResult, InProcessClient
from triton_nb.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    MissingDependencyError,
    ModelLoadFailedError,
    NotFoundError,
    TritonNBError,
    UnavailableError,
    UnsafeFileError,
)
from triton_nb.server.settings import ServerSettings
from triton_nb.serving import InferenceServer, serve


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext triton_nb``: registers the ``%triton``, ``%%triton_infer`` and ``%triton_perf`` magics."""
    from triton_nb.notebook.magics import load_ipython_extension as load

    load(ipython)


# Subpackages imported on first use (``triton_nb.perf`` loads pandas and the measuring tools only then)
_LAZY_SUBMODULES = ("notebook", "perf", "repository", "transport")


def __getattr__(name: str) -> object:
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"triton_nb.{name}")
    if name == "show_versions":  # loaded when asked for: reads every dependency's metadata
        from triton_nb._versions import show_versions

        return show_versions
    raise AttributeError(f"module 'triton_nb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES) | {"show_versions"})


__all__ = [
    "AlreadyExistsError",
    "InProcessClient",
    "InferResult",
    "InferenceServer",
    "InvalidArgumentError",
    "MissingDependencyError",
    "ModelLoadFailedError",
    "NotFoundError",
    "ServerSettings",
    "TritonNBError",
    "UnavailableError",
    "UnsafeFileError",
    "__version__",
    "errors",
    "fraud",
    "perf",
    "repository",
    "serve",
    "show_versions",
]
