"""Bad input over the network: every malformed HTTP or gRPC inference request gets a 4xx (or
INVALID_ARGUMENT / NOT_FOUND) with a message that names the model, the tensor or the field, or a
clean close; no request gets a 5xx (save Triton's 501 for a Content-Encoding it cannot decode) or
leaves a traceback in the log; and the server keeps serving.

The named cases come first (a table per front end), then clients that disconnect mid-request,
then bounded, reproducible property-based fuzzing (hypothesis, ``derandomize=True``).
"""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.helpers.scale_models import write_scale_model
from triton_nb import serve

MAX_BODY = 1 << 20
INFER = "/v2/models/scale/infer"
# Loggers whose ERROR records mean an unexpected exception (a traceback) inside the server.
WATCHED_LOGGERS = ("triton_nb", "uvicorn", "uvicorn.error", "grpc")
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16"]
JUNK_DATATYPES = ["FP128", "", "fp32", "TYPE_FP32", "FP32 ", "STRING", "INT"]
GRPC_CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
                      grpc.StatusCode.RESOURCE_EXHAUSTED}
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


class _Crashes(logging.Handler):
    """Collects ERROR records (logged tracebacks) from the server's threads."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            if all(record is not seen for seen in self.records):  # a record reaches parent loggers too
                self.records.append(record)

    def clear(self) -> None:
        with self._lock_records:
            self.records.clear()

    def report(self) -> str:
        with self._lock_records:
            return "\n".join(f"{r.name}: {r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else
                             f"{r.name}: {r.getMessage()}" for r in self.records)


@dataclass
class _Served:
    server: Any
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    crashes: _Crashes
    http_port: int = field(init=False)

    def __post_init__(self) -> None:
        self.http_port = self.server.http_port


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[_Served]:
    repo = tmp_path_factory.mktemp("fuzz_repo")
    write_scale_model(repo)
    crashes = _Crashes()
    loggers = [logging.getLogger(name) for name in WATCHED_LOGGERS]
    for logger in loggers:
        logger.addHandler(crashes)
    server = serve(repo, http_port=0, grpc_port=0, max_request_bytes=MAX_BODY, grpc_max_message_bytes=MAX_BODY)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        yield _Served(server, service_pb2_grpc.GRPCInferenceServiceStub(channel), crashes)
    finally:
        channel.close()
        server.stop()
        for logger in loggers:
            logger.removeHandler(crashes)


# ---------------------------------------------------------------------------------------- helpers
def _post(port: int, body: bytes, headers: dict[str, str] | None = None, path: str = INFER) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _error_message(status: int, body: bytes) -> str:
    try:
        document = json.loads(body)
    except ValueError:
        raise AssertionError(f"status {status} with a body that is not JSON: {body[:300]!r}") from None
    assert isinstance(document, dict), body[:300]
    message = document.get("error")
    assert isinstance(message, str) and message, f"status {status} without an 'error' string: {body[:300]!r}"
    return message


def _x(**changes: Any) -> dict[str, Any]:
    """A good JSON input X of shape [1, 2], with some fields changed (None removes one)."""
    entry = {"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0], **changes}
    return {key: value for key, value in entry.items() if value is not None}


def _json(inputs: Any, **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _binary(entries: list[dict[str, Any]], tail: bytes,
            header_length: str | None = None) -> tuple[bytes, dict[str, str]]:
    """A binary-data request: the JSON header, then ``tail``; the header length as given, else the true one."""
    header = json.dumps({"inputs": entries}).encode()
    return header + tail, {"Inference-Header-Content-Length": header_length or str(len(header))}


def _binary_x(size: int = 8, datatype: str = "FP32", shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": "X", "shape": shape or [1, 2], "datatype": datatype, "parameters": {"binary_data_size": size}}


GOOD_RAW = struct.pack("<2f", 1.0, 2.0)


def _grpc_request(model: str = "scale", version: str = "", raw: list[bytes] | None = None,
                  **tensor: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(**{"name": "X", "datatype": "FP32", "shape": [1, 2], **tensor})
    request.raw_input_contents.extend([GOOD_RAW] if raw is None else raw)
    return request


def _assert_still_serving(served: _Served) -> None:
    status, body = _post(served.http_port, _json([_x()]))
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2.0, 4.0]
    response = served.stub.ModelInfer(_grpc_request(), timeout=30)
    assert struct.unpack("<2f", response.raw_output_contents[0]) == (2.0, 4.0)
    assert not served.crashes.records, f"the server logged errors:\n{served.crashes.report()}"


# ---------------------------------------------------------------------------------------- HTTP table
def _case(case_id: str, body: bytes, status: int, pattern: str, headers: dict[str, str] | None = None,
          path: str = INFER) -> Any:
    return pytest.param(body, headers or {}, path, status, pattern, id=case_id)


def _binary_case(case_id: str, entries: list[dict[str, Any]], tail: bytes, status: int, pattern: str,
                 header_length: str | None = None) -> Any:
    body, headers = _binary(entries, tail, header_length)
    return _case(case_id, body, status, pattern, headers)


_COUNT_FIELD = r"classification count for output 'Y' must be a positive integer"
HTTP_CASES = [
    _case("malformed-json", b'{"inputs": [{"name": "X", ', 400, r"failed to parse the inference request JSON"),
    _case("empty-body", b"", 400, r"failed to parse the inference request JSON"),
    _case("json-not-an-object", b"[1, 2]", 400, r"model 'scale': the inference request must be a JSON object"),
    _case("inputs-not-a-list", b'{"inputs": {"X": [1, 2]}}', 400,
          r"model 'scale': the inference request needs an 'inputs' list"),
    _case("input-without-name", _json([_x(name=None)]), 400, r"model 'scale': every input needs a 'name'"),
    _case("input-without-shape", _json([_x(shape=None)]), 400, r"model 'scale': input 'X' needs a shape"),
    _case("input-without-datatype", _json([_x(datatype=None)]), 400,
          r"model 'scale': input 'X' needs a 'datatype'"),
    _case("input-without-data", _json([_x(data=None)]), 400,
          r"model 'scale': input 'X' has neither 'data' nor binary data"),
    _case("input-given-twice", _json([_x(), _x()]), 400, r"model 'scale': input 'X' is given more than once"),
    _case("wrong-datatype", _json([_x(datatype="INT32", data=[1, 2])]), 400,
          r"input 'X' data-type is 'INT32', but model 'scale' expects 'FP32'"),
    _case("unknown-datatype", _json([_x(datatype="FP128")]), 400,
          r"model 'scale': input 'X' has unknown datatype 'FP128'"),
    _case("shape-disagrees-with-data", _json([_x(shape=[1, 3])]), 400,
          r"model 'scale': input 'X' has 2 values; shape \[1, 3\] needs 3"),
    _case("shape-disagrees-with-model", _json([_x(shape=[1, 3], data=[1.0, 2.0, 3.0])]), 400,
          r"unexpected shape for input 'X' for model 'scale'\. Expected \[-1,2\], got \[1,3\]"),
    _case("negative-dim", _json([_x(shape=[-1, 2])]), 400,
          r"model 'scale': input 'X' has a negative dimension in shape \[-1, 2\]"),
    _case("huge-dims", _json([_x(shape=[1000000000, 1000000000])]), 400,
          r"model 'scale': input 'X' with shape \[1000000000, 1000000000\] is over the limit of 16777216 elements"),
    _case("zero-dim-beside-a-huge-dim", _json([_x(shape=[0, 2**62], data=[])]), 400,
          r"input 'X' with shape \[0, 4611686018427387904\] is over the limit"),
    _case("non-integer-dim", _json([_x(shape=[1.5, 2])]), 400,
          r"model 'scale': input 'X' needs a shape that is a list of integers"),
    _case("batch-over-max-batch-size", _json([_x(shape=[9, 2], data=[1.0] * 18)]), 400,
          r"batch-size must be <= 8 for 'scale'"),
    _case("bytes-datatype-for-fp32-input", _json([_x(datatype="BYTES", data=["a", "b"])]), 400,
          r"input 'X' data-type is 'BYTES', but model 'scale' expects 'FP32'"),
    _case("strings-as-fp32-data", _json([_x(data=["a", "b"])]), 400,
          r"model 'scale': input 'X' has data that is not FP32 \(found text values\)"),
    _case("booleans-as-fp32-data", _json([_x(data=[True, False])]), 400,
          r"model 'scale': input 'X' has data that is not FP32 \(found true/false values\)"),
    _case("data-not-a-list", _json([_x(data="1,2")]), 400, r"model 'scale': input 'X' needs its data as a list"),
    _case("missing-required-input", _json([]), 400, r"missing required input\(s\) \['X'\]"),
    _binary_case("header-length-larger-than-body", [_binary_x()], GOOD_RAW, 400,
                 r"model 'scale': Inference-Header-Content-Length 500 is larger than the body \(\d+ bytes\)", "500"),
    _binary_case("header-length-not-a-number", [_binary_x()], GOOD_RAW, 400,
                 r"Inference-Header-Content-Length must be a whole number of bytes >= 0, got 'abc'", "abc"),
    _binary_case("header-length-negative", [_binary_x()], GOOD_RAW, 400,
                 r"Inference-Header-Content-Length must be a whole number of bytes >= 0, got '-5'", "-5"),
    _binary_case("binary-size-larger-than-the-rest", [_binary_x(size=80)], GOOD_RAW, 400,
                 r"model 'scale': input 'X' says binary_data_size 80; only 8 bytes of binary data are left"),
    _binary_case("binary-size-negative", [_binary_x(size=-8)], GOOD_RAW, 400,
                 r"model 'scale': input 'X' says binary_data_size -8"),
    _binary_case("binary-bytes-not-claimed", [_binary_x()], GOOD_RAW + b"xyz", 400,
                 r"model 'scale': 3 bytes of binary data are not claimed by any input's binary_data_size"),
    _binary_case("binary-size-not-shape-times-4", [_binary_x(size=4)], GOOD_RAW[:4], 400,
                 r"model 'scale': input 'X' has 4 bytes of data; FP32 with shape \[1, 2\] needs 8"),
    _binary_case("binary-bytes-length-prefix-past-the-data", [_binary_x(size=8, datatype="BYTES", shape=[1, 1])],
                 struct.pack("<I", 100) + b"abcd", 400,
                 r"model 'scale': BYTES input 'X' element 0 says 100 bytes; the data ends before"),
    _case("unknown-model", _json([_x()]), 404, r"unknown model: 'nope'", path="/v2/models/nope/infer"),
    _case("unknown-version", _json([_x()]), 404, r"unknown model: 'scale' version 7 is not found",
          path="/v2/models/scale/versions/7/infer"),
    _case("unknown-requested-output", _json([_x()], outputs=[{"name": "Z"}]), 400,
          r"unexpected inference output 'Z' for model 'scale'"),
    _case("nan-via-json-answered-by-the-model",
          b'{"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [NaN, 1.0]}]}', 400,
          r"X has NaN"),
    _case("classification-count-zero", _json([_x()], outputs=[{"name": "Y", "parameters": {"classification": 0}}]),
          400, _COUNT_FIELD + r", got 0"),
    _case("classification-count-negative",
          _json([_x()], outputs=[{"name": "Y", "parameters": {"classification": -1}}]), 400,
          _COUNT_FIELD + r", got -1"),
    _case("classification-count-text",
          _json([_x()], outputs=[{"name": "Y", "parameters": {"classification": "x"}}]), 400,
          _COUNT_FIELD + r", got 'x'"),
    _case("request-parameter-priority-negative", _json([_x()], parameters={"priority": -1}), 400,
          r"model 'scale': request parameter 'priority' must be a whole number >= 0"),
    _case("request-id-not-text", _json([_x()], id=5), 400, r"model 'scale': request 'id' must be a string"),
    # 501, as Triton answers an encoding it cannot decode (a deliberate choice, see test_network.py)
    _case("unknown-content-encoding", _json([_x()]), 501, r"unsupported Content-Encoding 'br'",
          {"Content-Encoding": "br"}),
    _case("gzip-body-that-is-not-gzip", _json([_x()]), 400, r"the gzip request body does not decompress",
          {"Content-Encoding": "gzip"}),
    _case("oversize-body", b" " * (MAX_BODY + 1), 413, r"over the limit of 1048576 bytes"),
    _case("gzip-bomb", gzip.compress(b" " * (4 * MAX_BODY)), 413,
          r"the decompressed request body is over the limit of 1048576 bytes", {"Content-Encoding": "gzip"}),
]


@pytest.mark.parametrize(("body", "headers", "path", "status", "pattern"), HTTP_CASES)
def test_bad_http_requests_get_a_4xx_that_says_what_is_wrong(served, body, headers, path, status, pattern):
    served.crashes.clear()
    answered, reply = _post(served.http_port, body, headers, path)
    message = _error_message(answered, reply)
    assert answered == status, f"expected {status}, got {answered}: {message}"
    assert re.search(pattern, message), f"message {message!r} does not match {pattern!r}"
    _assert_still_serving(served)


def test_an_over_limit_content_length_is_refused_before_the_body_arrives(served):
    served.crashes.clear()
    with socket.create_connection(("127.0.0.1", served.http_port), timeout=10) as client:
        client.sendall(f"POST {INFER} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {10 * MAX_BODY}\r\n\r\n".encode())
        response = http.client.HTTPResponse(client)
        response.begin()
        status, body = response.status, response.read()
    assert status == 413
    assert re.search(rf"request body of {10 * MAX_BODY} bytes is over the limit of {MAX_BODY} bytes",
                     _error_message(status, body))
    _assert_still_serving(served)


# ---------------------------------------------------------------------------------------- gRPC table
def _grpc_case(case_id: str, request: pb.ModelInferRequest, code: grpc.StatusCode, pattern: str) -> Any:
    return pytest.param(request, code, pattern, id=case_id)


def _mixed_request() -> pb.ModelInferRequest:
    request = _grpc_request()
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    return request


_INVALID = grpc.StatusCode.INVALID_ARGUMENT
GRPC_CASES = [
    _grpc_case("raw-wrong-byte-count", _grpc_request(raw=[GOOD_RAW[:5]]), _INVALID,
               r"model 'scale': input 'X' has 5 bytes of data; FP32 with shape \[1, 2\] needs 8"),
    _grpc_case("raw-buffers-not-one-per-input", _grpc_request(raw=[GOOD_RAW, GOOD_RAW]), _INVALID,
               r"model 'scale': 2 raw_input_contents for 1 inputs"),
    _grpc_case("contents-and-raw-mixed", _mixed_request(), _INVALID,
               r"(?=.*'X')(?=.*contents)(?=.*raw_input_contents)"),
    _grpc_case("unknown-datatype", _grpc_request(datatype="FP128"), _INVALID,
               r"model 'scale': input 'X' has unknown datatype 'FP128'"),
    _grpc_case("unknown-datatype-in-contents", _grpc_request(raw=[], datatype="FP128"), _INVALID,
               r"model 'scale': input 'X' has unknown datatype 'FP128'"),
    _grpc_case("negative-dim", _grpc_request(shape=[-1, 2]), _INVALID,
               r"model 'scale': input 'X' has a negative dimension in shape \[-1, 2\]"),
    _grpc_case("huge-dims", _grpc_request(shape=[1 << 40, 1 << 20]), _INVALID,
               r"model 'scale': input 'X' with shape \[1099511627776, 1048576\] is over the limit of \d+ elements"),
    _grpc_case("zero-dim-beside-a-huge-dim-raw", _grpc_request(raw=[b""], shape=[0, 1 << 62]), _INVALID,
               r"input 'X'"),
    _grpc_case("zero-dim-beside-a-huge-dim-contents", _grpc_request(raw=[], shape=[0, 1 << 62]), _INVALID,
               r"input 'X'"),
    _grpc_case("bytes-length-prefix-longer-than-data",
               _grpc_request(raw=[struct.pack("<I", 100) + b"ab"], datatype="BYTES", shape=[1, 1]), _INVALID,
               r"model 'scale': BYTES input 'X' element 0 says 100 bytes; the data ends before"),
    _grpc_case("wrong-datatype", _grpc_request(raw=[b"\x01\x00\x00\x00\x02\x00\x00\x00"], datatype="INT32"),
               _INVALID, r"input 'X' data-type is 'INT32', but model 'scale' expects 'FP32'"),
    _grpc_case("shape-disagrees-with-contents", _grpc_request(raw=[], contents=pb.InferTensorContents(
        fp32_contents=[1.0, 2.0, 3.0])), _INVALID, r"model 'scale': input 'X' has 3 values; shape \[1, 2\] needs 2"),
    _grpc_case("fp16-without-raw", _grpc_request(raw=[], datatype="FP16"), _INVALID,
               r"input 'X' is FP16, which has no typed contents: send it in raw_input_contents"),
    _grpc_case("nan-answered-by-the-model", _grpc_request(raw=[struct.pack("<2f", float("nan"), 1.0)]), _INVALID,
               r"X has NaN"),
    _grpc_case("unknown-model", _grpc_request(model="nope"), grpc.StatusCode.NOT_FOUND, r"unknown model: 'nope'"),
    _grpc_case("unknown-version", _grpc_request(version="7"), grpc.StatusCode.NOT_FOUND,
               r"unknown model: 'scale' version 7 is not found"),
    _grpc_case("version-not-a-number", _grpc_request(version="x"), _INVALID,
               r"failed to get model version from specified version string 'x' \(details: stol\), version should be an "
               r"integral value > 0"),
    _grpc_case("message-over-the-limit", _grpc_request(raw=[b"\0" * (2 * MAX_BODY)]),
               grpc.StatusCode.RESOURCE_EXHAUSTED, r"larger than max"),
]


@pytest.mark.parametrize(("request_message", "code", "pattern"), GRPC_CASES)
def test_bad_grpc_requests_get_a_client_error_that_says_what_is_wrong(served, request_message, code, pattern):
    served.crashes.clear()
    with pytest.raises(grpc.RpcError) as caught:
        served.stub.ModelInfer(request_message, timeout=30)
    error = caught.value
    assert error.code() == code, f"expected {code}, got {error.code()}: {error.details()}"
    assert re.search(pattern, error.details() or ""), f"details {error.details()!r} do not match {pattern!r}"
    _assert_still_serving(served)


def test_grpc_bad_classification_counts_are_invalid_arguments(served):
    served.crashes.clear()
    for kind, value in (("int64_param", 0), ("int64_param", -1), ("string_param", "x")):
        request = _grpc_request()
        output = request.outputs.add(name="Y")
        setattr(output.parameters["classification"], kind, value)
        with pytest.raises(grpc.RpcError) as caught:
            served.stub.ModelInfer(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert re.search(_COUNT_FIELD, caught.value.details())
    _assert_still_serving(served)


# ---------------------------------------------------------------------------------------- disconnects
def _settled_thread_count(limit: int, wait_s: float = 5.0) -> int:
    deadline = time.monotonic() + wait_s
    while True:
        count = threading.active_count()
        if count <= limit or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_clients_that_disconnect_mid_request_leave_the_server_serving(served):
    served.crashes.clear()
    _assert_still_serving(served)  # the server's threads are all started
    before = threading.active_count()
    good = _json([_x()])
    head = (f"POST {INFER} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: 1000\r\n\r\n").encode()
    for _ in range(10):
        # headers that promise 1000 bytes, then 10 bytes, then gone
        with socket.create_connection(("127.0.0.1", served.http_port), timeout=10) as client:
            client.sendall(head + good[:10])
        # half the headers, then gone
        with socket.create_connection(("127.0.0.1", served.http_port), timeout=10) as client:
            client.sendall(head[:25])
        # a whole request, gone before the answer
        with socket.create_connection(("127.0.0.1", served.http_port), timeout=10) as client:
            client.sendall(f"POST {INFER} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(good)}\r\n\r\n".encode() + good)
        # a gRPC call cancelled in flight
        served.stub.ModelInfer.future(_grpc_request(), timeout=30).cancel()
    # a client that resets the connection (SO_LINGER 0) in the middle of the body
    with socket.create_connection(("127.0.0.1", served.http_port), timeout=10) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.sendall(head + good[:10])
    time.sleep(0.2)
    _assert_still_serving(served)
    after = _settled_thread_count(before + 2)
    assert after <= before + 2, f"{after - before} more threads after the disconnects: {threading.enumerate()}"


# ---------------------------------------------------------------------------------------- HTTP fuzz
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6))
_any_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                         max_leaves=10)
_SPECIAL_DIMS = [0, 1, 2, 2**31, 2**62, 2**63 - 1, -(2**63), -1]
# a small dim (often 0) beside an edge one (huge or negative), in either order
_edge_shapes = st.tuples(st.sampled_from([0, 0, 1, 2]), st.sampled_from([2**31, 2**62, 2**63 - 1, -1])).flatmap(
    lambda pair: st.permutations(list(pair)))
# shapes: small ones, ones built from edge values (a zero beside a huge dim, a negative...), any JSON
_dims = st.one_of(st.integers(-2, 9), st.sampled_from([*_SPECIAL_DIMS, 2**64, 10**12]))
_shapes = st.one_of(st.lists(_dims, max_size=4), st.lists(st.sampled_from(_SPECIAL_DIMS), min_size=1, max_size=3),
                    _any_json)
_values = st.one_of(st.floats(), st.integers(-1000, 1000), st.booleans(), st.text(max_size=4), st.none())
_data = st.one_of(st.just([]), st.lists(_values, max_size=12), st.lists(st.lists(_values, max_size=3), max_size=4),
                  _any_json)
_datatypes = st.one_of(st.sampled_from(DATATYPES + JUNK_DATATYPES), _any_json)


@st.composite
def _good_entries(draw: st.DrawFn) -> dict[str, Any]:
    """A valid input X: JSON data or binary data (the request builder supplies the bytes)."""
    rows = draw(st.integers(1, 3))
    entry = {"name": "X", "shape": [rows, 2], "datatype": "FP32"}
    if draw(st.booleans()):
        entry["data"] = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=2 * rows, max_size=2 * rows))
    else:
        entry["parameters"] = {"binary_data_size": 8 * rows}
    return entry


_MUTATIONS = {
    "name": st.one_of(st.sampled_from(["X", "Y", "", "Q"]), _any_json), "shape": _shapes, "datatype": _datatypes,
    "data": _data,
    "parameters": st.one_of(st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-4, 80) | _any_json}),
                            _any_json),
}


@st.composite
def _mutated_entries(draw: st.DrawFn) -> dict[str, Any]:
    """A valid input X with one or two fields removed or replaced by something random."""
    entry = draw(_good_entries())
    for key in draw(st.lists(st.sampled_from(sorted(_MUTATIONS)), min_size=1, max_size=2, unique=True)):
        if draw(st.sampled_from(["replace", "replace", "remove"])) == "remove":
            entry.pop(key, None)
        else:
            entry[key] = draw(_MUTATIONS[key])
    return entry


_random_entries = st.one_of(st.fixed_dictionaries({}, optional=_MUTATIONS), _any_json)


@st.composite
def _edge_shape_entries(draw: st.DrawFn) -> dict[str, Any]:
    """Input X with a small dim (often 0) beside an edge one (huge or negative), in either order,
    and data that fits an empty shape (none when a dim is 0)."""
    shape = draw(_edge_shapes)
    data = [] if 0 in shape else draw(st.lists(st.floats(width=32), max_size=4))
    return {"name": "X", "shape": shape, "datatype": draw(st.sampled_from(["FP32", "FP32", *DATATYPES])), "data": data}

_output_parameters = st.fixed_dictionaries({}, optional={
    "classification": st.integers(-2, 5) | _any_json, "binary_data": st.booleans() | _any_json})
_outputs = st.one_of(st.lists(st.fixed_dictionaries({"name": st.sampled_from(["Y", "Z", ""]) | _any_json}, optional={
    "parameters": _output_parameters | _any_json}), max_size=3), _any_json)
_request_parameters = st.dictionaries(st.sampled_from(["priority", "timeout", "binary_data_output", "custom"]),
                                      st.integers(-5, 2**65) | _any_json, max_size=3)
_EXTRAS = {"outputs": _outputs, "parameters": _request_parameters | _any_json, "id": st.text(max_size=5) | _any_json}


@st.composite
def _documents(draw: st.DrawFn) -> Any:
    """Mostly a request object with one or two inputs, mostly good or with one field changed."""
    if draw(st.sampled_from(["object"] * 5 + ["any JSON"])) == "any JSON":
        return draw(_any_json)
    if draw(st.sampled_from(["list"] * 5 + ["any JSON"])) == "any JSON":
        inputs = draw(_any_json)
    else:
        kinds = {"good": _good_entries(), "mutated": _mutated_entries(), "edge": _edge_shape_entries(),
                 "random": _random_entries}
        choices = ["good"] * 3 + ["mutated"] * 3 + ["edge"] * 2 + ["random"]
        inputs = [draw(kinds[draw(st.sampled_from(choices))]) for _ in range(draw(st.sampled_from([1] * 4 + [0, 2])))]
    document = {"inputs": inputs}
    for key in draw(st.lists(st.sampled_from(sorted(_EXTRAS)), max_size=3, unique=True)):
        document[key] = draw(_EXTRAS[key])
    return document


_HEADER_TEXT = st.text(alphabet="0123456789abcdefxyz-+. _", max_size=8)
_floats_bytes = st.lists(st.floats(width=32), max_size=8).map(lambda v: struct.pack(f"<{len(v)}f", *v))


def _claimed_bytes(document: Any) -> int:
    """The binary data a document's inputs claim (0 where the claims are not plain numbers)."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    total = 0
    for entry in inputs if isinstance(inputs, list) else []:
        parameters = entry.get("parameters") if isinstance(entry, dict) else None
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if type(size) is int and 0 <= size <= 4096:
            total += size
    return total


