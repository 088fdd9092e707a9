"""SageMaker's container contract (``--allow-sagemaker``), answered as real tritonserver 2.51 answers it.

Each case runs against triton_nb and against the real server in SageMaker mode (single-model and
multi-model), with the same requests; where the two differ on purpose (docs/compatibility.md), the
case says what each answers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

import triton_nb
from tests.helpers.conformance_servers import SERVER_PARAMS
from tests.helpers.python_models import SIMPLE_CONFIG, write_model
from tests.helpers.real_triton import RealTritonServer

DOUBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 2).astype(np.float32))]))
        return responses
"""
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
JSON_REQUEST = json.dumps({"inputs": [{"name": "X", "shape": [2, 1], "datatype": "FP32", "data": [1, 2]}]}).encode()
ANSWER = {"model_name": "double", "model_version": "1",
          "outputs": [{"name": "Y", "datatype": "FP32", "shape": [2, 1], "data": [2.0, 4.0]}]}


def _binary_request() -> tuple[bytes, int]:
    tensor = httpclient.InferInput("X", [2, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1], [2]], np.float32), binary_data=True)
    requested = httpclient.InferRequestedOutput("Y", binary_data=True)
    return httpclient.InferenceServerClient.generate_request_body([tensor], outputs=[requested])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def sagemaker_server(kind: str, repo: Path, *, multi_model: bool) -> Iterator[int]:
    """Start ``kind`` in SageMaker mode as the container's start script does; yields the SageMaker port."""
    environment = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": None if multi_model else "double",
                   "SAGEMAKER_TRITON_PING_MODE": "live" if multi_model else None}
    with _environment(**environment):
        if kind == "real_triton":
            port = _free_port()
            args = ["--allow-sagemaker=true", f"--sagemaker-port={port}", "--model-control-mode=explicit"]
            if not multi_model:
                args.append("--load-model=double")
            with RealTritonServer(repo, extra_args=args):
                yield port
            return
        server = triton_nb.serve(repo, allow_sagemaker=True, sagemaker_port=0, network_model_control=True,
                                 load_models=[] if multi_model else ["double"])
        try:
            yield int(server.endpoints["sagemaker"].rsplit(":", 1)[1])
        finally:
            server.stop()


