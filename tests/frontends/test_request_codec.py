"""One request, read alike by both front ends: versions, reserved parameters, priority and timeout.

The HTTP application and the gRPC servicer are driven through their own entry points (an ASGI call,
``ModelInfer``) over a service double that keeps the :class:`InferRequest` each one hands on, so every
case asserts what reaches the server, and the same case runs over both protocols. What real Triton
answers to the same requests is in test_request_conformance.py. The last tests drive the steps of a
gRPC ``ModelStreamInfer`` call the same way.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from triton_nb.errors import InvalidArgumentError
from triton_nb.server.frontends.grpc.servicer import GrpcServicer
from triton_nb.server.frontends.http.app import HttpApp
from triton_nb.server.frontends.protocol import WireLimits
from triton_nb.server.frontends.request_codec import SERVER_PARAMETERS, parse_parameters, parse_version
from triton_nb.server.observability.logs import LogSettings
from triton_nb.tensors import InferRequest, InferResponse

PROTOCOLS = ("http", "grpc")
_CONFIG = SimpleNamespace(model_transaction_policy=SimpleNamespace(decoupled=False), max_batch_size=0)


class _Service:
    """The part of InferenceService the infer paths use; keeps every request it is given."""

    def __init__(self) -> None:
        self.requests: list[InferRequest] = []

    def input_config(self, name: str, version: int = -1) -> Any:
        return _CONFIG

    def output_labels(self, name: str, output: str, version: int = -1) -> None:
        return None

    def infer_async(self, request: InferRequest) -> Future[InferResponse]:
        self.requests.append(request)
        future: Future[InferResponse] = Future()
        future.set_result(InferResponse(request.model_name, 1, {"Y": np.zeros(1, np.float32)}, request.request_id))
        return future


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class _Context:
    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)


def _http(service: _Service, path: str, document: dict[str, Any] | None = None) -> tuple[int, str]:
    """(status, error message or "") of one request to the HTTP application."""
    app = HttpApp(service, WireLimits(), LogSettings())  # type: ignore[arg-type]
    body = b"" if document is None else json.dumps(document).encode()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET" if document is None else "POST", "path": path, "headers": []}
    asyncio.run(app(scope, receive, send))
    status, reply = sent[0]["status"], sent[1]["body"]
    return status, json.loads(reply).get("error", "") if status != 200 else ""


def _grpc_parameter(target: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    else:
        target.string_param = value


def _grpc(service: _Service, version: str, parameters: dict[str, Any]) -> tuple[str, str]:
    """(status code name, details or "") of one ModelInfer call to the servicer."""
    servicer = GrpcServicer(service, WireLimits(), LogSettings())  # type: ignore[arg-type]
    request = pb.ModelInferRequest(model_name="m", model_version=version, id="r-1")
    request.inputs.add(name="X", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    for key, value in parameters.items():
        _grpc_parameter(request.parameters[key], value)
    try:
        asyncio.run(servicer.ModelInfer(request, _Context()))
    except _Aborted as aborted:
        return aborted.code.name, str(aborted)
    return "OK", ""


def _infer(protocol: str, parameters: dict[str, Any], version: str = "") -> tuple[_Service, str, str]:
    """Send one infer request with ``parameters``: the service, and (status, message) as the
    protocol-neutral pair ("OK" / "INVALID_ARGUMENT" for both protocols)."""
    service = _Service()
    if protocol == "grpc":
        code, message = _grpc(service, version, parameters)
        return service, code, message
    path = f"/v2/models/m/versions/{version}/infer" if version else "/v2/models/m/infer"
    document = {"id": "r-1", "inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                "parameters": parameters}
    status, message = _http(service, path, document)
    return service, {200: "OK", 400: "INVALID_ARGUMENT"}.get(status, str(status)), message


# ----------------------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_server_takes_its_parameters_and_the_model_gets_the_rest(protocol):
    service, code, message = _infer(protocol, {
        "priority": 3, "timeout": 1500, "binary_data_output": False, "triton_enable_empty_final_response": True,
        "sequence_id": 7, "sequence_start": True, "sequence_end": False, "custom": "kept", "count": 2})
    assert (code, message) == ("OK", "")
    (request,) = service.requests
    assert (request.model_name, request.model_version, request.request_id) == ("m", -1, "r-1")
    assert (request.priority, request.timeout_microseconds) == (3, 1500)
    # the sequence parameters stay for the sequence batcher; the server's own never reach the model
    assert request.parameters == {"sequence_id": 7, "sequence_start": True, "sequence_end": False,
                                  "custom": "kept", "count": 2}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_without_parameters_gets_the_defaults(protocol):
    service, code, _ = _infer(protocol, {})
    assert code == "OK"
    (request,) = service.requests
    assert (request.priority, request.timeout_microseconds, request.parameters) == (0, 0, {})


REFUSED_PARAMETERS = {
    "priority-negative": ({"priority": -1}, "model 'm': request parameter 'priority' must be a whole number >= 0, "
                                            "got -1"),
    "priority-text": ({"priority": "high"}, "model 'm': request parameter 'priority' must be a whole number >= 0, "
                                            "got 'high'"),
    "priority-bool": ({"priority": True}, "model 'm': request parameter 'priority' must be a whole number >= 0, "
                                          "got True"),
    "timeout-negative": ({"timeout": -5}, "model 'm': request parameter 'timeout' must be a whole number >= 0, "
                                          "got -5"),
    "binary-data-output-number": ({"binary_data_output": 1},
                                  "model 'm': request parameter 'binary_data_output' must be true or false, got 1"),
    "empty-final-response-text": ({"triton_enable_empty_final_response": "yes"},
                                  "model 'm': request parameter 'triton_enable_empty_final_response' must be true "
                                  "or false, got 'yes'"),
    "triton-prefix": ({"triton_secret": 1},
                      "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                      "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"),
}


@pytest.mark.parametrize("case", list(REFUSED_PARAMETERS))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_server_parameters_are_refused_alike_on_both_protocols(protocol, case):
    parameters, expected = REFUSED_PARAMETERS[case]
    service, code, message = _infer(protocol, parameters)
    assert (code, message) == ("INVALID_ARGUMENT", expected)
    assert service.requests == []


# ------------------------------------------------------------------------------------------- versions


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_version_is_read_alike_on_both_protocols(protocol):
    service, code, _ = _infer(protocol, {}, version="0002")
    assert code == "OK"
    assert service.requests[0].model_version == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_version_past_int64_is_refused_alike_on_both_protocols(protocol):
    service, code, message = _infer(protocol, {}, version="99999999999999999999")
    assert (code, message) == ("INVALID_ARGUMENT", "failed to get model version from specified version string "
                               "'99999999999999999999' (details: stol), version should be an integral value > 0")
    assert service.requests == []


@pytest.mark.parametrize(("text", "expected"), [
    ("", None), ("1", 1), ("007", 7), (" 3", 3), ("+4", 4), ("5x", 5), ("0", 0), (str(2**63 - 1), 2**63 - 1)])
def test_versions_are_read_as_tritons_std_stol_reads_them(text, expected):
    assert parse_version(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("x", "failed to get model version from specified version string 'x' (details: stol), version should be an "
          "integral value > 0"),
    ("١", "failed to get model version from specified version string '١' (details: stol), version should be an "
          "integral value > 0"),  # an Arabic-Indic digit: str.isdigit, but not a digit to stol
    (str(2**63), f"failed to get model version from specified version string '{2**63}' (details: stol), version "
                 f"should be an integral value > 0"),
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
])
def test_versions_triton_refuses_are_refused_with_its_words(text, message):
    with pytest.raises(InvalidArgumentError) as caught:
        parse_version(text)
    assert str(caught.value) == message


def test_a_version_that_is_not_digits_is_no_http_route():
    # Triton's HTTP routes take [0-9]+ as a version, so anything else is a 404, not a parse error
    assert _http(_Service(), "/v2/models/m/versions/x") == (404, "Not Found")


def test_the_reserved_set_is_the_one_the_codec_strips():
    read = parse_parameters("m", [(key, True) for key in SERVER_PARAMETERS if key not in ("priority", "timeout")])
    assert read.model == {}
    assert read.binary_data_output and read.empty_final_response


# -------------------------------------------------------------------------------------------- streams


class _DecoupledService(_Service):
    """A decoupled model: two responses from another thread, then a bare final flag."""

    def input_config(self, name: str, version: int = -1) -> Any:
        return SimpleNamespace(model_transaction_policy=SimpleNamespace(decoupled=True), max_batch_size=0)

    def infer_async(self, request: InferRequest) -> Future[InferResponse]:
        self.requests.append(request)
        future: Future[InferResponse] = Future()

        def respond() -> None:
            for count in (1, 2):
                request.response_sender(InferResponse("m", 1, {"Y": np.full(1, count, np.float32)}, request.request_id),
                                        False)
            request.response_sender(None, True)
            future.set_result(InferResponse("m", 1, {}, request.request_id))

        threading.Thread(target=respond).start()
        return future


def _stream(service: _Service, requests: list[pb.ModelInferRequest]) -> list[pb.ModelStreamInferResponse]:
    servicer = GrpcServicer(service, WireLimits(), LogSettings())  # type: ignore[arg-type]

    async def sent() -> Any:
        for request in requests:
            yield request

    async def run() -> list[pb.ModelStreamInferResponse]:
        return [message async for message in servicer.ModelStreamInfer(sent(), _Context())]

    return asyncio.run(run())


def _stream_request(request_id: str, parameters: dict[str, Any]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id=request_id)
    request.inputs.add(name="X", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    for key, value in parameters.items():
        _grpc_parameter(request.parameters[key], value)
    return request


def test_a_stream_answers_every_request_and_carries_on_past_a_bad_one():
    messages = _stream(_Service(), [_stream_request("a", {}), _stream_request("b", {"priority": -1}),
                                    _stream_request("c", {})])
    answered = sorted((m.infer_response.id, m.error_message) for m in messages)
    assert answered == [("a", ""), ("b", "model 'm': request parameter 'priority' must be a whole number >= 0, got -1"),
                        ("c", "")]


def test_a_decoupled_stream_flags_its_final_response_only_when_asked():
    flagged = _stream(_DecoupledService(), [_stream_request("a", {"triton_enable_empty_final_response": True})])
    assert [(m.infer_response.id, m.infer_response.parameters["triton_final_response"].bool_param,
             len(m.infer_response.outputs)) for m in flagged] == [("a", False, 1), ("a", False, 1), ("a", True, 0)]
    plain = _stream(_DecoupledService(), [_stream_request("a", {})])
    assert [("triton_final_response" in m.infer_response.parameters, len(m.infer_response.outputs))
            for m in plain] == [(False, 1), (False, 1)]
