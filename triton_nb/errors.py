"""One error hierarchy for the whole package.

Every error triton_nb raises on purpose derives from :class:`TritonNBError`. Each class carries
the status it maps to on the wire, so the protocol front ends translate errors in one place
instead of guessing from messages: ``http_status`` for KServe v2 over HTTP and ``grpc_code``
(the name of a ``grpc.StatusCode`` member) for gRPC.

The classes also derive from the closest built-in exception (``ValueError``, ``KeyError``...)
so code written against plain Python conventions keeps working.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "ForbiddenError",
    "InternalError",
    "InvalidArgumentError",
    "MethodNotAllowedError",
    "MissingDependencyError",
    "ModelLoadFailedError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RequestCancelledError",
    "TritonNBError",
    "UnavailableError",
    "UnsafeFileError",
    "UnsupportedEncodingError",
    "wire_message",
    "wire_status",
]


class TritonNBError(Exception):
    """Base class of every error triton_nb raises on purpose."""

    http_status: int = 500
    grpc_code: str = "INTERNAL"


class InvalidArgumentError(TritonNBError, ValueError):
    """The caller sent something malformed: a bad column, tensor, field or value."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class NotFoundError(TritonNBError, LookupError):
    """A model, version, file or column that does not exist."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class UnavailableError(TritonNBError):
    """The thing exists but cannot serve now (loading, unloaded, queue full, stopping)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class AlreadyExistsError(TritonNBError):
    """Something that must be unique is there already (a repository registered twice, a model name
    two repositories would both serve)."""

    http_status = 409
    grpc_code = "ALREADY_EXISTS"


class ForbiddenError(TritonNBError, PermissionError):
    """A request to an API the server restricts, without the header that opens it."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"


class PayloadTooLargeError(InvalidArgumentError):
    """A request body or message over the configured size limit."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class UnsupportedEncodingError(InvalidArgumentError):
    """A ``Content-Encoding`` the server cannot decode."""

    http_status = 501  # Triton's answer; gRPC negotiates its compression itself, so this never reaches it


class MethodNotAllowedError(TritonNBError):
    """An HTTP method a route does not serve (``GET`` on ``/infer``)."""

    http_status = 405
    grpc_code = "UNIMPLEMENTED"


class RequestCancelledError(TritonNBError):
    """The request was cancelled (a model answered ``TritonError.CANCELLED``); Triton's HTTP
    front end answers it with 400, gRPC with CANCELLED."""

    http_status = 400
    grpc_code = "CANCELLED"


class InternalError(TritonNBError, RuntimeError):
    """A bug or an unexpected failure inside triton_nb or a model."""


class ModelLoadFailedError(InternalError):
    """Models failed to load at start with ``exit_on_error`` (tritonserver's ``--exit-on-error``),
    which ends the start; the message names each model and why, and ``repository_index`` holds
    every model's state as the start ended (the server's repository index)."""

    def __init__(self, message: str, repository_index: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.repository_index = list(repository_index or ())


class UnsafeFileError(InvalidArgumentError):
    """A file that would make us execute or trust untrusted content (for example a pickle
    carrying objects other than the expected label-encoder arrays)."""


class MissingDependencyError(TritonNBError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the optional package '{module}', which is not installed. "
            f"Install it with: pip install 'triton-nb[{extra}]'"
        )
        self.module = module
        self.extra = extra


def wire_status(error: BaseException) -> tuple[int, str]:
    """``(http_status, grpc_code)`` for any exception: ours carry theirs; anything else is a
    bug or a model's own failure, answered as an internal error. The one place both front ends
    map errors, so HTTP and gRPC always agree."""
    if isinstance(error, TritonNBError):
        return error.http_status, error.grpc_code
    return InternalError.http_status, InternalError.grpc_code


def wire_message(error: BaseException) -> str:
    """The message a client reads for ``error``: ours as written; anything else prefixed with its
    class, since a bare ``KeyError`` message (a quoted key) would not say what went wrong."""
    return str(error) if isinstance(error, TritonNBError) else f"{type(error).__name__}: {error}"