def call(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
         ) -> tuple[int, str | None, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        connection.close()


def _error(body: bytes) -> str:
    return json.loads(body)["error"]


@pytest.fixture(scope="module")
def single_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sagemaker") / "repo"
    write_model(root, "double", DOUBLE, SIMPLE_CONFIG.format(name="double"))
    return root


# --------------------------------------------------------------------------- single model


@pytest.mark.parametrize("kind", SERVER_PARAMS)
def test_single_model_routes_answer_as_tritonserver(kind: str, single_repo: Path) -> None:
    binary, header_bytes = _binary_request()
    with sagemaker_server(kind, single_repo, multi_model=False) as port:
        assert call(port, "GET", "/ping")[0] == 200
        for method in ("POST", "HEAD"):
            assert call(port, method, "/ping")[0] == 405
        # a JSON body, whatever the Content-Type says
        for headers in ({"Content-Type": "application/json"}, {"Content-Type": "application/octet-stream"}, {}):
            status, content_type, body = call(port, "POST", "/invocations", JSON_REQUEST, headers)
            assert (status, content_type, json.loads(body)) == (200, "application/json", ANSWER), headers
        for method in ("GET", "PUT"):
            status, _, body = call(port, method, "/invocations", JSON_REQUEST)
            assert (status, _error(body)) == (405, "Method Not Allowed")
        # binary+json both ways: the answer's Content-Type carries its own JSON header's size
        status, content_type, body = call(port, "POST", "/invocations", binary,
                                          {"Content-Type": f"{BINARY_JSON}{header_bytes}"})
        assert status == 200 and content_type.startswith(BINARY_JSON)
        size = int(content_type[len(BINARY_JSON):])
        result = httpclient.InferenceServerClient.parse_response_body(body, header_length=size)
        np.testing.assert_array_equal(result.as_numpy("Y"), [[2.0], [4.0]])
        # binary outputs asked for by a JSON request
        asked = json.dumps({"inputs": json.loads(JSON_REQUEST)["inputs"],
                            "parameters": {"binary_data_output": True}}).encode()
        status, content_type, body = call(port, "POST", "/invocations", asked)
        assert status == 200 and content_type.startswith(BINARY_JSON)
        result = httpclient.InferenceServerClient.parse_response_body(
            body, header_length=int(content_type[len(BINARY_JSON):]))
        np.testing.assert_array_equal(result.as_numpy("Y"), [[2.0], [4.0]])
        # header sizes Triton refuses, in its words
        bad_sizes = {f"text/plain; {BINARY_JSON}{header_bytes}":
                     f"expect MIME type for binary data starts with '{BINARY_JSON}', got: text/plain; "
                     f"{BINARY_JSON}{header_bytes}",
                     f"{BINARY_JSON}-1": f"inference header size should be in range (0, {len(binary)}), got: -1",
                     f"{BINARY_JSON}{len(binary) + 5}":
                     f"inference header size should be in range (0, {len(binary)}), got: {len(binary) + 5}"}
        for content_type, message in bad_sizes.items():
            status, _, body = call(port, "POST", "/invocations", binary, {"Content-Type": content_type})
            assert (status, _error(body)) == (400, message)
        # a header size of 0: the body is the raw bytes of the model's only input, one row
        status, content_type, body = call(port, "POST", "/invocations", np.array([5], np.float32).tobytes(),
                                          {"Content-Type": f"{BINARY_JSON}0"})
        assert status == 200 and content_type.startswith(BINARY_JSON)  # and the outputs come back binary
        result = httpclient.InferenceServerClient.parse_response_body(
            body, header_length=int(content_type[len(BINARY_JSON):]))
        np.testing.assert_array_equal(result.as_numpy("Y"), [[10.0]])
        status, _, body = call(port, "POST", "/invocations", binary, {"Content-Type": f"{BINARY_JSON}0"})
        assert status == 400
        assert _error(body).endswith(f"input byte size mismatch for input "
                                     f"'{'raw_input' if kind == 'real_triton' else 'X'}' for model 'double'. "
                                     f"Expected 4, got {len(binary)}")
        # routes SageMaker's front end does not serve: 400, no body
        for method, path in (("GET", "/v2/health/ready"), ("GET", "/nothing"), ("POST", "/invocations/"),
                             ("GET", "/ping/"), ("PUT", "/models/double")):
            assert call(port, method, path)[::2] == (400, b""), path
        # the multi-model routes are there in single-model mode too, with nothing loaded
        status, _, body = call(port, "GET", "/models")
        assert (status, json.loads(body)) == (200, {"models": []})
        assert call(port, "GET", "/models/double")[::2] == (404, b"")
        assert call(port, "POST", "/models/double/invoke", JSON_REQUEST)[::2] == (404, b"")
        # compression is not part of the contract: both headers are ignored
        status, _, body = call(port, "POST", "/invocations", JSON_REQUEST,
                               {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
        assert (status, json.loads(body)) == (200, ANSWER)


@pytest.mark.parametrize("kind", SERVER_PARAMS)
def test_bad_bodies_are_answered_and_the_server_serves_on(kind: str, single_repo: Path) -> None:
    with sagemaker_server(kind, single_repo, multi_model=False) as port:
        status, _, body = call(port, "POST", "/invocations", b"{not json")
        # Triton 2.51 answers a malformed body 500; the client's mistake is a 400 here (docs/compatibility.md)
        assert status == (500 if kind == "real_triton" else 400)
        assert "JSON" in _error(body)
        unknown = json.dumps({"inputs": [{"name": "Z", "shape": [2, 1], "datatype": "FP32", "data": [1, 2]}]})
        status, _, body = call(port, "POST", "/invocations", unknown.encode())
        assert status == 400 and "'Z'" in _error(body) and "'double'" in _error(body)
        status, _, body = call(port, "POST", "/invocations", JSON_REQUEST)
        assert (status, json.loads(body)) == (200, ANSWER)


def test_header_sizes_that_are_not_numbers_are_refused_as_current_triton_refuses_them(single_repo: Path) -> None:
    """Triton 2.51 read the size with atoi ("abc" was 0: a raw request); the current server refuses it."""
    binary, _ = _binary_request()
    with sagemaker_server("triton_nb", single_repo, multi_model=False) as port:
        for size, message in (("abc", "Unable to parse inference header size, got: abc"),
                              ("99999999999999", "Unable to parse inference header size, value is out of range, "
                                                 "got: 99999999999999")):
            status, _, body = call(port, "POST", "/invocations", binary, {"Content-Type": f"{BINARY_JSON}{size}"})
            assert (status, _error(body)) == (400, message)


def test_ping_answers_readiness_or_liveness_as_the_ping_mode_says(tmp_path: Path) -> None:
    write_model(tmp_path, "double", DOUBLE, SIMPLE_CONFIG.format(name="double"))
    write_model(tmp_path, "broken", "raise ImportError('no such thing')\n", SIMPLE_CONFIG.format(name="broken"))
    for mode, expected in (("ready", 400), ("live", 200)):
        with _environment(SAGEMAKER_TRITON_PING_MODE=mode, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="double"):
            server = triton_nb.serve(tmp_path, allow_sagemaker=True, sagemaker_port=0)
        try:
            port = int(server.endpoints["sagemaker"].rsplit(":", 1)[1])
            assert call(port, "GET", "/ping")[0] == expected, mode  # 'broken' failed: not ready, still live
            assert json.loads(call(port, "POST", "/invocations", JSON_REQUEST)[2]) == ANSWER
        finally:
            server.stop()
    with _environment(SAGEMAKER_TRITON_PING_MODE="sometimes"), pytest.raises(
            triton_nb.InvalidArgumentError, match="SAGEMAKER_TRITON_PING_MODE must be 'ready' or 'live', got "
                                                  "'sometimes'"):
        triton_nb.serve(tmp_path, allow_sagemaker=True, sagemaker_port=0)


# --------------------------------------------------------------------------- multi-model


@pytest.fixture
def multi_models(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An empty repository to start from (the container's /tmp/sagemaker) and two model archives,
    unpacked, each holding the model 'double'."""
    empty = tmp_path / "empty"
    empty.mkdir()
    archives = []
    for name in ("a", "b"):
        write_model(tmp_path / name, "double", DOUBLE, SIMPLE_CONFIG.format(name="double"))
        archives.append(tmp_path / name)
    return empty, archives[0], archives[1]


def _target(name: str) -> dict[str, str]:
    return {"X-Amzn-SageMaker-Target-Model": name}


@pytest.mark.parametrize("kind", SERVER_PARAMS)
def test_multi_model_routes_answer_as_tritonserver(kind: str, multi_models: tuple[Path, Path, Path]) -> None:
    empty, first, second = multi_models
    target = _target("model-cpu.tar.gz")
    binary, header_bytes = _binary_request()
    with sagemaker_server(kind, empty, multi_model=True) as port:
        assert call(port, "GET", "/ping")[0] == 200
        load = json.dumps({"model_name": "h1", "url": str(first)}).encode()
        assert call(port, "POST", "/models", load, target)[::2] == (200, b"")
        status, _, body = call(port, "GET", "/models/h1")
        assert (status, json.loads(body)) == (200, {"modelName": "h1", "modelUrl": str(first)})
        # the model serves under the target's name
        status, content_type, body = call(port, "POST", "/models/h1/invoke", JSON_REQUEST, target)
        assert (status, content_type) == (200, "application/json")
        assert json.loads(body) == {**ANSWER, "model_name": "model-cpu.tar.gz"}
        status, content_type, body = call(port, "POST", "/models/h1/invoke", binary,
                                          {**target, "Content-Type": f"{BINARY_JSON}{header_bytes}"})
        assert status == 200 and content_type.startswith(BINARY_JSON)
        result = httpclient.InferenceServerClient.parse_response_body(
            body, header_length=int(content_type[len(BINARY_JSON):]))
        np.testing.assert_array_equal(result.as_numpy("Y"), [[2.0], [4.0]])
        # without the header the hash is the model's name: every failure of an invoke is a 400
        status, _, body = call(port, "POST", "/models/h1/invoke", JSON_REQUEST)
        assert (status, _error(body)) == (400, "Request for unknown model: 'h1' is not found")
        # registered twice, or a name taken: 409 in Triton's words
        status, _, body = call(port, "POST", "/models", load, target)
        assert (status, _error(body)) == (409, f"model repository '{first}' has already been registered")
        status, _, body = call(port, "POST", "/models", json.dumps({"model_name": "h3", "url": str(second)}).encode(),
                               target)
        assert (status, _error(body)) == (409, "failed to register 'model-cpu.tar.gz', there is a conflicting "
                                               "mapping for 'model-cpu.tar.gz'")
        missing = tmp = first.parent / "missing"
        status, _, body = call(port, "POST", "/models", json.dumps({"model_name": "h5", "url": str(tmp)}).encode(),
                               _target("m5"))
        assert (status, _error(body)) == (400, f"failed to register '{missing}', repository not found")
        # /invocations has no default model in multi-model mode
        status, _, body = call(port, "POST", "/invocations", JSON_REQUEST)
        assert status == 404 and "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in _error(body)
        assert call(port, "DELETE", "/models/h9")[::2] == (404, b"")
        assert call(port, "DELETE", "/models/h1", b"", target)[::2] == (200, b"")
        assert call(port, "GET", "/models/h1")[::2] == (404, b"")
        assert call(port, "POST", "/models/h1/invoke", JSON_REQUEST, target)[::2] == (404, b"")
        # the name is free again
        status, _, _ = call(port, "POST", "/models", json.dumps({"model_name": "h3", "url": str(second)}).encode(),
                            target)
        assert status == 200
        status, _, body = call(port, "GET", "/models")
        # Triton 2.51 lists {} for each model (it asks readiness of the hash); each model is listed here
        expected = [{}] if kind == "real_triton" else [{"modelName": "h3", "modelUrl": str(second)}]
        assert (status, json.loads(body)) == (200, {"models": expected})


def test_a_malformed_load_is_refused_and_the_server_serves_on(multi_models: tuple[Path, Path, Path]) -> None:
    """Real Triton 2.51 answers 400 and then aborts on the missing key; here it is a 400 and nothing more."""
    empty, first, _ = multi_models
    with sagemaker_server("triton_nb", empty, multi_model=True) as port:
        for body in (b"{bad json", b"[1, 2]", json.dumps({"model_name": "h"}).encode()):
            status, _, answer = call(port, "POST", "/models", body, _target("m"))
            assert status == 400 and ("JSON" in _error(answer) or "'url'" in _error(answer)), body
        for url in ("/proc/self", "/sys", "/dev/shm/../shm"):
            status, _, answer = call(port, "POST", "/models", json.dumps({"model_name": "h", "url": url}).encode())
            assert status == 400 and "cannot start with /dev/, /proc/, or /sys/" in _error(answer), url
        # a folder with models but no ensemble: which to load is not guessed
        both = first.parent / "both"
        shutil.copytree(first / "double", both / "one")
        shutil.copytree(first / "double", both / "two")
        status, _, answer = call(port, "POST", "/models", json.dumps({"model_name": "h", "url": str(both)}).encode())
        assert status == 400 and "2 model folders and no ensemble" in _error(answer)
        # a model folder's url serves that model (real Triton 2.51 needs SageMaker's /opt/ml/models/<hash>/model)
        url = json.dumps({"model_name": "h1", "url": str(first / "double")}).encode()
        assert call(port, "POST", "/models", url, _target("m1"))[0] == 200
        status, _, answer = call(port, "POST", "/models/h1/invoke", JSON_REQUEST, _target("m1"))
        assert status == 200 and json.loads(answer)["model_name"] == "m1"


def test_loads_need_network_model_control_and_follow_the_restricted_apis(multi_models: tuple[Path, Path, Path]
                                                                          ) -> None:
    empty, first, _ = multi_models
    load = json.dumps({"model_name": "h1", "url": str(first)}).encode()
    server = triton_nb.serve(empty, allow_sagemaker=True, sagemaker_port=0, load_models=[])
    try:
        port = int(server.endpoints["sagemaker"].rsplit(":", 1)[1])
        status, _, body = call(port, "POST", "/models", load, _target("m"))
        assert status == 403 and "network_model_control" in _error(body)
    finally:
        server.stop()
    server = triton_nb.serve(empty, allow_sagemaker=True, sagemaker_port=0, load_models=[], network_model_control=True,
                             http_restricted_api=["model-repository:admin-key=secret"])
    try:
        port = int(server.endpoints["sagemaker"].rsplit(":", 1)[1])
        for method, path in (("POST", "/models"), ("GET", "/models"), ("DELETE", "/models/h1")):
            status, _, body = call(port, method, path, load if method == "POST" else b"", _target("m"))
            assert status == 403 and "admin-key" in _error(body), (method, path)
        assert call(port, "POST", "/models", load, {**_target("m"), "admin-key": "secret"})[0] == 200
        assert call(port, "POST", "/models/h1/invoke", JSON_REQUEST, _target("m"))[0] == 200  # inference is open
    finally:
        server.stop()


def test_the_sagemaker_port_binds_to_loopback_and_is_listed_with_the_other_endpoints(single_repo: Path) -> None:
    with _environment(SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="double"):
        server = triton_nb.serve(single_repo, allow_sagemaker=True, sagemaker_port=0, http_port=0)
    try:
        endpoints: dict[str, Any] = server.endpoints
        assert set(endpoints) == {"http", "sagemaker"}
        assert endpoints["sagemaker"].startswith("127.0.0.1:")
    finally:
        server.stop()


@pytest.mark.parametrize("kind", SERVER_PARAMS)
def test_a_raw_binary_request_on_the_kserve_route_is_read_as_triton_reads_it(kind: str, single_repo: Path) -> None:
    """``Inference-Header-Content-Length: 0``: the body is the only input's bytes (one row), and the
    outputs come back binary — the same reading as SageMaker's header size 0."""
    from tests.helpers.conformance_servers import start_server

    server = start_server(kind, single_repo)
    try:
        port = server.endpoint.http_url.rsplit(":", 1)[1]
        status, _, body = call(int(port), "POST", "/v2/models/double/infer", np.array([5], np.float32).tobytes(),
                               {"Inference-Header-Content-Length": "0"})
        assert status == 200
        header = json.loads(body[:body.index(b"}]}") + 3])
        assert header["outputs"][0]["parameters"] == {"binary_data_size": 4}
        assert np.frombuffer(body[-4:], np.float32).tolist() == [10.0]
    finally:
        server.stop()


OUT_OF_MEMORY_AT_LOAD = """
class TritonPythonModel:
    def initialize(self, args):
        raise MemoryError("no room for the trees")

    def execute(self, requests):
        return []
"""
OUT_OF_MEMORY_AT_INVOKE = """
class TritonPythonModel:
    def execute(self, requests):
        raise MemoryError("no room for this batch")
"""


@pytest.mark.parametrize("kind", SERVER_PARAMS)
def test_running_out_of_memory_is_507_so_sagemaker_makes_room(kind: str, tmp_path: Path) -> None:
    """Triton answers a load or an invoke that ran out of memory 507, which tells SageMaker to unload
    other models and try again; any other failure is a 400."""
    empty = tmp_path / "empty"
    empty.mkdir()
    write_model(tmp_path / "at_load", "double", OUT_OF_MEMORY_AT_LOAD, SIMPLE_CONFIG.format(name="double"))
    write_model(tmp_path / "at_invoke", "double", OUT_OF_MEMORY_AT_INVOKE, SIMPLE_CONFIG.format(name="double"))
    write_model(tmp_path / "broken", "double", "raise ImportError('no module')\n", SIMPLE_CONFIG.format(name="double"))
    def load(hash_name: str, folder: str, target: str) -> tuple[int, str | None, bytes]:
        body = json.dumps({"model_name": hash_name, "url": str(tmp_path / folder)}).encode()
        return call(port, "POST", "/models", body, _target(target))

    with sagemaker_server(kind, empty, multi_model=True) as port:
        status, _, body = load("h1", "at_load", "a")
        assert status == 507 and "MemoryError" in _error(body)
        assert load("h2", "broken", "b")[0] == 400
        assert load("h3", "at_invoke", "c")[0] == 200
        status, _, body = call(port, "POST", "/models/h3/invoke", JSON_REQUEST, _target("c"))
        assert status == 507 and "MemoryError" in _error(body)
        # the failed loads left nothing registered: the same archives load again under other names
        assert call(port, "GET", "/models/h1")[::2] == (404, b"")
