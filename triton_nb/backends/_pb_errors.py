"""pb_utils' errors: :class:`TritonModelException`, :class:`TritonError` and its codes.

Part of the surface :mod:`triton_nb.backends.pb_utils` exposes (models import these from there).
Also here: how a failed BLS call becomes the :class:`TritonError` of the response the model gets.
"""

from __future__ import annotations

import enum

__all__ = ["ErrorCode", "TritonError", "TritonModelException", "triton_error_from_exception"]


class TritonModelException(Exception):
    """The exception model code raises (and Triton raises into model code) on failure."""

    def message(self) -> str:
        return str(self)


class ErrorCode(enum.IntEnum):
    """``TRITONSERVER_Error_Code``, in Triton's order (``TritonError.NOT_FOUND`` and the others)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """The error of one response: ``TritonError("message", TritonError.NOT_FOUND)``.

    Like Triton's, this is a value carried by an ``InferenceResponse``, not an exception
    (raise :class:`TritonModelException` to fail a whole batch).
    """

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        if message is None:
            raise TypeError("TritonError: message must be a string, not None")
        try:
            self._code = ErrorCode(int(code))
        except (TypeError, ValueError):
            raise TypeError(f"TritonError: unknown error code {code!r}") from None
        self._message = str(message)

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, TritonError.{self._code.name})"


# The gRPC status names triton_nb's errors carry (TritonNBError.grpc_code) -> Triton's codes.
_GRPC_TO_CODE = {
    "INVALID_ARGUMENT": ErrorCode.INVALID_ARG,
    "NOT_FOUND": ErrorCode.NOT_FOUND,
    "UNAVAILABLE": ErrorCode.UNAVAILABLE,
    "UNIMPLEMENTED": ErrorCode.UNSUPPORTED,
    "ALREADY_EXISTS": ErrorCode.ALREADY_EXISTS,
    "CANCELLED": ErrorCode.CANCELLED,
    "INTERNAL": ErrorCode.INTERNAL,
}


def triton_error_from_exception(exc: BaseException) -> TritonError:
    """The error of a BLS response whose call failed with ``exc`` (the server's words, its code)."""
    code = _GRPC_TO_CODE.get(getattr(exc, "grpc_code", ""), ErrorCode.INTERNAL)
    if isinstance(exc, TimeoutError):
        code = ErrorCode.UNAVAILABLE
    return TritonError(str(exc) or type(exc).__name__, code)
