"""tritonserver's ``--backend-config``, read the way the backends here read it.

A setting is ``BACKEND,KEY=VALUE`` (for one backend) or ``KEY=VALUE`` (for every backend, as
Triton's core passes ``default-max-batch-size``). Triton hands each backend the settings named for
it and a backend reads the keys it knows; here the Python backend's process instances read three
of its keys (:class:`PythonBackendOptions`), and every other setting is kept with the reason it
has no effect here, which ``triton-nb serve`` prints in one line at start (:attr:`BackendConfig.inert`).

Standard library only: a Python model's own process imports it (with :mod:`triton_nb.backends.base`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from triton_nb.errors import InvalidArgumentError

__all__ = ["BackendConfig", "PythonBackendOptions", "parse_backend_config"]

_MiB = 1024 * 1024

# The Python backend's keys (python_backend's src/python_be.cc) that mean nothing here, and why.
_PYTHON_INERT = {
    "shm-growth-byte-size": "a process instance's arena grows to the next power of two that holds the batch",
    # python_be.cc spells this one with underscores
    "shm_message_queue_size": "messages to a model's process travel on a socket, not a shared-memory queue",
    "thread-pool-size": "a model's process answers its requests on the instance's own thread",
}
# Backends served here that read no command-line settings.
_SERVED = ("fil", "onnxruntime")


@dataclass(frozen=True)
class PythonBackendOptions:
    """What the Python backend's ``--backend-config`` settings set for process instances
    (``python_instances="process"``, or a model with ``EXECUTION_ENV_PATH``); thread instances
    share this process's memory and read none of them."""

    #: ``shm-default-byte-size``: the first size of each side's shared-memory arena (Triton's
    #: default and least: 1 MiB); an arena grows when a batch does not fit.
    shm_default_byte_size: int = _MiB
    #: ``shm-region-prefix-name``: how the arenas' file names in /dev/shm begin, so that servers
    #: sharing a machine can be told apart (Triton: ``triton_python_backend_shm_region_``).
    shm_region_prefix_name: str = "triton_nb_"
    #: ``stub-timeout-seconds``: how long a model's process may take to start and initialize its
    #: model; None keeps triton_nb's own (``STUB_START_TIMEOUT_S``, longer than Triton's 30 s,
    #: since initialize may load a large model).
    stub_timeout_seconds: float | None = None


@dataclass(frozen=True)
class BackendConfig:
    """Parsed ``--backend-config`` settings."""

    python: PythonBackendOptions = field(default_factory=PythonBackendOptions)
    #: ``(setting as given, why it has no effect here)``, in the order given
    inert: tuple[tuple[str, str], ...] = ()


def _split(spec: str) -> tuple[str, str, str]:
    """``(backend or "", key, value)`` of one setting, in tritonserver's format."""
    if not isinstance(spec, str):
        raise InvalidArgumentError(f"--backend-config must be <backend>,<setting>=<value>, got {spec!r}")
    comma = spec.find(",")
    equals = spec.find("=", comma + 1)
    if equals < 0:
        raise InvalidArgumentError(f"--backend-config must be <backend>,<setting>=<value> (or <setting>=<value> for "
                                   f"every backend), got {spec!r}")
    if comma == 0:
        raise InvalidArgumentError(f"--backend-config names no backend before ',': {spec!r}")
    backend = spec[:comma] if comma > 0 else ""
    return backend, spec[comma + 1:equals], spec[equals + 1:]


def _whole(spec: str, key: str, value: str, least: int, unit: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgumentError(f"--backend-config {spec!r}: {key} must be a whole number, got {value!r}") from None
    if number < least:
        raise InvalidArgumentError(f"--backend-config {spec!r}: {key} must be >= {least}{unit}, got {number}")
    return number


def parse_backend_config(specs: Iterable[str]) -> BackendConfig:
    """The settings of ``--backend-config`` flags (the last of a repeated key wins, as in Triton);
    a malformed setting, or a bad value of a key that works here, is an InvalidArgumentError
    naming it."""
    python: dict[str, object] = {}
    inert: list[tuple[str, str]] = []
    for spec in specs:
        backend, key, value = _split(spec)
        if backend == "python" and key == "shm-default-byte-size":
            python["shm_default_byte_size"] = _whole(spec, key, value, _MiB, " (1 MiB)")
        elif backend == "python" and key == "stub-timeout-seconds":
            python["stub_timeout_seconds"] = float(_whole(spec, key, value, 1, " s"))
        elif backend == "python" and key == "shm-region-prefix-name":
            # the prefix starts file names in /dev/shm: one path component of plain characters
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
                raise InvalidArgumentError(f"--backend-config {spec!r}: shm-region-prefix-name must be letters, "
                                           f"digits, '_', '.' or '-', got {value!r}")
            python["shm_region_prefix_name"] = value
        elif backend == "python":
            inert.append((spec, _PYTHON_INERT.get(key, f"the Python backend reads no setting {key!r}")))
        elif not backend and key == "default-max-batch-size":
            inert.append((spec, "no backend here completes a config's max_batch_size from its model file"))
        elif not backend:
            inert.append((spec, f"no backend here reads a global setting {key!r}"))
        elif backend in _SERVED:
            inert.append((spec, f"triton_nb's {backend} backend reads no --backend-config settings"))
        else:
            inert.append((spec, f"there is no {backend} backend here"))
    return BackendConfig(PythonBackendOptions(**python), tuple(inert))  # type: ignore[arg-type]
