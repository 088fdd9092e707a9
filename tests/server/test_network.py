"""The network front ends: what the conformance suite (tests/frontends) cannot reach through
tritonclient — body limits, compression, ports and addresses, model control rules over the
network, graceful stop, gRPC streaming of decoupled models, and `triton-nb serve`."""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.client
import json
import logging
import re
import signal
import socket
import threading
import zlib
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.scale_models import DECOUPLED_CONFIG, DECOUPLED_MODEL, write_gated_model, write_python_model
from tests.helpers.serve_cli import start_serve
from tests.helpers.waiting import wait_until
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError, UnavailableError

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60  # the longest any wait may take: it only keeps a broken server from hanging the suite


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # a connection the kernel had queued as the listening socket closed is reset, not refused:
        # the front end has stopped listening all the same
        return True
    except OSError:  # (a connect that timed out, say, on a loaded machine): ask again
        return False
    return False


def _request(port: int, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _infer_body(values: list[float], **extra: object) -> bytes:
    rows = len(values) // 2
    return json.dumps({"inputs": [{"name": "X", "shape": [rows, 2], "datatype": "FP32", "data": values}],
                       **extra}).encode()


@pytest.fixture
def network_server(repo):
    write_python_model(repo, "counter", DECOUPLED_CONFIG, DECOUPLED_MODEL)
    with serve(repo, http_port=0, grpc_port=0, metrics_port=0, max_request_bytes=64 * 1024,
               network_model_control=True) as server:
        yield server


def test_port_zero_reports_the_bound_ports_on_loopback(network_server):
    endpoints = network_server.endpoints
    assert set(endpoints) == {"http", "grpc", "metrics"}
    for name, port in (("http", network_server.http_port), ("grpc", network_server.grpc_port),
                       ("metrics", network_server.metrics_port)):
        assert port > 0 and endpoints[name] == f"127.0.0.1:{port}"
    status, _, _ = _request(network_server.http_port, "GET", "/v2/health/live")
    assert status == 200


def test_no_ports_means_no_network(repo):
    with serve(repo) as server:
        assert server.endpoints == {} and server.http_port is None


def test_a_taken_port_fails_the_start_clearly(repo):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UnavailableError, match=rf"HTTP service cannot listen on 127\.0\.0\.1:{port}"):
            serve(repo, http_port=port)
    assert not any(t.name == "triton-nb-frontends" for t in threading.enumerate())


def test_binding_beyond_loopback_warns(repo, caplog):
    with caplog.at_level(logging.WARNING, logger="triton_nb"), serve(repo, http_port=0, http_address="0.0.0.0"):
        pass
    assert "reachable beyond this machine" in caplog.text


def test_compressed_request_bodies_and_responses(network_server):
    port = network_server.http_port
    body = _infer_body([1.0, 2.0])
    for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        status, _, answer = _request(port, "POST", "/v2/models/scale/infer", packed, {"Content-Encoding": encoding})
        assert status == 200, answer
        assert json.loads(answer)["outputs"][0]["data"] == [2.0, 4.0]
    status, headers, answer = _request(port, "POST", "/v2/models/scale/infer", body, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(answer))["outputs"][0]["data"] == [2.0, 4.0]
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", body, {"Content-Encoding": "br"})
    assert status == 501 and "unsupported Content-Encoding 'br'" in json.loads(answer)["error"]
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", b"not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and "does not decompress" in json.loads(answer)["error"]


def test_request_body_limits_hold_also_after_decompression(network_server):
    port = network_server.http_port
    big = _infer_body([1.0] * 20_000)  # about 80 kB of JSON, over the 64 kB limit
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", big)
    assert status == 413 and "over the limit of 65536 bytes" in json.loads(answer)["error"]
    bomb = gzip.compress(b" " * (10 * 1024 * 1024))  # 10 kB that inflates to 10 MB
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "decompressed request body" in json.loads(answer)["error"]
    assert _request(port, "POST", "/v2/models/scale/infer", _infer_body([1.0, 2.0]))[0] == 200  # still serving


