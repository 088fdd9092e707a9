"""Load the example's ``label_encoders.pkl`` without executing arbitrary code.

The pickle is part of a model repository, and a repository is data: anybody who can drop a
file into it must not be able to run code in the server by doing so. A plain ``pickle.load``
would import and call whatever the file names. :class:`LabelEncoderUnpickler` allows only the
handful of numpy callables needed to rebuild arrays of strings, and :func:`load_label_encoders`
then checks the shape of what came out: a ``dict`` from column name to a 1-D array of strings.

This module depends on the standard library and numpy only, so the preprocessing ``model.py``
that runs inside real Triton's Python backend can use it without pulling in the rest of
triton_nb.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import numpy as np

__all__ = ["LabelEncoderUnpickler", "load_label_encoders", "loads_label_encoders"]

# (module, name) pairs an array of strings may need, across numpy 1.x (numpy.core) and
# numpy 2.x (numpy._core) and pickle protocols 2-5. Nothing here can run user code.
_ALLOWED_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }
)


class LabelEncoderUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the numpy globals needed for arrays of strings."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(
                f"refusing to load '{module}.{name}': a label-encoder pickle may hold only a dict "
                "of numpy string arrays"
            )
        return super().find_class(module, name)


def _check_encoders(loaded: Any, source: str) -> dict[str, np.ndarray]:
    if not isinstance(loaded, dict):
        raise ValueError(
            f"{source}: expected a dict from column name to an array of class strings, "
            f"got {type(loaded).__name__}"
        )
    checked: dict[str, np.ndarray] = {}
    for column, classes in loaded.items():
        if not isinstance(column, str):
            raise ValueError(f"{source}: column names must be strings, got {column!r}")
        array = np.asarray(classes)
        if array.ndim != 1:
            raise ValueError(f"{source}: classes of column '{column}' must be 1-D, got shape {array.shape}")
        if array.dtype.kind == "O":
            bad = [value for value in array.tolist() if not isinstance(value, str)]
            if bad:
                raise ValueError(
                    f"{source}: classes of column '{column}' must be strings, found {bad[0]!r}"
                )
            array = array.astype(str) if array.size else np.array([], dtype="U1")
        elif array.dtype.kind != "U":
            raise ValueError(
                f"{source}: classes of column '{column}' must be strings, got dtype {array.dtype}"
            )
        checked[column] = array
    return checked


def loads_label_encoders(data: bytes, source: str = "label_encoders.pkl") -> dict[str, np.ndarray]:
    """Decode pickle bytes into ``{column: array of class strings}``, refusing anything else."""
    try:
        loaded = LabelEncoderUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{source}: {exc}") from None
    except Exception as exc:  # truncated or garbled files raise all sorts of errors
        raise ValueError(f"{source}: not a readable label-encoder pickle ({type(exc).__name__}: {exc})") from None
    return _check_encoders(loaded, source)


def load_label_encoders(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read a ``label_encoders.pkl`` file with :class:`LabelEncoderUnpickler`."""
    with open(path, "rb") as handle:
        return loads_label_encoders(handle.read(), source=os.fspath(path))
