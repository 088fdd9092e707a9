"""The bridge between the Python backend and pb_utils: everything the server side does with the
objects a model sees, and nothing a model imports.

:mod:`triton_nb.backends.pb_utils` is the model's module (``triton_python_backend_utils``); it
holds Triton's public surface only. :class:`~triton_nb.backends.python.PythonBackend` (in this
process, or in a model's own process under :mod:`triton_nb.backends._python_stub`) drives a model
through this interface:

=============================  ===================================================================
call                           who calls it, on which thread
=============================  ===================================================================
:class:`CallContext`           the backend, once per instance (and per ``auto_complete_config``)
:func:`register_owner`         the backend, for each module of the model's code: at load, on the
                               loading thread, and whenever the model imports more of its own
                               modules (the import scope's callback, on the importing thread)
:func:`unregister_owner`       the backend, for the same modules, when the instance unloads
:func:`calling`                around every call into model code, on the thread making it: the
                               instance's worker (``initialize``, ``execute``, ``finalize``) or the
                               instance's event-loop thread (``async def execute``)
:func:`served_request`         per request of a batch, on the worker thread, before ``execute``;
                               a decoupled model's request gets its ``forward`` here (a
                               :data:`Forward`), which its response sender calls from whichever
                               thread the model sends on
:func:`server_response`        converts one model response to the server's (worker thread, or the
                               sending thread for a decoupled model's responses)
:func:`server_responses`       converts what ``execute`` returned for a batch (worker thread)
:func:`close_senders`          closes the senders a failed batch's model opened (worker thread)
:func:`close_open_requests`    closes every request of a failed background batch still open and
                               says which (the thread that saw the failure)
:func:`error_class`            the triton_nb error a :class:`TritonError` code becomes
=============================  ===================================================================

pb_utils reads the calling instance from :mod:`triton_nb.backends._pb_context`, where the
context variable and the owner registry live; nothing in pb_utils is replaced at run time.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from triton_nb.backends._pb_context import CallContext, calling, register_owner, unregister_owner
from triton_nb.backends._pb_errors import ErrorCode
from triton_nb.backends._pb_inference import Forward, InferenceRequest, InferenceResponse
from triton_nb.errors import (
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    RequestCancelledError,
    TritonNBError,
    UnavailableError,
)
from triton_nb.tensors import InferRequest, InferResponse

__all__ = [
    "CallContext",
    "Forward",
    "calling",
    "close_open_requests",
    "close_senders",
    "error_class",
    "register_owner",
    "served_request",
    "server_response",
    "server_responses",
    "unregister_owner",
]

# TritonError codes -> triton_nb's error classes (the server maps those onto HTTP/gRPC).
_CODE_TO_ERROR: dict[int, type[TritonNBError]] = {
    ErrorCode.INVALID_ARG: InvalidArgumentError,
    ErrorCode.NOT_FOUND: NotFoundError,
    ErrorCode.UNAVAILABLE: UnavailableError,
    ErrorCode.CANCELLED: RequestCancelledError,
}


def error_class(code: int) -> type[TritonNBError]:
    """The triton_nb error a response's ``TritonError`` of ``code`` becomes (internal if unmapped)."""
    return _CODE_TO_ERROR.get(code, InternalError)


#: ``served_request(request, *, decoupled, output_names, forward=None)``: the server's request as
#: the ``pb_utils.InferenceRequest`` that ``execute()`` receives (inputs not copied).
served_request = InferenceRequest._from_server


def server_response(request: InferRequest, response: InferenceResponse, model_name: str,
                    model_version: int) -> InferResponse:
    """A pb_utils response as the server's InferResponse (BYTES as object arrays of bytes)."""
    # (the response's fields read directly: this runs for every request)
    out = InferResponse(model_name=model_name, model_version=model_version, request_id=request.request_id)
    parameters = response._parameters
    if parameters != "{}":  # most responses have none: skip the JSON round trip
        with contextlib.suppress(ValueError, TypeError):
            out.parameters = json.loads(parameters)
    error = response._error
    if error is not None:
        # the model's own words reach the client unchanged, as in Triton
        out.error = error_class(error.code())(error.message())
        return out
    wanted = request.requested_outputs
    out.outputs = {tensor._name: tensor._server_array() for tensor in response._tensors
                   if wanted is None or tensor._name in wanted}
    return out


def server_responses(requests: list[InferRequest], wrapped: list[InferenceRequest], result: Any,
                     model_name: str, model_version: int) -> list[InferResponse]:
    """What a default-mode model's ``execute()`` returned (or sent) for ``requests``, as the
    server's responses; a result that breaks Triton's rules raises InternalError."""
    count = len(requests)
    if result is None:
        result = [None] * count
    elif not isinstance(result, list):
        raise InternalError(
            f"model '{model_name}': execute() must return a list of pb_utils.InferenceResponse, "
            f"got {type(result).__name__}"
        )
    if len(result) != count:
        raise InternalError(
            f"model '{model_name}': execute() returned {len(result)} response(s) for {count} request(s); "
            "it must return exactly one InferenceResponse per request"
        )
    responses = []
    for index, (request, pb_request, item) in enumerate(zip(requests, wrapped, result, strict=True)):
        sent = pb_request._sender._response if pb_request._sender is not None else None
        if item is None:
            if sent is None:
                raise InternalError(
                    f"model '{model_name}': execute() gave no response for request {index} (None in the list and "
                    "nothing sent through its response sender)"
                )
            item = sent
        elif not isinstance(item, InferenceResponse):
            raise InternalError(
                f"model '{model_name}': execute() returned a {type(item).__name__} for request {index}; expected "
                "a pb_utils.InferenceResponse"
            )
        elif sent is not None:
            raise InternalError(
                f"model '{model_name}': request {index} got two responses (one returned, one sent); a model in "
                "the default mode answers each request once"
            )
        responses.append(server_response(request, item, model_name, model_version))
    return responses


def close_senders(wrapped: list[InferenceRequest]) -> None:
    """Close the response senders the model got for ``wrapped`` (its batch failed)."""
    for request in wrapped:
        if request._sender is not None:
            request._sender._close()


def close_open_requests(wrapped: list[InferenceRequest]) -> list[InferRequest]:
    """Close every request of ``wrapped`` (sender or not); the server's requests of those that
    were still open, which the caller finishes with an error."""
    still_open = []
    for request in wrapped:
        if request.get_response_sender()._close() and request._server_request is not None:
            still_open.append(request._server_request)
    return still_open
