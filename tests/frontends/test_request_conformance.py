"""Versions and request parameters over HTTP and gRPC, against triton_nb and real Triton 2.51.

Both front ends of triton_nb read these with one codec (:mod:`triton_nb.server.frontends.request_codec`); these
tests hold it to Triton's answers. Where Triton's two front ends word one rule differently (their wire
types differ), triton_nb words it one way, and the table below says what each server answers.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.helpers.conformance_helpers import raw_http

PROTOCOLS = ("http", "grpc")
HUGE = "99999999999999999999"  # digits, so an HTTP route; past int64, so no version
HUGE_VERSION = (f"failed to get model version from specified version string '{HUGE}' (details: stol), version "
                f"should be an integral value > 0")
TRITON_PREFIX = "parameter keys starting with 'triton_' are reserved for Triton usage"


@pytest.fixture(scope="module")
def stub(endpoint):
    """A bare gRPC stub: tritonclient refuses reserved parameters before they are sent."""
    channel = grpc.insecure_channel(endpoint.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _http(endpoint, method: str, path: str, document: dict[str, Any] | None = None) -> tuple[str, str]:
    """(status, error message or "") of one raw HTTP request."""
    body = None if document is None else json.dumps(document).encode()
    status, data = raw_http(endpoint, method, path, body, {"Content-Type": "application/json"} if body else None)
    return str(status), json.loads(data).get("error", "") if status != 200 else ""


def _grpc(call: Any, request: Any) -> tuple[str, str]:
    try:
        call(request, timeout=30)
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""
    return "OK", ""


def _infer_document(parameters: dict[str, Any]) -> dict[str, Any]:
    tensor = {"shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
    return {"inputs": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}], "parameters": parameters}


def _infer_message(version: str, parameters: dict[str, Any]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="add_sub", model_version=version)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([1, 2, 3, 4])
    for key, value in parameters.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        else:
            request.parameters[key].int64_param = value
    return request


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_version_past_int64_is_an_invalid_argument_for_metadata_and_inference(endpoint, stub, protocol):
    if protocol == "http":
        observed = {"metadata": _http(endpoint, "GET", f"/v2/models/add_sub/versions/{HUGE}"),
                    "infer": _http(endpoint, "POST", f"/v2/models/add_sub/versions/{HUGE}/infer", _infer_document({}))}
        invalid = "400"
    else:
        observed = {"metadata": _grpc(stub.ModelMetadata, pb.ModelMetadataRequest(name="add_sub", version=HUGE)),
                    "infer": _grpc(stub.ModelInfer, _infer_message(HUGE, {}))}
        invalid = "INVALID_ARGUMENT"
    assert observed == {"metadata": (invalid, HUGE_VERSION), "infer": (invalid, HUGE_VERSION)}


@pytest.mark.parametrize(("version", "message"), [
    ("x", "failed to get model version from specified version string 'x' (details: stol), version should be an "
          "integral value > 0"),
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
])
def test_grpc_versions_that_are_not_versions(stub, version, message):
    # over HTTP such a version is no route (404), so only gRPC has these cases
    observed = [_grpc(stub.ModelMetadata, pb.ModelMetadataRequest(name="add_sub", version=version)),
                _grpc(stub.ModelInfer, _infer_message(version, {}))]
    assert observed == [("INVALID_ARGUMENT", message)] * 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_triton_prefixed_parameters_are_refused(endpoint, stub, protocol):
    # Triton's HTTP front end goes on "and should not be specified.", its gRPC one lists the keys it
    # allows; triton_nb allows the same key on both, so it words both as gRPC does
    if protocol == "http":
        status, message = _http(endpoint, "POST", "/v2/models/add_sub/infer", _infer_document({"triton_secret": 1}))
        assert status == "400"
    else:
        status, message = _grpc(stub.ModelInfer, _infer_message("", {"triton_secret": 1}))
        assert status == "INVALID_ARGUMENT"
    assert message.startswith(TRITON_PREFIX), message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_parameters_are_accepted(endpoint, stub, protocol):
    parameters = {"priority": 1, "timeout": 10_000_000, "custom": 3}
    if protocol == "http":
        assert _http(endpoint, "POST", "/v2/models/add_sub/infer", _infer_document(parameters)) == ("200", "")
    else:
        assert _grpc(stub.ModelInfer, _infer_message("", parameters)) == ("OK", "")


# A negative priority: real Triton answers each protocol in its own words (HTTP: a JSON parse error, as a
# 500); triton_nb answers both with one message, as the client's error.
NEGATIVE_PRIORITY = {
    "real_triton": {
        "http": ("500", "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer"),
        "grpc": ("INVALID_ARGUMENT", "invalid value for 'priority', expected value >= 0."),
    },
    "triton_nb": {
        "http": ("400", "model 'add_sub': request parameter 'priority' must be a whole number >= 0, got -1"),
        "grpc": ("INVALID_ARGUMENT", "model 'add_sub': request parameter 'priority' must be a whole number >= 0, "
                                     "got -1"),
    },
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_negative_priority_is_refused(endpoint, stub, protocol):
    if protocol == "http":
        observed = _http(endpoint, "POST", "/v2/models/add_sub/infer", _infer_document({"priority": -1}))
    else:
        observed = _grpc(stub.ModelInfer, _infer_message("", {"priority": -1}))
    assert observed == NEGATIVE_PRIORITY[endpoint.kind][protocol]
