"""What both front ends read the same way from an inference request, whatever its wire format:
the model version, the request parameters the server itself acts on, and the
:class:`~triton_nb.tensors.InferRequest` they end in.

The HTTP front end hands over JSON values, the gRPC front end the values of its ``InferParameter``
oneofs; from there on one function reads them, so the two protocols accept, refuse and word their
errors alike. The rules follow Triton's (v2.51) ``src/common.cc`` (``GetModelVersionFromString``),
``src/http_server.cc`` (``HTTPAPIServer::ParseJsonTritonParams``) and ``src/grpc/infer_handler.cc``
(``SetInferenceRequestMetadata``); where those two front ends of Triton differ only because their wire
types differ, one rule covers both here:

* ``priority`` and ``timeout`` (microseconds) are whole numbers >= 0 (Triton: JSON unsigned integers,
  gRPC ``int64_param``/``uint64_param``); ``binary_data_output`` (an HTTP option, read on both so the
  reserved set is one) and ``triton_enable_empty_final_response`` (streaming) are true or false. None of
  them reaches the model.
* Other keys starting with ``triton_`` are refused, as Triton refuses them.
* ``sequence_id``, ``sequence_start`` and ``sequence_end`` are reserved as well, but they stay in
  :attr:`InferRequest.parameters`: the sequence batcher reads them there (the in-process client puts
  them there too), and the Python backend keeps them from the model's ``request.parameters()``.

The request path is hot, so a request without parameters costs one empty dict, and one with
parameters one pass over them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from triton_nb.errors import InvalidArgumentError
from triton_nb.tensors import InferRequest

__all__ = [
    "ALLOWED_TRITON_PARAMETERS",
    "SERVER_PARAMETERS",
    "RequestParameters",
    "infer_request",
    "parse_parameters",
    "parse_version",
]

#: The ``triton_``-prefixed request parameters Triton accepts (``TRITON_RESERVED_REQUEST_PARAMS``).
ALLOWED_TRITON_PARAMETERS = ("triton_enable_empty_final_response",)
#: Request parameters the front ends act on; they never reach the model.
SERVER_PARAMETERS = frozenset(("priority", "timeout", "binary_data_output", *ALLOWED_TRITON_PARAMETERS))

_INT64_MAX = 2**63 - 1
# std::stol, which Triton parses versions with: leading blanks, a sign, then digits up to the first
# other character ("2x" is version 2)
_STOL = re.compile(r"\s*[+-]?[0-9]+", re.ASCII)
_TRITON_PREFIX_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
    "with 'triton_' are allowed: " + " ".join(ALLOWED_TRITON_PARAMETERS))


def parse_version(text: str) -> int | None:
    """A model version as the wire spells it: ``""`` is None (the version policy decides).

    Parameters
    ----------
    text
        The version string of a URL path segment or a gRPC ``model_version``/``version`` field.

    Returns
    -------
    int or None
        The version number, or None for an empty string (the Python API's "latest").
    """
    if not text:
        return None
    if len(text) < 19 and text.isascii() and text.isdigit():  # the usual case; below 2**63 by its length
        return int(text)
    match = _STOL.match(text)
    number = int(match.group()) if match else None
    if number is None or not -_INT64_MAX - 1 <= number <= _INT64_MAX:
        raise InvalidArgumentError(f"failed to get model version from specified version string '{text}' "
                                   f"(details: stol), version should be an integral value > 0")
    if number < 0:
        raise InvalidArgumentError(f"invalid model version specified '{text}' , version should be an integral "
                                   f"value > 0")
    return number


class RequestParameters(NamedTuple):
    """A request's parameters, read: what reaches the model, and what the server acts on."""

    model: dict[str, Any]
    priority: int = 0
    timeout_microseconds: int = 0
    binary_data_output: bool = False
    empty_final_response: bool = False


def _whole_number(model: str, key: str, value: Any) -> int:
    if type(value) is not int or value < 0:  # bool is not a number here, as in JSON and protobuf
        raise InvalidArgumentError(f"model '{model}': request parameter '{key}' must be a whole number >= 0, "
                                   f"got {value!r}")
    return value


def _flag(model: str, key: str, value: Any) -> bool:
    if type(value) is not bool:
        raise InvalidArgumentError(f"model '{model}': request parameter '{key}' must be true or false, got {value!r}")
    return value


def parse_parameters(model: str, parameters: Iterable[tuple[str, Any]]) -> RequestParameters:
    """Read a request's parameters once, in one pass.

    Parameters
    ----------
    model
        The model's name, for the error messages.
    parameters
        ``(key, value)`` pairs: a JSON object's items, or a gRPC parameter map's keys with the
        values of their oneofs.

    Returns
    -------
    RequestParameters
        The parameters for the model (a new dict) and the server's own settings.
    """
    kept: dict[str, Any] = {}
    priority = timeout = 0
    binary = empty_final = False
    for key, value in parameters:
        if key not in SERVER_PARAMETERS:
            if key.startswith("triton_"):
                raise InvalidArgumentError(_TRITON_PREFIX_MESSAGE)
            kept[key] = value
        elif key == "priority":
            priority = _whole_number(model, key, value)
        elif key == "timeout":
            timeout = _whole_number(model, key, value)
        elif key == "binary_data_output":
            binary = _flag(model, key, value)
        else:
            empty_final = _flag(model, key, value)
    return RequestParameters(kept, priority, timeout, binary, empty_final)


def infer_request(model: str, version: int | None, inputs: dict[str, np.ndarray], requested_outputs: list[str] | None,
                  request_id: Any, parameters: RequestParameters) -> InferRequest:
    """The :class:`InferRequest` of a decoded wire request.

    Parameters
    ----------
    model, version
        The model as the request names it (version None: the version policy decides).
    inputs
        The decoded input tensors by name.
    requested_outputs
        The outputs the request names; None or empty for all of them.
    request_id
        The request's ``id`` (checked to be a string: JSON may carry anything).
    parameters
        What :func:`parse_parameters` read.

    Returns
    -------
    InferRequest
        The request, ready for :meth:`InferenceService.infer_async`.
    """
    if type(request_id) is not str:
        raise InvalidArgumentError(f"model '{model}': request 'id' must be a string")
    return InferRequest(
        model_name=model, inputs=inputs, model_version=-1 if version is None else version,
        requested_outputs=requested_outputs or None,
        request_id=request_id, priority=parameters.priority, timeout_microseconds=parameters.timeout_microseconds,
        parameters=parameters.model,
    )