@st.composite
def _http_requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers): a JSON header, maybe mangled, then a binary tail that matches its
    claims or not, an Inference-Header-Content-Length that is true or not, maybe compressed."""
    document = draw(_documents())
    header = json.dumps(document).encode()
    mutation = draw(st.sampled_from(["none"] * 5 + ["truncate", "splice", "garbage"]))
    if mutation == "truncate":
        header = header[:draw(st.integers(0, len(header)))]
    elif mutation == "splice":
        at = draw(st.integers(0, len(header)))
        header = header[:at] + draw(st.binary(min_size=1, max_size=8)) + header[at:]
    elif mutation == "garbage":
        header = draw(st.binary(max_size=64))
    claimed = _claimed_bytes(document)
    tail = draw(st.one_of(st.binary(min_size=claimed, max_size=claimed), st.just(b""), st.binary(max_size=48),
                          _floats_bytes))
    body = header + tail
    headers: dict[str, str] = {}
    length = draw(st.sampled_from(["true"] * 4 + ["absent", "number", "text"]))
    if length == "true" and tail:
        headers["Inference-Header-Content-Length"] = str(len(header))
    elif length == "number":
        headers["Inference-Header-Content-Length"] = str(draw(st.integers(-5, len(body) + 10)))
    elif length == "text":
        headers["Inference-Header-Content-Length"] = draw(_HEADER_TEXT)
    encoding = draw(st.sampled_from([None] * 6 + ["gzip", "deflate", "identity", "GZIP", "br", "x-junk"]))
    if encoding is not None:
        headers["Content-Encoding"] = encoding
        if encoding.lower() in ("gzip", "deflate") and draw(st.sampled_from([True, True, False])):
            body = gzip.compress(body) if encoding.lower() == "gzip" else zlib.compress(body)
    path = draw(st.sampled_from([INFER] * 6 + ["/v2/models/nope/infer", "/v2/models/scale/versions/1/infer",
                                               "/v2/models/scale/versions/9/infer",
                                               "/v2/models/scale/versions/x/infer"]))
    return path, body, headers


@FUZZ
@given(case=_http_requests())
def test_fuzzed_http_requests_never_get_a_5xx(served, case):
    path, body, headers = case
    served.crashes.clear()
    note(f"POST {path} headers={headers} body={body[:2000]!r}")
    status, reply = _post(served.http_port, body, headers, path)
    message = _error_message(status, reply) if status >= 400 else ""
    # the one 5xx on purpose: 501 for a Content-Encoding the server cannot decode, as Triton answers
    unsupported_encoding = status == 501 and message.startswith("unsupported Content-Encoding")
    assert status < 500 or unsupported_encoding, f"{status} {reply[:500]!r} for POST {path} {headers} {body[:2000]!r}"
    assert not served.crashes.records, f"the server logged errors:\n{served.crashes.report()}"


def test_the_server_serves_after_the_http_fuzzing(served):
    served.crashes.clear()
    _assert_still_serving(served)


# ---------------------------------------------------------------------------------------- gRPC fuzz
_CONTENTS = {
    "bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1), "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1), "fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=8),
}
_grpc_shapes = st.one_of(st.lists(st.integers(1, 3), min_size=2, max_size=2),
                         st.lists(st.one_of(st.integers(-2, 9), st.sampled_from(_SPECIAL_DIMS)), max_size=4),
                         _edge_shapes)
_PARAMETER_KINDS = {"bool_param": st.booleans(), "int64_param": st.integers(-(2**63), 2**63 - 1),
                    "string_param": st.text(max_size=4), "double_param": st.floats(),
                    "uint64_param": st.integers(0, 2**64 - 1)}


def _set_random_parameter(draw: st.DrawFn, target: Any) -> None:
    kind = draw(st.sampled_from(sorted(_PARAMETER_KINDS)))
    setattr(target, kind, draw(_PARAMETER_KINDS[kind]))


def _raw_size(tensor: pb.ModelInferRequest.InferInputTensor) -> int:
    """The raw byte count a tensor's datatype and shape need (BYTES: 4 per element, empty strings)."""
    itemsize = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4,
                "INT32": 4, "FP32": 4, "BYTES": 4}.get(tensor.datatype, 8)
    count = 1
    for dim in tensor.shape:
        count *= max(dim, 0)
    return min(count * itemsize, 256)


