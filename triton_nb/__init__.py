"""triton_nb: train, export and serve tabular models the way NVIDIA Triton does, from a notebook.

The public API is what ``__all__`` lists; everything else is private implementation.
"""

from triton_nb import errors, fraud
from triton_nb._version import __version__
from triton_nb.client import InferResult, InProcessClient
from triton_nb.errors import (
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


__all__ = [
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
    "serve",
]
