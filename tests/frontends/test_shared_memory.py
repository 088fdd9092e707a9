"""Triton's system shared-memory extension over HTTP and gRPC, with stock tritonclient clients and
``tritonclient.utils.shared_memory``: registering, status, unregistering, inference with inputs
and outputs in shared memory (numbers and BYTES), the errors in Triton's words, CUDA shared
memory answered as a Triton without a GPU answers it, and the restricted-API gate.

``tests/test_real_triton_shared_memory.py`` runs the same sequence against real Triton 2.51."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.helpers.shared_memory_cases import (
    ERROR_WORDS,
    EXPECTED_SEQUENCE,
    OUR_CODES,
    A,
    B,
    Regions,
    code_for,
    failure,
    infer_addsub,
    protocol_module,
    run_errors,
    run_sequence,
    status_list,
    write_models,
)
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.server.frontends.shared_memory import SharedMemoryRegistry, TensorRegion

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
