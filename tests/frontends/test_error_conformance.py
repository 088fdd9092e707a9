"""Front-end conformance of errors: the same failing tritonclient and raw HTTP calls against triton_nb and
real Triton 2.51, over both protocols.

Every test runs once per ``endpoint`` ("triton_nb", "real_triton"; see conftest.py). The expectation is
what real Triton 2.51 answers, written down as a constant; where triton_nb answers differently on purpose
(README, "Differences from Triton"), the table of its own answers says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.conformance_helpers import (
    MODELS,
    NO_ID,
    SHAPE_NOTE,
    add_sub_data,
    add_sub_grpc_inputs,
    add_sub_http_inputs,
    grpc_input,
    http_input,
    raw_http,
    server_error,
)
from tests.helpers.conformance_repo import FAILS_MESSAGE

# ---------------------------------------------------------------------------------- inference errors

# case -> (model, inputs as {name: (array, datatype)}, infer kwargs, HTTP status, gRPC status, message)
_ONES = np.ones((1, 4), np.float32)
ERROR_CASES: dict[str, tuple[str, dict, dict, str, str, str]] = {
    "unknown_model": (
        "nonexistent", {"INPUT0": (_ONES, "FP32")}, {}, "404", "StatusCode.NOT_FOUND",
        "Request for unknown model: 'nonexistent' is not found",
    ),
    "unknown_version": (
        "add_sub", {"INPUT0": (_ONES, "FP32"), "INPUT1": (_ONES, "FP32")}, {"model_version": "7"}, "404",
        "StatusCode.NOT_FOUND", "Request for unknown model: 'add_sub' version 7 is not found",
    ),
    "wrong_datatype": (
        "add_sub", {"INPUT0": (_ONES.astype(np.int32), "INT32"), "INPUT1": (_ONES, "FP32")}, {}, "400",
        "StatusCode.INVALID_ARGUMENT",
        NO_ID + "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    "wrong_shape": (
        "add_sub", {"INPUT0": (np.ones((1, 3), np.float32), "FP32"), "INPUT1": (_ONES, "FP32")}, {}, "400",
        "StatusCode.INVALID_ARGUMENT",
        NO_ID + "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,4], got [1,3]." + SHAPE_NOTE,
    ),
    "wrong_shape_with_request_id": (
        "add_sub", {"INPUT0": (np.ones((1, 3), np.float32), "FP32"), "INPUT1": (_ONES, "FP32")},
        {"request_id": "r-9"}, "400", "StatusCode.INVALID_ARGUMENT",
        "[request id: r-9] unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,4], got [1,3]."
        + SHAPE_NOTE,
    ),
    "batch_too_large": (
        "add_sub", {"INPUT0": (np.ones((9, 4), np.float32), "FP32"), "INPUT1": (np.ones((9, 4), np.float32), "FP32")},
        {}, "400", "StatusCode.INVALID_ARGUMENT", NO_ID + "inference request batch-size must be <= 8 for 'add_sub'",
    ),
    "missing_input": (
        "add_sub", {"INPUT0": (_ONES, "FP32")}, {}, "400", "StatusCode.INVALID_ARGUMENT",
        NO_ID + "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing "
        "required input(s) ['INPUT1']. Please provide all required input(s).",
    ),
    "unknown_output": (
        "add_sub", {"INPUT0": (_ONES, "FP32"), "INPUT1": (_ONES, "FP32")}, {"outputs": ["NOPE"]}, "400",
        "StatusCode.INVALID_ARGUMENT", "unexpected inference output 'NOPE' for model 'add_sub'",
    ),
    "model_error": (
        "fails", {"INPUT0": (np.ones(3, np.float32), "FP32")}, {}, "500", "StatusCode.INTERNAL", FAILS_MESSAGE,
    ),
}


def _infer_call(client, protocol: str, case: str) -> Callable[[], Any]:
    model, tensors, kwargs, *_ = ERROR_CASES[case]
    kwargs = dict(kwargs)
    if protocol == "http":
        inputs = [http_input(n, a, t) for n, (a, t) in tensors.items()]
        if "outputs" in kwargs:
            kwargs["outputs"] = [httpclient.InferRequestedOutput(n) for n in kwargs["outputs"]]
    else:
        inputs = [grpc_input(n, a, t) for n, (a, t) in tensors.items()]
        if "outputs" in kwargs:
            kwargs["outputs"] = [grpcclient.InferRequestedOutput(n) for n in kwargs["outputs"]]
    return lambda: client.infer(model, inputs, **kwargs)


@pytest.mark.parametrize("case", list(ERROR_CASES))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_errors(http_client, grpc_client, protocol, case):
    *_, http_status, grpc_status, message = ERROR_CASES[case]
    client = http_client if protocol == "http" else grpc_client
    expected_status = http_status if protocol == "http" else grpc_status
    assert server_error(_infer_call(client, protocol, case)) == (expected_status, message)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_error_unexpected_input(http_client, grpc_client, protocol):
    # Triton 2.51 lists the inputs in an unspecified order and misformats the empty "missing" list
    # ("missing required input(s) ]"), so only the stable beginning of the message is compared
    in0, in1 = add_sub_data(1)
    if protocol == "http":
        call = lambda: http_client.infer(  # noqa: E731
            "add_sub", [*add_sub_http_inputs(in0, in1), http_input("INPUT9", in0, "FP32")])
        expected_status = "400"
    else:
        call = lambda: grpc_client.infer(  # noqa: E731
            "add_sub", [*add_sub_grpc_inputs(in0, in1), grpc_input("INPUT9", in0, "FP32")])
        expected_status = "StatusCode.INVALID_ARGUMENT"
    status, message = server_error(call)
    assert status == expected_status
    assert message.startswith(NO_ID + "expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ["), message
    assert "'INPUT9'" in message


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_metadata_errors(http_client, grpc_client, protocol):
    client = http_client if protocol == "http" else grpc_client
    not_found = "404" if protocol == "http" else "StatusCode.NOT_FOUND"
    invalid = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    unknown = "Request for unknown model: 'nonexistent' is not found"
    observed = {
        "metadata": server_error(lambda: client.get_model_metadata("nonexistent")),
        "config": server_error(lambda: client.get_model_config("nonexistent")),
        "metadata_version": server_error(lambda: client.get_model_metadata("add_sub", model_version="7")),
        "statistics": server_error(lambda: client.get_inference_statistics("nonexistent")),
    }
    assert observed == {
        "metadata": (not_found, unknown),
        "config": (not_found, unknown),
        "metadata_version": (not_found, "Request for unknown model: 'add_sub' version 7 is not found"),
        "statistics": (invalid, "requested model 'nonexistent' is not available"),
    }


# status, body (exact JSON, or a prefix of the "error" string ending in "...") of raw HTTP requests
RAW_CASES: dict[str, tuple[str, str, bytes | None, int, Any]] = {
    "unknown_route": ("GET", "/v2/foo", None, 404, {"error": "Not Found"}),
    "root": ("GET", "/", None, 404, {"error": "Not Found"}),
    "trailing_slash": ("GET", "/v2/", None, 404, {"error": "Not Found"}),
    "non_numeric_version": ("GET", "/v2/models/add_sub/versions/abc", None, 404, {"error": "Not Found"}),
    "get_on_infer": ("GET", "/v2/models/add_sub/infer", None, 405, {"error": "Method Not Allowed"}),
    "get_on_repository_index": ("GET", "/v2/repository/index", None, 405, {"error": "Method Not Allowed"}),
    "post_on_health": ("POST", "/v2/health/live", b"", 405, {"error": "Method Not Allowed"}),
    "malformed_json": ("POST", "/v2/models/add_sub/infer", b"{not json", 500,
                       "failed to parse the request JSON buffer: ..."),
    "inputs_not_array": ("POST", "/v2/models/add_sub/infer", b'{"inputs": 3}', 500, "Unable to parse 'inputs': ..."),
    "infer_unknown_model": ("POST", "/v2/models/nonexistent/infer", b'{"inputs": []}', 404,
                            {"error": "Request for unknown model: 'nonexistent' is not found"}),
    "model_metadata_unknown": ("GET", "/v2/models/nonexistent", None, 404,
                               {"error": "Request for unknown model: 'nonexistent' is not found"}),
    "model_ready_unknown": ("GET", "/v2/models/nonexistent/ready", None, 400, {"error": "Model version not ready"}),
    "stats_unknown": ("GET", "/v2/models/nonexistent/stats", None, 400,
                      {"error": "requested model 'nonexistent' is not available"}),
    "load_unknown": ("POST", "/v2/repository/models/nonexistent/load", None, 500,
                     {"error": "failed to load 'nonexistent', failed to poll from model repository"}),
    "server_ready": ("GET", "/v2/health/ready", None, 200, b""),
    "model_ready": ("GET", "/v2/models/add_sub/ready", None, 200, b""),
}


# Where triton_nb answers differently on purpose (README, "Differences from Triton"): a request it cannot
# parse is the client's error (400), not the server's (500); loading a model the repository lacks is a 404
# that names the repository, not a 500 "failed to poll".
TRITON_NB_RAW_CASES: dict[str, tuple[int, Any]] = {
    "malformed_json": (400, "failed to parse the inference request JSON: ..."),
    "inputs_not_array": (400, "model 'add_sub': the inference request needs an 'inputs' list"),
    "load_unknown": (404, "no model 'nonexistent' in repository ..."),
}


@pytest.mark.parametrize("case", list(RAW_CASES))
def test_raw_http(endpoint, case):
    method, path, body, expected_status, expected = RAW_CASES[case]
    if endpoint.kind == "triton_nb" and case in TRITON_NB_RAW_CASES:
        expected_status, expected = TRITON_NB_RAW_CASES[case]
        expected = expected if expected.endswith("...") else {"error": expected}
    status, data = raw_http(endpoint, method, path, body)
    if isinstance(expected, bytes):
        assert (status, data) == (expected_status, expected)
        return
    try:
        got = json.loads(data)
    except ValueError:
        got = data  # not JSON: compared as it is, so the assertion shows it
    if isinstance(expected, str):  # a prefix of the "error" string: a match compares equal
        error = got.get("error") if isinstance(got, dict) else None
        matches = isinstance(error, str) and error.startswith(expected.removesuffix("..."))
        expected = {"error": error if matches else expected}
    assert (status, got) == (expected_status, expected), f"{method} {path}"


def test_raw_http_repository_index_without_body(endpoint):
    # tritonclient posts an empty body; the index answers with every model of the repository
    status, data = raw_http(endpoint, "POST", "/v2/repository/index")
    assert status == 200
    index = [m for m in json.loads(data) if m.get("name") in MODELS]  # strays: see test_load_errors
    assert index == [{"name": n, "version": "1", "state": "READY"} for n in MODELS]
    status, data = raw_http(endpoint, "POST", "/v2/repository/index", b'{"ready": true}',
                            {"Content-Type": "application/json"})
    assert status == 200 and {m["name"] for m in json.loads(data)} >= set(MODELS)


def test_raw_http_json_infer_response_shape(endpoint):
    request = {
        "id": "raw-1",
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [[0.5, 0.5, 0.5, 0.5]]},
        ],
        "outputs": [{"name": "OUTPUT0"}],
    }
    status, data = raw_http(endpoint, "POST", "/v2/models/add_sub/infer", json.dumps(request).encode(),
                            {"Content-Type": "application/json"})
    assert status == 200, data
    assert json.loads(data) == {
        "id": "raw-1", "model_name": "add_sub", "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.5, 2.5, 3.5, 4.5]}],
    }

