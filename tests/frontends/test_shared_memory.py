"""Triton's system shared-memory extension over HTTP and gRPC, with stock tritonclient clients and
``tritonclient.utils.shared_memory``: registering, status, unregistering, inference with inputs
and outputs in shared memory (numbers and BYTES), the errors in Triton's words, CUDA shared
memory answered as a Triton without a GPU answers it, and the restricted-API gate.

``tests/test_real_triton_shared_memory.py`` runs the same sequence against real Triton 2.51."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from scale_models import write_echo_model, write_python_model

from triton_nb import serve
from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.server.shared_memory import SharedMemoryRegistry, TensorRegion

ADDSUB_CONFIG = """
name: "addsub"
backend: "python"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ADDSUB_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b),
                                                         pb_utils.Tensor("DIFF", a - b)]))
        return responses
'''

A = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
B = np.array([0.5, 0.5, 1.0, 8.0], dtype=np.float32)
WORDS = np.array([b"ab", b"cde", b""], dtype=np.object_)
REGION_BYTES = 64  # each test region: A and B (16 bytes each) fit, with room for the bounds checks


def write_models(repo: Path) -> Path:
    """The repository both servers serve (triton_nb here, real Triton in the other module)."""
    write_python_model(repo, "addsub", ADDSUB_CONFIG, ADDSUB_MODEL)
    write_echo_model(repo)
    return repo


class Regions:
    """Shared-memory objects made with tritonclient's helpers, each under a fresh key."""

    def __init__(self) -> None:
        self.handles: dict[str, Any] = {}
        self.keys: dict[str, str] = {}

    def create(self, name: str, byte_size: int = REGION_BYTES) -> Any:
        key = f"/triton_nb_test_{uuid.uuid4().hex}"
        self.keys[name] = key
        self.handles[name] = shm.create_shared_memory_region(name, key, byte_size)
        return self.handles[name]

    def destroy(self) -> None:
        for handle in self.handles.values():
            shm.destroy_shared_memory_region(handle)
        self.handles.clear()


def protocol_module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def status_list(client: Any, protocol: str, name: str = "") -> list[dict[str, Any]]:
    """Region status in one form for both protocols: HTTP's JSON list; gRPC's map, by name."""
    if protocol == "http":
        return sorted(client.get_system_shared_memory_status(name), key=lambda r: r["name"])
    response = client.get_system_shared_memory_status(name)
    return sorted(({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                   for r in response.regions.values()), key=lambda r: r["name"])


def failure(call: Any) -> tuple[str, str]:
    """(status, message) of a call that must fail."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), caught.value.message()


def infer_addsub(client: Any, protocol: str, in_region: str = "in", a_offset: int = 0, a_size: int = 16,
                 out_region: str = "out", out_size: int = 16) -> Any:
    """SUM in shared memory, DIFF over the wire; A at ``a_offset`` and B at 16 of ``in_region``."""
    module = protocol_module(protocol)
    a = module.InferInput("A", [4], "FP32")
    a.set_shared_memory(in_region, a_size, offset=a_offset)
    b = module.InferInput("B", [4], "FP32")
    b.set_shared_memory(in_region, 16, offset=16)
    total = module.InferRequestedOutput("SUM")
    total.set_shared_memory(out_region, out_size)
    return client.infer("addsub", [a, b], outputs=[total, module.InferRequestedOutput("DIFF")])


def output_metadata(result: Any, protocol: str, name: str) -> dict[str, Any]:
    """An output's entry in the response, in one form for both protocols."""
    output = result.get_output(name)
    if protocol == "http":
        return dict(output)
    entry = {"name": output.name, "datatype": output.datatype, "shape": list(output.shape)}
    if output.parameters:
        entry["parameters"] = dict(output.parameters)
    return entry


def run_sequence(client: Any, protocol: str, regions: Regions) -> dict[str, Any]:
    """The register / infer / status / unregister sequence; what it saw, to compare across servers."""
    seen: dict[str, Any] = {}
    shm.set_shared_memory_region(regions.handles["in"], [A, B])
    client.register_system_shared_memory("in", regions.keys["in"], 32)
    client.register_system_shared_memory("out", regions.keys["out"], 32)
    seen["status"] = [{**r, "key": "<key>" if r["name"] == "in" else "<key2>"} for r in status_list(client, protocol)]
    seen["status_in"] = [r["name"] for r in status_list(client, protocol, "in")]
    result = infer_addsub(client, protocol)
    seen["sum_metadata"] = output_metadata(result, protocol, "SUM")
    seen["sum"] = shm.get_contents_as_numpy(regions.handles["out"], np.float32, [4]).tolist()
    seen["diff"] = result.as_numpy("DIFF").tolist()
    # BYTES: three strings (one empty) in, three out, both in shared memory
    serialized = serialize_byte_tensor(WORDS)
    shm.set_shared_memory_region(regions.handles["words"], [serialized])
    client.register_system_shared_memory("words", regions.keys["words"], REGION_BYTES)
    client.register_system_shared_memory("echoed", regions.keys["echoed"], REGION_BYTES)
    module = protocol_module(protocol)
    words = module.InferInput("IN", [3], "BYTES")
    words.set_shared_memory("words", serialized_byte_size(serialized))
    echoed = module.InferRequestedOutput("OUT")
    echoed.set_shared_memory("echoed", REGION_BYTES)
    result = client.infer("echo", [words], outputs=[echoed])
    seen["echo_metadata"] = output_metadata(result, protocol, "OUT")
    seen["echo"] = shm.get_contents_as_numpy(regions.handles["echoed"], np.object_, [3]).tolist()
    client.unregister_system_shared_memory("in")
    seen["after_one"] = [r["name"] for r in status_list(client, protocol)]
    client.unregister_system_shared_memory()
    seen["after_all"] = status_list(client, protocol)
    return seen


EXPECTED_SEQUENCE = {
    "status": [{"name": "in", "key": "<key>", "offset": 0, "byte_size": 32},
               {"name": "out", "key": "<key2>", "offset": 0, "byte_size": 32}],
    "status_in": ["in"],
    "sum_metadata": {"name": "SUM", "datatype": "FP32", "shape": [4]},
    "sum": (A + B).tolist(),
    "diff": (A - B).tolist(),
    "echo_metadata": {"name": "OUT", "datatype": "BYTES", "shape": [3]},
    "echo": [b"ab!", b"cde!", b"!"],
    "after_one": ["echoed", "out", "words"],
    "after_all": [],
}


def run_errors(client: Any, protocol: str, regions: Regions) -> dict[str, tuple[str, str]]:
    """Each error case once: (status, message) by case, to compare across servers."""
    shm.set_shared_memory_region(regions.handles["in"], [A, B])
    errors: dict[str, tuple[str, str]] = {}
    # a fresh key for the bounds check at registration (Triton 2.51 reuses a closed descriptor for
    # a key registered already, and then fails differently)
    errors["register_beyond"] = failure(lambda: client.register_system_shared_memory(
        "beyond", regions.keys["spare"], REGION_BYTES, offset=8))
    client.register_system_shared_memory("in", regions.keys["in"], 32)
    client.register_system_shared_memory("out", regions.keys["out"], 32)
    errors["duplicate"] = failure(lambda: client.register_system_shared_memory("in", regions.keys["in"], 32))
    errors["missing_key"] = failure(lambda: client.register_system_shared_memory(
        "ghost", f"/triton_nb_test_missing_{uuid.uuid4().hex}", 16))
    errors["status_unknown"] = failure(lambda: client.get_system_shared_memory_status("nowhere"))
    errors["infer_unknown_input_region"] = failure(lambda: infer_addsub(client, protocol, in_region="nowhere"))
    errors["infer_unknown_output_region"] = failure(lambda: infer_addsub(client, protocol, out_region="nowhere"))
    errors["infer_beyond"] = failure(lambda: infer_addsub(client, protocol, a_offset=24))
    errors["infer_offset_beyond"] = failure(lambda: infer_addsub(client, protocol, a_offset=40, a_size=4))
    errors["input_size_mismatch"] = failure(lambda: infer_addsub(client, protocol, a_size=12))
    errors["output_too_small"] = failure(lambda: infer_addsub(client, protocol, out_size=8))
    client.unregister_system_shared_memory("in")
    errors["infer_unregistered"] = failure(lambda: infer_addsub(client, protocol))
    client.unregister_system_shared_memory("never-registered")  # no error, as in Triton
    client.unregister_system_shared_memory()
    return errors


# The words both servers say; status codes where they agree (see test_errors for where they differ).
ERROR_WORDS = {
    "register_beyond": "failed to register shared memory region 'beyond': invalid args",
    "duplicate": "shared memory region 'in' already in manager",
    "missing_key": "Unable to open shared memory region: '/triton_nb_test_missing_",
    "status_unknown": "Unable to find system shared memory region: 'nowhere'",
    "infer_unknown_input_region": "Unable to find shared memory region: 'nowhere'",
    "infer_unknown_output_region": "Unable to find shared memory region: 'nowhere'",
    "infer_beyond": "Invalid offset + byte size for shared memory region: 'in'",
    "infer_offset_beyond": "Invalid offset for shared memory region: 'in'",
    "input_size_mismatch": "input byte size mismatch for input 'A' for model 'addsub'. Expected 16, got 12",
    "output_too_small": "shared memory size specified with the request for output 'SUM' (8 bytes) should be at "
                        "least 16 bytes to hold the results",
    "infer_unregistered": "Unable to find shared memory region: 'in'",
}
TRITON_CODES = {  # Triton 2.51's (HTTP, gRPC) status of each case
    "register_beyond": ("400", "StatusCode.INVALID_ARGUMENT"),
    "duplicate": ("400", "StatusCode.ALREADY_EXISTS"),
    "missing_key": ("500", "StatusCode.INTERNAL"),
    "status_unknown": ("404", "StatusCode.NOT_FOUND"),
    "infer_unknown_input_region": ("404", "StatusCode.NOT_FOUND"),
    "infer_unknown_output_region": ("404", "StatusCode.NOT_FOUND"),
    "infer_beyond": ("400", "StatusCode.INVALID_ARGUMENT"),
    "infer_offset_beyond": ("400", "StatusCode.INVALID_ARGUMENT"),
    "input_size_mismatch": ("400", "StatusCode.INVALID_ARGUMENT"),
    "output_too_small": ("500", "StatusCode.INTERNAL"),
    "infer_unregistered": ("404", "StatusCode.NOT_FOUND"),
}
# Where triton_nb answers a client's mistake as one (Triton answers these 500 / INTERNAL).
OUR_CODES = {**TRITON_CODES, "missing_key": ("400", "StatusCode.INVALID_ARGUMENT"),
             "output_too_small": ("400", "StatusCode.INVALID_ARGUMENT")}


def code_for(protocol: str, case: str, codes: dict[str, tuple[str, str]]) -> str:
    return codes[case][0 if protocol == "http" else 1]


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repo = write_models(tmp_path_factory.mktemp("shm") / "repo")
    with serve(repo, http_port=0, grpc_port=0) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def client(server: Any, protocol: str) -> Iterator[Any]:
    if protocol == "http":
        connection = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    else:
        connection = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        yield connection
    finally:
        server.shared_memory.unregister()  # whatever a failed test left
        connection.close()


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    for name in ("in", "out", "words", "echoed", "spare"):
        made.create(name)
    try:
        yield made
    finally:
        made.destroy()


def _http(port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
          ) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    return status, json.loads(text) if text else None


# ---------------------------------------------------------------------- tests


def test_server_metadata_lists_the_shared_memory_extensions(server: Any) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        assert {"system_shared_memory", "cuda_shared_memory"} <= set(http.get_server_metadata()["extensions"])
        assert {"system_shared_memory", "cuda_shared_memory"} <= set(grpc.get_server_metadata().extensions)
    finally:
        http.close()
        grpc.close()


def test_register_infer_status_unregister(client: Any, protocol: str, regions: Regions) -> None:
    assert run_sequence(client, protocol, regions) == EXPECTED_SEQUENCE


def test_results_from_shared_memory_equal_a_normal_infer(client: Any, protocol: str, regions: Regions) -> None:
    module = protocol_module(protocol)
    inputs = []
    for name, values in (("A", A), ("B", B)):
        tensor = module.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(values)
        inputs.append(tensor)
    plain = client.infer("addsub", inputs)
    shm.set_shared_memory_region(regions.handles["in"], [A, B])
    client.register_system_shared_memory("in", regions.keys["in"], 32)
    client.register_system_shared_memory("out", regions.keys["out"], 32)
    # every output in shared memory, the second at an offset inside its region
    a = module.InferInput("A", [4], "FP32")
    a.set_shared_memory("in", 16)
    b = module.InferInput("B", [4], "FP32")
    b.set_shared_memory("in", 16, offset=16)
    total = module.InferRequestedOutput("SUM")
    total.set_shared_memory("out", 16)
    diff = module.InferRequestedOutput("DIFF")
    diff.set_shared_memory("out", 16, offset=16)
    result = client.infer("addsub", [a, b], outputs=[total, diff])
    written = shm.get_contents_as_numpy(regions.handles["out"], np.float32, [8])
    np.testing.assert_array_equal(written[:4], plain.as_numpy("SUM"))
    np.testing.assert_array_equal(written[4:], plain.as_numpy("DIFF"))
    if protocol == "grpc":  # one empty raw buffer per output kept in shared memory, as Triton sends
        assert list(result.get_response().raw_output_contents) == [b"", b""]


def test_a_region_registered_over_http_serves_grpc(server: Any, regions: Regions) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        shm.set_shared_memory_region(regions.handles["in"], [A, B])
        http.register_system_shared_memory("in", regions.keys["in"], 32)
        grpc.register_system_shared_memory("out", regions.keys["out"], 32)
        infer_addsub(grpc, "grpc")
        np.testing.assert_array_equal(shm.get_contents_as_numpy(regions.handles["out"], np.float32, [4]), A + B)
        assert [r["name"] for r in http.get_system_shared_memory_status()] == ["in", "out"]
    finally:
        server.shared_memory.unregister()
        http.close()
        grpc.close()


def test_stream_infer_reads_and_writes_shared_memory(server: Any, regions: Regions) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    results: list[Any] = []
    try:
        shm.set_shared_memory_region(regions.handles["in"], [A, B])
        client.register_system_shared_memory("in", regions.keys["in"], 32)
        client.register_system_shared_memory("out", regions.keys["out"], 8)  # too small for SUM
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        a = grpcclient.InferInput("A", [4], "FP32")
        a.set_shared_memory("in", 16)
        b = grpcclient.InferInput("B", [4], "FP32")
        b.set_shared_memory("in", 16, offset=16)
        total = grpcclient.InferRequestedOutput("SUM")
        total.set_shared_memory("out", 8)
        client.async_stream_infer("addsub", [a, b], outputs=[total], request_id="small")
        c = grpcclient.InferInput("A", [4], "FP32")
        c.set_shared_memory("nowhere", 16)
        client.async_stream_infer("addsub", [c, b], request_id="unknown")
        client.async_stream_infer("addsub", [a, b], outputs=[grpcclient.InferRequestedOutput("DIFF")],
                                  request_id="plain")
        client.stop_stream()  # waits for the answers
        errors = sorted(str(error) for _, error in results if error is not None)
        assert len(results) == 3 and len(errors) == 2, results
        assert "Unable to find shared memory region: 'nowhere'" in errors[0]
        assert "output 'SUM' (8 bytes) should be at least 16 bytes" in errors[1]
        plain = next(result for result, error in results if error is None)
        np.testing.assert_array_equal(plain.as_numpy("DIFF"), A - B)
    finally:
        server.shared_memory.unregister()
        client.close()


def test_errors_use_tritons_words(client: Any, protocol: str, regions: Regions) -> None:
    errors = run_errors(client, protocol, regions)
    assert set(errors) == set(ERROR_WORDS)
    for case, (status, message) in errors.items():
        assert ERROR_WORDS[case] in message, (case, message)
        assert status == code_for(protocol, case, OUR_CODES), (case, status, message)
        assert not status.startswith("5") and "INTERNAL" not in status, (case, status)
    assert status_list(client, protocol) == []


def test_cuda_shared_memory_is_answered_as_triton_without_a_gpu(client: Any, protocol: str) -> None:
    if protocol == "http":
        assert client.get_cuda_shared_memory_status() == []
    else:
        assert len(client.get_cuda_shared_memory_status().regions) == 0
    status, message = failure(lambda: client.get_cuda_shared_memory_status("gpu0"))
    assert "Unable to find cuda shared memory region: 'gpu0'" in message
    assert status in ("404", "StatusCode.NOT_FOUND")
    status, message = failure(lambda: client.register_cuda_shared_memory("gpu0", b"\0" * 64, 0, 16))
    assert "failed to register CUDA shared memory region: 'gpu0', GPUs not supported" in message
    assert status in ("400", "StatusCode.INVALID_ARGUMENT")
    client.unregister_cuda_shared_memory("gpu0")
    client.unregister_cuda_shared_memory()


def test_http_requests_that_mix_shared_memory_with_other_data(server: Any, regions: Regions) -> None:
    port = server.http_port
    server.shared_memory.register("in", regions.keys["in"], 32)
    server.shared_memory.register("out", regions.keys["out"], 32)
    try:
        b_json = {"name": "B", "shape": [4], "datatype": "FP32", "data": B.tolist()}
        in_shm = {"shared_memory_region": "in", "shared_memory_byte_size": 16}
        a_both = {"name": "A", "shape": [4], "datatype": "FP32", "data": A.tolist(), "parameters": in_shm}
        status, body = _http(port, "POST", "/v2/models/addsub/infer", {"inputs": [a_both, b_json]})
        assert status == 400 and body["error"] == (
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'")
        a_shm = {"name": "A", "shape": [4], "datatype": "FP32", "parameters": in_shm}
        out_shm = {"shared_memory_region": "out", "shared_memory_byte_size": 16}
        for extra, words in (({"binary_data": True}, "binary_data"), ({"classification": 1}, "classification")):
            request = {"inputs": [a_shm, b_json], "outputs": [{"name": "SUM", "parameters": {**out_shm, **extra}}]}
            status, body = _http(port, "POST", "/v2/models/addsub/infer", request)
            assert status == 400 and body["error"] == f"Output can't set both 'shared_memory_region' and '{words}'"
        # no byte size: Triton reads 0, which no region holds
        request = {"inputs": [{**a_shm, "parameters": {"shared_memory_region": "in"}}, b_json]}
        status, body = _http(port, "POST", "/v2/models/addsub/infer", request)
        assert status == 400 and body["error"] == "Invalid offset + byte size for shared memory region: 'in'"
        # an output in shared memory is answered with its metadata only
        request = {"inputs": [a_shm, b_json], "outputs": [{"name": "SUM", "parameters": out_shm}]}
        status, body = _http(port, "POST", "/v2/models/addsub/infer", request)
        assert status == 200 and body["outputs"] == [{"name": "SUM", "datatype": "FP32", "shape": [4]}]
    finally:
        server.shared_memory.unregister()


def test_http_register_requests_checked_as_triton_checks_them(server: Any, regions: Regions) -> None:
    port = server.http_port
    region = "/v2/systemsharedmemory/region/r"
    assert _http(port, "POST", f"{region}/register", {"byte_size": 4}) == (
        400, {"error": "Shared memory register request has no 'key' field"})
    assert _http(port, "POST", f"{region}/register", {"key": regions.keys["in"]}) == (
        400, {"error": "Shared memory register request has no 'byte_size' field"})
    assert _http(port, "POST", "/v2/systemsharedmemory/register", {"key": regions.keys["in"], "byte_size": 4}) == (
        400, {"error": "'region name' is necessary to register system shared memory region"})
    assert _http(port, "POST", "/v2/systemsharedmemory/status") == (405, {"error": "Method Not Allowed"})
    assert _http(port, "GET", f"{region}/register") == (405, {"error": "Method Not Allowed"})
    assert _http(port, "GET", "/v2/systemsharedmemory/region/r/forget")[0] == 404
    # a key is a shared-memory object's name, never a path
    status, body = _http(port, "POST", f"{region}/register", {"key": "/../etc/passwd", "byte_size": 4})
    assert status == 400 and body["error"] == "Unable to open shared memory region: '/../etc/passwd'"
    assert _http(port, "POST", f"{region}/register", {"key": regions.keys["in"], "byte_size": 8, "offset": 4}) == (
        200, None)
    assert _http(port, "GET", f"{region}/status") == (
        200, [{"name": "r", "key": regions.keys["in"], "offset": 4, "byte_size": 8}])
    assert _http(port, "POST", f"{region}/unregister") == (200, None)
    assert _http(port, "GET", "/v2/systemsharedmemory/status") == (200, [])


def test_an_offset_registered_inside_the_object_is_where_requests_start(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        shm.set_shared_memory_region(regions.handles["in"], [B, A, B])  # A and B from byte 16
        client.register_system_shared_memory("in", regions.keys["in"], 32, offset=16)
        client.register_system_shared_memory("out", regions.keys["out"], 16, offset=40)
        infer_addsub(client, "http")
        np.testing.assert_array_equal(shm.get_contents_as_numpy(regions.handles["out"], np.float32, [4], offset=40),
                                      A + B)
    finally:
        server.shared_memory.unregister()
        client.close()


def test_restricted_api_gates_shared_memory(tmp_path: Path, regions: Regions) -> None:
    repo = write_models(tmp_path / "repo")
    with serve(repo, http_port=0, grpc_port=0, http_restricted_api="shared-memory:shm-key=open",
               grpc_restricted_api="shared-memory:shm-key=open") as server:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            status, message = failure(lambda: http.register_system_shared_memory("in", regions.keys["in"], 32))
            assert (status, message) == ("403", "This API is restricted, expecting header 'shm-key'")
            assert failure(lambda: http.get_cuda_shared_memory_status())[0] == "403"
            status, message = failure(lambda: grpc.get_system_shared_memory_status())
            assert status == "StatusCode.PERMISSION_DENIED" and "triton-grpc-protocol-shm-key" in message
            http.register_system_shared_memory("in", regions.keys["in"], 32, headers={"shm-key": "open"})
            grpc.register_system_shared_memory("out", regions.keys["out"], 32,
                                               headers={"triton-grpc-protocol-shm-key": "open"})
            shm.set_shared_memory_region(regions.handles["in"], [A, B])
            infer_addsub(http, "http")  # inference is not restricted; the regions it names are
            np.testing.assert_array_equal(shm.get_contents_as_numpy(regions.handles["out"], np.float32, [4]), A + B)
            assert len(server.shared_memory.status()) == 2
        finally:
            http.close()
            grpc.close()
    assert server.shared_memory.status() == []  # the stop unregistered what the clients left


def test_a_region_in_use_is_unmapped_only_when_its_requests_let_go(regions: Regions) -> None:
    registry = SharedMemoryRegistry()
    shm.set_shared_memory_region(regions.handles["in"], [A, B])
    registry.register("in", regions.keys["in"], 32)
    lease = registry.lease()
    np.testing.assert_array_equal(lease.read_input("m", "A", "FP32", (4,), TensorRegion("in", 0, 16)), A)
    lease.bind_output("Y", TensorRegion("in", 16, 16))
    registry.unregister("in")  # while the request holds it: forgotten now, unmapped later
    assert registry.status() == []
    with pytest.raises(NotFoundError, match="Unable to find shared memory region: 'in'"):
        registry.lease().read_input("m", "A", "FP32", (4,), TensorRegion("in", 0, 16))
    lease.write_output("Y", A * 10)
    with pytest.raises(InvalidArgumentError, match="should be at least 32 bytes"):
        lease.write_output("Y", np.zeros(8, dtype=np.float32))
    lease.release()
    lease.release()  # idempotent
    np.testing.assert_array_equal(shm.get_contents_as_numpy(regions.handles["in"], np.float32, [4], offset=16), A * 10)
    registry.register("in", regions.keys["in"], 32)  # the name is free again
    registry.close()
    assert registry.status() == []


def test_an_object_truncated_under_a_region_is_refused_not_a_crash(server: Any, regions: Regions) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        client.register_system_shared_memory("in", regions.keys["in"], 32)
        client.register_system_shared_memory("out", regions.keys["out"], 32)
        # its owner shrinks the object: pages past the new end would kill the server with SIGBUS
        os.truncate(Path("/dev/shm") / regions.keys["in"].lstrip("/"), 8)
        status, message = failure(lambda: infer_addsub(client, "http"))
        assert status == "400" and f"its object '{regions.keys['in']}' shrank to 8 bytes" in message
        assert client.is_server_live()
    finally:
        server.shared_memory.unregister()
        client.close()
