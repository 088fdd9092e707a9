"""Old spellings kept working for a release, each with a ``DeprecationWarning`` naming the new one.

One place for the wording, so every renamed parameter says the same thing the same way, and for
the one meaning of "the latest version" across the Python API: ``None``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, MutableMapping
from typing import Any

from triton_nb.errors import InvalidArgumentError

__all__ = ["no_unknown", "renamed", "version_or_latest", "warn_deprecated"]


def warn_deprecated(message: str, *, stacklevel: int = 3) -> None:
    """Warn once per call site; ``stacklevel`` 3 points at the caller of the public function
    that calls this."""
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)


def renamed(where: str, options: MutableMapping[str, Any], old: str, new: str, value: Any, default: Any,
            *, stacklevel: int = 4) -> Any:
    """The value of ``new``, taking the deprecated keyword ``old`` out of ``options`` when given
    (with a warning naming ``new``); both given is an error naming both."""
    if old not in options:
        return value
    old_value = options.pop(old)
    if value is not default and value != default:
        raise InvalidArgumentError(f"{where}: give {new} only ({old} is its deprecated spelling)")
    warn_deprecated(f"{where}: {old}= is deprecated, use {new}=", stacklevel=stacklevel)
    return old_value


def no_unknown(where: str, options: Mapping[str, Any]) -> None:
    """What is left of ``**options`` after the deprecated keywords: a misspelling, named."""
    if options:
        raise TypeError(f"{where}() got unexpected keyword argument(s) {', '.join(map(repr, options))}")


def version_or_latest(version: Any, *, parameter: str = "version", stacklevel: int = 4) -> int | None:
    """A model version as the public API spells it: a number, or None for the latest (the one the
    version policy serves). The older spellings of "latest", -1 and "" (Triton's wire form), are
    accepted with a warning; a number written as text ("2", as tritonclient takes it) is that
    number."""
    if version is None:
        return None
    if isinstance(version, bool):
        raise InvalidArgumentError(f"{parameter} must be a version number or None, got {version!r}")
    if version == -1 or version == "":
        warn_deprecated(f"{parameter}={version!r} for the latest version is deprecated: use {parameter}=None",
                        stacklevel=stacklevel)
        return None
    try:
        number = int(version)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{parameter} must be a version number or None, got {version!r}") from None
    if number < 0 or (isinstance(version, float) and version != number):
        raise InvalidArgumentError(f"{parameter} must be a version number or None, got {version!r}")
    return number