def test_binary_tensors_with_bytes_and_a_mismatched_header(network_server):
    port = network_server.http_port
    x = np.array([[1.5, -2.0]], np.float32)
    header = json.dumps({"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 8}}],
                         "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}).encode()
    status, headers, answer = _request(port, "POST", "/v2/models/scale/infer", header + x.tobytes(),
                                       {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    split = int(headers["inference-header-content-length"])
    meta = json.loads(answer[:split])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(np.frombuffer(answer[split:], np.float32), x.ravel() * 2)
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", header + x.tobytes(),
                                 {"Inference-Header-Content-Length": str(len(header) + 100)})
    assert status == 400 and "Inference-Header-Content-Length" in json.loads(answer)["error"]
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", header + x.tobytes() + b"\0\0\0\0",
                                 {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "not claimed by any input" in json.loads(answer)["error"]


@pytest.mark.parametrize(("method", "path", "status", "message"), [
    ("GET", "/v2/nothing", 404, "Not Found"),
    ("GET", "/metrics", 404, "Not Found"),
    ("DELETE", "/v2/health/live", 405, "Method Not Allowed"),
    ("GET", "/v2/models/scale/infer", 405, "Method Not Allowed"),
    ("GET", "/v2/models/nope", 404, "Request for unknown model: 'nope' is not found"),
    ("GET", "/v2/models/scale/versions/x", 404, "Not Found"),
    ("GET", "/v2/models/nope/stats", 400, "requested model 'nope' is not available"),
])
def test_routes_answer_with_triton_errors(network_server, method, path, status, message):
    answer_status, headers, answer = _request(network_server.http_port, method, path)
    assert answer_status == status
    assert headers["content-type"] == "application/json"
    assert message in json.loads(answer)["error"]


def test_health_and_readiness_answer_as_triton(network_server):
    port = network_server.http_port
    assert _request(port, "GET", "/v2/health/ready")[::2] == (200, b"")
    assert _request(port, "GET", "/v2/models/scale/ready")[::2] == (200, b"")
    assert _request(port, "GET", "/v2/models/nope/ready")[::2] == (400, b'{"error":"Model version not ready"}')


def test_load_with_config_and_file_overrides_over_http(network_server):
    port = network_server.http_port
    config = {"name": "scale", "backend": "python", "max_batch_size": 4,
              "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
              "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
              "parameters": {"factor": {"string_value": "10"}}}
    model_py = (network_server.repository / "scale" / "1" / "model.py").read_bytes()
    body = {"parameters": {"config": json.dumps(config), "file:1/model.py": base64.b64encode(model_py).decode()}}
    status, _, answer = _request(port, "POST", "/v2/repository/models/scale/load", json.dumps(body).encode())
    assert (status, answer) == (200, b"")
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", _infer_body([1.0, 2.0]))
    assert json.loads(answer)["outputs"][0]["data"] == [10.0, 20.0]
    assert json.loads(_request(port, "GET", "/v2/models/scale/config")[2])["max_batch_size"] == 4
    for key in ("file:../escape.py", "file:/etc/passwd", "file:1/../../x.py"):
        body = {"parameters": {"config": json.dumps(config), key: base64.b64encode(b"x").decode()}}
        status, _, answer = _request(port, "POST", "/v2/repository/models/scale/load", json.dumps(body).encode())
        assert status == 400 and "must be a relative path inside the model folder" in json.loads(answer)["error"]
    assert not (network_server.repository / "escape.py").exists()
    status, _, answer = _request(port, "POST", "/v2/repository/models/scale/unload", b"")
    assert status == 200
    status, _, answer = _request(port, "POST", "/v2/models/scale/infer", _infer_body([1.0, 2.0]))
    assert status == 404 and "has no available versions" in json.loads(answer)["error"]
    # the repository index call of tritonclient.http sends no body and no content type
    index = httpclient.InferenceServerClient(f"127.0.0.1:{port}").get_model_repository_index()
    assert {"name": "scale", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index


def test_network_model_control_is_refused_unless_explicit(repo):
    with serve(repo, model_control_mode="none", http_port=0, grpc_port=0) as server:
        status, _, answer = _request(server.http_port, "POST", "/v2/repository/models/scale/unload", b"{}")
        assert status == 503
        assert "explicit model unload is not allowed if model control mode is NONE" in json.loads(answer)["error"]
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        with pytest.raises(InferenceServerException, match="not allowed if model control mode is NONE") as caught:
            client.load_model("scale")
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert server.is_model_ready("scale")


def test_network_model_control_is_off_by_default_even_in_explicit_mode(repo):
    """A load may carry a model.py, so loading over the network is opt-in; the kernel's own calls
    are not network calls."""
    with serve(repo, http_port=0, grpc_port=0) as server:
        assert server.model_control_mode == "explicit"
        load = json.dumps({"parameters": {"file:1/model.py": base64.b64encode(b"import os").decode()}}).encode()
        for route, body in (("load", load), ("unload", b"{}")):
            status, _, answer = _request(server.http_port, "POST", f"/v2/repository/models/scale/{route}", body)
            assert status == 403
            assert json.loads(answer)["error"] == (
                f"model 'scale': {route} over the network is off; start the server with network_model_control=True "
                f"(triton-nb serve: --model-control-mode=explicit) to allow it")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException, match="over the network is off") as caught:
                call("scale")
            assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
        assert server.is_model_ready("scale")
        assert "import os" not in (repo / "scale" / "1" / "model.py").read_text()
        server.unload_model("scale")  # the notebook itself may
        assert not server.is_model_ready("scale")


def test_logging_settings(network_server):
    port = network_server.http_port
    settings = json.loads(_request(port, "GET", "/v2/logging")[2])
    assert settings["log_verbose_level"] == 0 and settings["log_info"] is True
    try:
        status, _, answer = _request(port, "POST", "/v2/logging", json.dumps({"log_verbose_level": 1}).encode())
        assert status == 200 and json.loads(answer)["log_verbose_level"] == 1
        assert logging.getLogger("triton_nb").getEffectiveLevel() == logging.DEBUG
        status, _, answer = _request(port, "POST", "/v2/logging", json.dumps({"log_file": "/tmp/x"}).encode())
        assert status == 400 and "cannot be changed over the network" in json.loads(answer)["error"]
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{network_server.grpc_port}")
        assert client.get_log_settings(as_json=True)["settings"]["log_verbose_level"]["uint32_param"] == 1
    finally:
        _request(port, "POST", "/v2/logging", json.dumps({"log_verbose_level": 0}).encode())
    assert logging.getLogger("triton_nb").getEffectiveLevel() == logging.INFO


def test_grpc_stream_serves_decoupled_models_and_reports_errors_in_the_stream(network_server):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{network_server.grpc_port}")
    arrived: list = []
    done = threading.Event()

    def callback(result, error):
        arrived.append(error if error is not None else result)
        if len(arrived) == 5:
            done.set()

    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([3], np.int32))
    bad = grpcclient.InferInput("X", [1, 2], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 2), np.int32))
    client.start_stream(callback=callback)
    try:
        client.async_stream_infer("counter", [n], request_id="c")
        client.async_stream_infer("scale", [bad], request_id="bad")
        x = grpcclient.InferInput("X", [1, 2], "FP32")
        x.set_data_from_numpy(np.array([[1, 2]], np.float32))
        client.async_stream_infer("scale", [x], request_id="good")
        assert done.wait(10), arrived
    finally:
        client.stop_stream()
    errors = [a for a in arrived if isinstance(a, InferenceServerException)]
    results = [a for a in arrived if not isinstance(a, InferenceServerException)]
    assert len(errors) == 1 and "data-type is 'INT32', but model 'scale' expects 'FP32'" in str(errors[0])
    counts = sorted(int(r.as_numpy("I")[0]) for r in results if r.get_response().id == "c")
    assert counts == [0, 1, 2]
    (good,) = [r for r in results if r.get_response().id == "good"]
    np.testing.assert_array_equal(good.as_numpy("Y"), [[2, 4]])


def test_grpc_refuses_decoupled_models_on_unary_infer_and_oversize_messages(repo):
    write_python_model(repo, "counter", DECOUPLED_CONFIG, DECOUPLED_MODEL)
    with serve(repo, grpc_port=0, grpc_max_message_bytes=4096) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([3], np.int32))
        with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
            client.infer("counter", [n])
        x = grpcclient.InferInput("X", [2000, 2], "FP32")
        x.set_data_from_numpy(np.ones((2000, 2), np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("scale", [x])
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_stop_answers_requests_in_flight(repo):
    gate = write_gated_model(repo) / "open"
    server = serve(repo, http_port=0, grpc_port=0)
    stopping = threading.Thread(target=server.stop, name="stopping", daemon=True)
    try:
        http_client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        x_http = httpclient.InferInput("X", [1, 2], "FP32")
        x_http.set_data_from_numpy(np.ones((1, 2), np.float32))
        x_grpc = grpcclient.InferInput("X", [1, 2], "FP32")
        x_grpc.set_data_from_numpy(np.ones((1, 2), np.float32))
        pending_http = http_client.async_infer("gated", [x_http])
        results: list = []
        grpc_client.async_infer("gated", [x_grpc], callback=lambda result, error: results.append((result, error)))
        # tritonclient.http sends from a gevent greenlet: waiting must yield to gevent for it to get
        # its request out
        wait_until(lambda: server.pending_requests == 2, "both requests to reach the server", pause=gevent.sleep)
        stopping.start()
        # the front ends are stopping (no new connections) while both requests are still held
        wait_until(lambda: _refuses_connections(server.http_port), "the HTTP front end to stop listening",
                   pause=gevent.sleep)
        assert server.pending_requests == 2
    finally:
        gate.touch()
        if stopping.ident is None:  # the test failed before the stop began
            server.stop()
    stopping.join(timeout=WAIT_S)
    assert not stopping.is_alive(), "stop() did not end once the requests in flight were answered"
    np.testing.assert_array_equal(pending_http.get_result(timeout=WAIT_S).as_numpy("Y"), [[2, 2]])
    wait_until(lambda: results, "the gRPC answer")
    assert results[0][1] is None
    np.testing.assert_array_equal(results[0][0].as_numpy("Y"), [[2, 2]])
    with pytest.raises((ConnectionError, OSError, InferenceServerException)):
        httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}").is_server_live()
    assert not any(t.name == "triton-nb-frontends" for t in threading.enumerate())


def test_metrics_endpoint_serves_prometheus_text(network_server):
    port = network_server.http_port
    _request(port, "POST", "/v2/models/scale/infer", _infer_body([1.0, 2.0]))
    status, headers, answer = _request(network_server.metrics_port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert 'nv_inference_request_success{model="scale",version="1"} 1' in answer.decode()


def test_cli_serve_prints_endpoints_and_stops_on_sigterm(repo):
    process, ports, lines = start_serve(repo, "--model-control-mode=explicit", "--load-model", "scale",
                                        "--max-tensor-elements", "4")
    try:
        assert any(re.match(r"\| scale +\| 1 +\| READY", line) for line in lines), "".join(lines)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['HTTPService']}")
        x = httpclient.InferInput("X", [1, 2], "FP32")
        x.set_data_from_numpy(np.array([[1, 2]], np.float32))
        np.testing.assert_array_equal(client.infer("scale", [x]).as_numpy("Y"), [[2, 4]])
        three = httpclient.InferInput("X", [3, 2], "FP32")
        three.set_data_from_numpy(np.ones((3, 2), np.float32))
        with pytest.raises(InferenceServerException, match="the limit of 4 elements"):  # the flag reached the server
            client.infer("scale", [three])
        client.unload_model("scale")  # explicit mode on the command line is network model control, as tritonserver's
        assert not client.is_model_ready("scale")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
        assert process.returncode == 0, output
        assert "Stopped" in output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_grpc_relay_process_ends_with_the_server_and_its_loss_spares_http(repo):
    # so long an exit timeout that a stop waiting for the lost relay's calls could not end within WAIT_S
    server = serve(repo, http_port=0, grpc_port=0, exit_timeout_secs=3600)
    relay = server._frontends._grpc.process
    assert relay.poll() is None
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert client.is_server_live()
    relay.kill()  # the relay dies: gRPC clients see the connection go, HTTP serves on
    relay.wait()
    status, _, answer = _request(server.http_port, "POST", "/v2/models/scale/infer", _infer_body([1.0, 2.0]))
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2.0, 4.0]
    stopping = threading.Thread(target=server.stop, name="stopping", daemon=True)
    stopping.start()
    stopping.join(timeout=WAIT_S)
    assert not stopping.is_alive(), "stop() waited for the relay that is gone"
    assert not any(t.name == "triton-nb-frontends" for t in threading.enumerate())


