"""What the front-end conformance test modules share: the conformance repository's names, Triton's
fixed message parts, tensor builders and the calls that capture a server's answer."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

MODELS = ("add_sub", "echo_all", "fails")  # the conformance repository, in index order
ADD_SUB_INPUTS = ("INPUT0", "INPUT1")
ADD_SUB_OUTPUTS = ("OUTPUT0", "OUTPUT1")
# extensions the tests below exercise; Triton 2.51 also lists sequence, shared memory, trace, logging...
REQUIRED_EXTENSIONS = {"classification", "model_repository", "model_configuration", "binary_tensor_data",
                       "statistics"}
NO_ID = "[request id: <id_unknown>] "  # Triton's prefix of request-validation errors without a request id
SHAPE_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to"
    " each input shape. If you want to specify the full shape including the batch dim in your input dims config,"
    " try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)

rng = np.random.default_rng(7)



def http_input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def grpc_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def add_sub_data(batch: int = 2) -> tuple[np.ndarray, np.ndarray]:
    in0 = rng.uniform(-10, 10, size=(batch, 4)).astype(np.float32)
    in1 = rng.uniform(-10, 10, size=(batch, 4)).astype(np.float32)
    return in0, in1


def add_sub_http_inputs(in0: np.ndarray, in1: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    return [http_input("INPUT0", in0, "FP32", binary), http_input("INPUT1", in1, "FP32", binary)]


def add_sub_grpc_inputs(in0: np.ndarray, in1: np.ndarray) -> list[grpcclient.InferInput]:
    return [grpc_input("INPUT0", in0, "FP32"), grpc_input("INPUT1", in1, "FP32")]


def assert_add_sub(result: Any, in0: np.ndarray, in1: np.ndarray) -> None:
    for name, expected in (("OUTPUT0", in0 + in1), ("OUTPUT1", in0 - in1)):
        got = result.as_numpy(name)
        assert got is not None, f"no {name} in the response"
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def server_error(call: Callable[[], Any]) -> tuple[str | None, str]:
    """(status, message) of the InferenceServerException that ``call`` raises."""
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), info.value.message()


def outcome(call: Callable[[], Any]) -> str | tuple[str | None, str]:
    """"ok", or (status, message) of the InferenceServerException that ``call`` raises."""
    try:
        call()
    except InferenceServerException as exc:
        return exc.status(), exc.message()
    return "ok"


def raw_http(endpoint, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One raw HTTP/1.1 request (what tritonclient cannot express): (status, body)."""
    host, port = endpoint.http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def sample(datatype: str, json_safe: bool = False) -> np.ndarray:
    """Values of ``datatype`` with its extremes; JSON-safe ones have no inf/nan and only UTF-8 strings."""
    if datatype == "BOOL":
        return np.array([True, False, False, True])
    if datatype == "BYTES":
        values = ["héllo wörld ✓".encode(), b"", b"plain", "日本語".encode()]
        if not json_safe:
            values += [b"\x00\xff", bytes(range(256))]
        return np.array(values, dtype=np.object_)
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = [0.0, -1.5, 0.1, float(info.max), float(info.min), float(info.tiny), 1234.5]
        if not json_safe:
            values += [np.inf, -np.inf, np.nan]
        return np.array(values, dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([0, 1, info.max, info.min, info.max // 3], dtype=dtype)


def assert_echo(got: np.ndarray | None, sent: np.ndarray, datatype: str, json_output: bool = False) -> None:
    assert got is not None, f"no OUTPUT_{datatype} in the response"
    assert got.shape == sent.shape
    if datatype == "BYTES":
        # tritonclient gives bytes from binary outputs and str from JSON outputs
        expected = [v.decode("utf-8") for v in sent] if json_output else list(sent)
        assert list(got) == expected
        return
    assert got.dtype == sent.dtype
    np.testing.assert_array_equal(got, sent)