@st.composite
def _grpc_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A ModelInferRequest: mostly for 'scale', inputs X/Y/'' of any datatype and shape, typed
    contents, raw buffers that fit their shapes or not, requested outputs and parameters."""
    request = pb.ModelInferRequest(model_name=draw(st.sampled_from(["scale"] * 6 + ["nope", ""])),
                                   model_version=draw(st.sampled_from([""] * 6 + ["1", "3", "x", "-1", "9" * 25])),
                                   id=draw(st.text(max_size=4)))
    for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2, 3]))):
        tensor = request.inputs.add(name=draw(st.sampled_from(["X"] * 4 + ["Y", ""])),
                                    datatype=draw(st.sampled_from(["FP32"] * 6 + DATATYPES + JUNK_DATATYPES)),
                                    shape=draw(_grpc_shapes))
        for name in draw(st.lists(st.sampled_from(sorted(_CONTENTS)), max_size=2, unique=True)):
            getattr(tensor.contents, name).extend(draw(st.lists(_CONTENTS[name], max_size=8)))
    raw = draw(st.sampled_from(["fitting", "fitting", "none", "random"]))
    if raw == "fitting":
        request.raw_input_contents.extend(draw(st.binary(min_size=_raw_size(t), max_size=_raw_size(t)))
                                          for t in request.inputs)
    elif raw == "random":
        request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=40) | _floats_bytes, max_size=3)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        output = request.outputs.add(name=draw(st.sampled_from(["Y", "Y", "Z", ""])))
        if draw(st.booleans()):
            _set_random_parameter(draw, output.parameters["classification"])
    for key in draw(st.lists(st.sampled_from(["priority", "timeout", "custom"]), max_size=2, unique=True)):
        _set_random_parameter(draw, request.parameters[key])
    return request


@FUZZ
@given(request_message=_grpc_requests())
def test_fuzzed_grpc_requests_never_get_an_internal_error(served, request_message):
    served.crashes.clear()
    note(str(request_message))
    try:
        served.stub.ModelInfer(request_message, timeout=30)
    except grpc.RpcError as error:
        assert error.code() in GRPC_CLIENT_ERRORS, f"{error.code()} {error.details()!r} for {request_message}"
        assert error.details(), f"{error.code()} without details for {request_message}"
    assert not served.crashes.records, f"the server logged errors:\n{served.crashes.report()}"


def test_the_server_serves_after_the_grpc_fuzzing(served):
    served.crashes.clear()
    _assert_still_serving(served)