def test_the_http_relay_process_ends_with_the_server_and_its_loss_spares_grpc(repo):
    # HTTP is terminated in a process of its own too; losing it costs HTTP, not the server
    server = serve(repo, http_port=0, grpc_port=0, exit_timeout_secs=3600)
    relay = server._frontends._http.process
    assert relay.poll() is None
    status, _, answer = _request(server.http_port, "POST", "/v2/models/scale/infer", _infer_body([1.0, 2.0]))
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [2.0, 4.0]
    relay.kill()
    relay.wait()
    assert _refuses_connections(server.http_port)  # nobody listens on the HTTP port any more
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = grpcclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
    np.testing.assert_array_equal(client.infer("scale", [x]).as_numpy("Y"), [[2.0, 4.0]])
    stopping = threading.Thread(target=server.stop, name="stopping", daemon=True)
    stopping.start()
    stopping.join(timeout=WAIT_S)
    assert not stopping.is_alive(), "stop() waited for the relay that is gone"


def test_stopping_ends_the_http_relay_process_after_answering_what_is_in_flight(repo):
    with serve(repo, http_port=0) as server:
        relay = server._frontends._http.process
        assert relay.poll() is None
        status, _, _ = _request(server.http_port, "GET", "/v2/health/ready")
        assert status == 200
    assert relay.poll() is not None


def test_stopping_ends_the_grpc_relay_process(repo):
    with serve(repo, grpc_port=0) as server:
        relay = server._frontends._grpc.process
    assert relay.poll() is not None


def test_restricted_apis_need_their_header_over_http_and_grpc(repo):
    with serve(repo, model_control_mode="explicit", http_port=0, grpc_port=0, network_model_control=True,
               http_restricted_api="model-repository,logging:admin-key=s3cret",
               grpc_restricted_api=["model-repository:admin-key=s3cret"]) as server:
        port = server.http_port
        status, _, answer = _request(port, "POST", "/v2/repository/models/scale/unload", b"")
        assert status == 403 and json.loads(answer) == {"error": "This API is restricted, expecting header 'admin-key'"}
        assert _request(port, "GET", "/v2/logging")[0] == 403
        assert _request(port, "GET", "/v2/logging", headers={"Admin-Key": "wrong"})[0] == 403
        assert _request(port, "GET", "/v2/logging", headers={"Admin-Key": "s3cret"})[0] == 200
        assert _request(port, "POST", "/v2/models/scale/infer", _infer_body([1.0, 2.0]))[0] == 200  # not restricted
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        # gRPC clients of real Triton send the key with Triton's prefix
        expected = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
        with pytest.raises(InferenceServerException, match=expected) as caught:
            client.unload_model("scale", headers={"admin-key": "s3cret"})
        assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
        assert server.is_model_ready("scale")
        client.unload_model("scale", headers={"triton-grpc-protocol-admin-key": "s3cret"})
        assert not server.is_model_ready("scale")
        assert client.is_server_live()  # health is open
    with pytest.raises(InvalidArgumentError, match="unknown API group 'everything'"):
        serve(repo, http_port=0, http_restricted_api="everything:k=v")


def test_both_relays_frame_as_the_server_reads():
    from triton_nb.server.frontends import relay_process
    from triton_nb.server.frontends.grpc import relay as grpc_relay
    from triton_nb.server.frontends.http import relay as http_relay

    # each relay script defines its framing itself (it imports nothing of the package)
    assert grpc_relay.HEADER.format == http_relay.HEADER.format == relay_process.HEADER.format


def test_a_client_polling_the_http_port_while_the_server_starts_gets_answers_not_a_failed_start(repo):
    # a readiness probe polls the port from the moment it is bound: its requests may reach the HTTP
    # relay before the relay has told the server it serves
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    answered: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):  # not listening yet
                answered.append(_request(port, "GET", "/v2/health/live")[0])

    poller = threading.Thread(target=poll, name="probe", daemon=True)
    poller.start()
    try:
        for _ in range(3):  # each start races the probe anew
            with serve(repo, http_port=port) as server:
                wait_until(lambda: 200 in answered, "the probe answered")
                answered.clear()
                assert _request(server.http_port, "GET", "/v2/health/ready")[0] == 200
    finally:
        stop.set()
        poller.join(timeout=WAIT_S)
