"""Faults at the network edge, each with one defined outcome: slow clients (a trickled head or
body gets 408 within the read timeout, an oversize head 431), hundreds of idle connections (served
around, closed after the keep-alive timeout, nothing left growing), gRPC clients that cancel or
time out while the model runs (nothing logged, nothing left pending), and stopping with requests in
flight over HTTP and gRPC — ``server.stop()`` and SIGTERM to ``triton-nb serve`` — where every
request is answered or failed with a clear error, and none hangs.

Clients that disconnect mid-request over HTTP are in test_network_fuzz.py; stopping with one
request in flight per protocol is in test_network.py.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.helpers.scale_models import SCALE_CONFIG, write_python_model, write_scale_model
from tests.helpers.serve_cli import start_serve
from tests.helpers.waiting import wait_until
from triton_nb import InferenceServer, serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.server.frontends import network
from triton_nb.server.frontends.http.connections import MAX_HEAD_BYTES

ROOT = Path(__file__).resolve().parents[2]
READ_TIMEOUT_S = 2.0  # short, so a slow client is cut in a test's time
KEEP_ALIVE_S = 1.0
HANG_GUARD_S = 30.0  # generous: only "it did not hang", never a timing
SLOW_SLEEP_S = 0.25  # the slow model's time per batch of up to 8
IN_FLIGHT = 32  # requests in flight per protocol when the server stops
WATCHED_LOGGERS = ("triton_nb", "uvicorn", "uvicorn.error", "grpc")
GOOD_BODY = json.dumps({"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}).encode()


def _slow_model(repo: Path, sleep_s: float = SLOW_SLEEP_S) -> None:
    write_scale_model(repo, name="slow", extra=(
        'dynamic_batching { max_queue_delay_microseconds: 2000 }\n'
        f'parameters {{ key: "sleep_s" value: {{ string_value: "{sleep_s}" }} }}'))


class _Errors(logging.Handler):
    """ERROR records from the server's loggers: a fault must not leave a traceback in the log."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if all(record is not seen for seen in self.records):  # a record reaches parent loggers too
            self.records.append(record)

    def report(self) -> str:
        return "\n".join(f"{r.name}: {r.getMessage()}" for r in self.records)


@pytest.fixture
def errors() -> Iterator[_Errors]:
    handler = _Errors()
    loggers = [logging.getLogger(name) for name in WATCHED_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@dataclass
class _Served:
    server: InferenceServer
    stub: service_pb2_grpc.GRPCInferenceServiceStub

    @property
    def port(self) -> int:
        return self.server.http_port


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[_Served]:
    repo = tmp_path_factory.mktemp("faults_repo")
    write_scale_model(repo)
    _slow_model(repo)
    server = serve(repo, http_port=0, grpc_port=0, http_read_timeout_secs=READ_TIMEOUT_S,
                   http_timeout_keep_alive_secs=KEEP_ALIVE_S)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        yield _Served(server, service_pb2_grpc.GRPCInferenceServiceStub(channel))
    finally:
        channel.close()
        server.stop()


# ---------------------------------------------------------------------------------------- helpers
def _post(port: int, body: bytes = GOOD_BODY, model: str = "scale") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_GUARD_S)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _grpc_request(model: str = "scale") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="X", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(struct.pack("<2f", 1.0, 2.0))
    return request


def _assert_serving(served: _Served) -> None:
    status, body = _post(served.port)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0, 4.0], body
    response = served.stub.ModelInfer(_grpc_request(), timeout=HANG_GUARD_S)
    assert struct.unpack("<2f", response.raw_output_contents[0]) == (2.0, 4.0)


def _fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int | str = "self") -> int:
    return int(re.search(r"Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))


def _trickle(served: _Served, head: bytes, piece: bytes, every_s: float = 0.25) -> tuple[bytes, int]:
    """Send ``head``, then ``piece`` every ``every_s`` — steady progress, never done — while a
    normal client is served in between; returns what the server sent before closing, and how many
    normal requests were served meanwhile."""
    served_meanwhile = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", served.port), timeout=HANG_GUARD_S) as client:
        client.sendall(head)
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed: read what it said
                client.sendall(piece)
            _assert_serving(served)
            served_meanwhile += 1
            client.settimeout(every_s)
            try:
                chunk = client.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not chunk:  # the server closed the connection
                break
            answer += chunk
        else:
            raise AssertionError(f"the trickling client was not cut off within {HANG_GUARD_S:g} s")
    return answer, served_meanwhile


def _parse_answer(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


# ---------------------------------------------------------------------------------------- slow clients
@pytest.mark.parametrize("trickled", ["body", "head"])
def test_a_request_trickled_slower_than_the_read_timeout_gets_408_while_others_are_served(served, errors, trickled):
    if trickled == "body":  # the whole head, promising 1000 bytes of body, then 5 bytes at a time
        head = b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        piece = b"     "
    else:  # the request line, then one more header line at a time
        head, piece = b"POST /v2/models/scale/infer HTTP/1.1\r\n", b"X-Slow: 1\r\n"
    answer, served_meanwhile = _trickle(served, head, piece)
    status, headers, body = _parse_answer(answer)
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body) == {"error": f"the request did not arrive within {READ_TIMEOUT_S:g} s "
                                         f"(http_read_timeout_secs)"}
    assert served_meanwhile >= 2  # others were served while it trickled
    _assert_serving(served)
    assert not errors.records, errors.report()


def test_a_request_that_arrives_in_pieces_within_the_read_timeout_is_served(served):
    # a split head, then a 1 MB body sent with its second half: the body is not taken for head
    # bytes, and pauses shorter than the timeout are fine
    body = GOOD_BODY + b" " * (1 << 20)
    head = f"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=HANG_GUARD_S) as client:
        # pauses short against the whole request's deadline, which a loaded machine's 1 MB send also counts
        client.sendall(head[:20])
        time.sleep(0.05)
        client.sendall(head[20:] + b"\r\n" + body[:1000])
        time.sleep(0.05)
        client.sendall(body[1000:])
        answer = b""
        while b'"outputs"' not in answer:
            chunk = client.recv(65536)
            assert chunk, answer
            answer += chunk
    status, _, answer_body = _parse_answer(answer)
    assert status == 200 and json.loads(answer_body)["outputs"][0]["data"] == [2.0, 4.0]


def test_an_oversize_request_head_gets_431_and_the_connection_closes(served, errors):
    # a head within the limit is served; one over it is refused as soon as it is over, not buffered
    status, _ = _post_with_header(served.port, "x" * (MAX_HEAD_BYTES // 2))
    assert status == 200
    with socket.create_connection(("127.0.0.1", served.port), timeout=HANG_GUARD_S) as client:
        client.sendall(b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        try:
            for _ in range(64):  # 4 MB of headers, far past the limit, unless cut off first
                client.sendall(b"X-Pad: " + b"x" * 65536 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        with_eof = True
        try:
            while chunk := client.recv(65536):
                answer += chunk
        except ConnectionResetError:  # the server closed with our unread headers in its buffer
            with_eof = False
    assert answer or not with_eof, "the server closed without a word"
    if answer:
        status, headers, body = _parse_answer(answer)
        assert status == 431 and headers["connection"] == "close"
        assert json.loads(body) == {"error": f"the request head is over the limit of {MAX_HEAD_BYTES} bytes"}
    _assert_serving(served)
    assert not errors.records, errors.report()


def _post_with_header(port: int, value: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_GUARD_S)
    try:
        connection.request("POST", "/v2/models/scale/infer", body=GOOD_BODY, headers={"X-Pad": value})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_read_and_keep_alive_timeouts_must_be_positive(repo):
    for name in ("http_read_timeout_secs", "http_timeout_keep_alive_secs"):
        with pytest.raises(InvalidArgumentError, match=rf"{name} must be a number of seconds > 0, got 0"):
            serve(repo, http_port=0, **{name: 0})


# ---------------------------------------------------------------------------------------- idle connections
def test_hundreds_of_idle_connections_are_served_around_then_closed(served, errors):
    _assert_serving(served)  # every thread the server starts is started
    relay = served.server._frontends._grpc.process.pid
    http_relay = served.server._frontends._http.process.pid  # HTTP's connections are held there
    fds_before, threads_before = _fds(), _threads()
    relay_fds_before, relay_threads_before = _fds(relay), _threads(relay)
    http_fds_before, http_threads_before = _fds(http_relay), _threads(http_relay)
    idle = [socket.create_connection(("127.0.0.1", served.port), timeout=HANG_GUARD_S) for _ in range(500)]
    grpc_idle = [socket.create_connection(("127.0.0.1", served.server.grpc_port), timeout=HANG_GUARD_S)
                 for _ in range(50)]
    used = [socket.create_connection(("127.0.0.1", served.port), timeout=HANG_GUARD_S) for _ in range(20)]
    blank = socket.create_connection(("127.0.0.1", served.port), timeout=HANG_GUARD_S)
    try:
        for client in used:  # one request each, then idle: the keep-alive timeout applies
            client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(65536).startswith(b"HTTP/1.1 200")
        _assert_serving(served)  # served promptly with all of them open
        wait_until(lambda: _fds(relay) >= relay_fds_before + len(grpc_idle), "the relay accepted them")
        assert _fds(http_relay) >= http_fds_before + len(idle) + len(used)
        # blank lines are not a request: they do not keep a connection open
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            try:
                blank.sendall(b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            blank.settimeout(0.2)
            try:
                if blank.recv(1) == b"":
                    break
            except ConnectionResetError:  # closed while a blank line was in flight: the kernel resets
                break
            except TimeoutError:
                continue
        else:
            raise AssertionError("a connection sending only blank lines was never closed")
        for client in idle + used:  # each is closed by the server after the keep-alive timeout
            client.settimeout(HANG_GUARD_S)
            assert client.recv(65536) == b""
        assert _threads() <= threads_before + 1  # no thread per connection
        assert _threads(http_relay) <= http_threads_before + 1
    finally:
        for client in idle + grpc_idle + used + [blank]:
            client.close()
    # closed here, the server's ends go too: nothing left growing in either process
    wait_until(lambda: _fds() <= fds_before + 5, "file descriptors back to what they were")
    wait_until(lambda: _fds(relay) <= relay_fds_before + 5, "the relay's file descriptors back")
    wait_until(lambda: _fds(http_relay) <= http_fds_before + 5, "the HTTP relay's file descriptors back")
    assert _threads(relay) <= relay_threads_before + 2
    _assert_serving(served)
    assert not errors.records, errors.report()


# ---------------------------------------------------------------------------------------- gRPC clients that go
def test_grpc_clients_that_cancel_or_time_out_mid_execution_leave_the_server_serving(served, errors):
    _assert_serving(served)
    stub = served.stub
    link = served.server._frontends._grpc.link
    # deadlines that expire while the slow model executes
    expired = [stub.ModelInfer.future(_grpc_request("slow"), timeout=0.1) for _ in range(8)]
    # calls cancelled while the model executes
    cancelled = [stub.ModelInfer.future(_grpc_request("slow"), timeout=HANG_GUARD_S) for _ in range(8)]
    # streams cancelled, or out of time, with a request executing
    release = threading.Event()
    streams = [stub.ModelStreamInfer(_one_then_wait(_grpc_request("slow"), release),
                                     timeout=0.3 if index % 2 else HANG_GUARD_S) for index in range(4)]
    wait_until(lambda: served.server.pending_requests > 0, "the calls reached the model")
    time.sleep(0.05)
    # a call whose batch finished before its cancel came (a stalled test thread) has its answer;
    # the rest, at least the calls queued behind the first batch, are cancelled
    in_time = [call.cancel() for call in cancelled]
    assert any(in_time)
    for index, stream in enumerate(streams):
        if not index % 2:
            stream.cancel()
    for call in expired:
        with pytest.raises(grpc.RpcError) as caught:
            call.result(timeout=HANG_GUARD_S)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for call, cancelled_in_time in zip(cancelled, in_time, strict=True):
        assert call.cancelled() if cancelled_in_time else call.result(timeout=HANG_GUARD_S).outputs
    for index, stream in enumerate(streams):
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
        expected = grpc.StatusCode.DEADLINE_EXCEEDED if index % 2 else grpc.StatusCode.CANCELLED
        assert caught.value.code() == expected
    release.set()
    # the model finishes what it had; nothing is left pending, and no stream is left open
    wait_until(lambda: served.server.pending_requests == 0, "no request pending")
    wait_until(lambda: not link._streams and not link._tasks, "no stream left open on the server")
    _assert_serving(served)
    stream_answers = list(stub.ModelStreamInfer(iter([_grpc_request("slow")]), timeout=HANG_GUARD_S))
    assert len(stream_answers) == 1 and not stream_answers[0].error_message
    assert not errors.records, errors.report()


def _one_then_wait(first: pb.ModelInferRequest, release: threading.Event) -> Iterator[pb.ModelInferRequest]:
    """A stream's requests: one, then no more and no end until released."""
    yield first
    release.wait(HANG_GUARD_S)


# ---------------------------------------------------------------------------------------- stopping
GATED_MODEL = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X * 2, once the file named by the 'gate' parameter exists (so a test knows every request
    is in flight before any is answered); then sleep_s per batch."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.gate = parameters["gate"]["string_value"]
        self.sleep = float(parameters["sleep_s"]["string_value"])

    def execute(self, requests):
        deadline = time.monotonic() + 30
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(self.sleep)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                                                            * 2)]) for r in requests]
'''


def _gated_model(repo: Path, sleep_s: float) -> Path:
    """The model ``gated``: batches of exactly 8 (the delay is long, so only a full batch leaves)
    that wait for the gate file, returned, to exist."""
    gate = repo.parent / f"{repo.name}-gate"
    config = SCALE_CONFIG.format(name="gated", factor=2.0, max_batch_size=8, count=1, extra=(
        "dynamic_batching { max_queue_delay_microseconds: 30000000 }\n"
        f'parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}\n'
        f'parameters {{ key: "sleep_s" value: {{ string_value: "{sleep_s}" }} }}'))
    write_python_model(repo, "gated", config, GATED_MODEL)
    return gate


def _fire(http_port: int, grpc_port: int) -> tuple[list[Future], list[Any], ThreadPoolExecutor, grpc.Channel]:
    """IN_FLIGHT requests to ``gated`` over HTTP (one connection each) and over gRPC, left in flight."""
    pool = ThreadPoolExecutor(IN_FLIGHT)
    http_calls = [pool.submit(_http_outcome, http_port) for _ in range(IN_FLIGHT)]
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    grpc_calls = [stub.ModelInfer.future(_grpc_request("gated"), timeout=HANG_GUARD_S * 2) for _ in range(IN_FLIGHT)]
    return http_calls, grpc_calls, pool, channel


def _http_outcome(port: int) -> tuple[str, str]:
    try:
        status, body = _post(port, model="gated")
    except (ConnectionError, http.client.HTTPException) as error:  # includes a connection closed unanswered
        return "connection-error", type(error).__name__
    return str(status), "" if status == 200 else json.loads(body)["error"]


def _grpc_outcome(call: Any) -> tuple[str, str]:
    try:
        response = call.result(timeout=HANG_GUARD_S)
    except grpc.FutureTimeoutError:
        return "hung", ""
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""
    assert struct.unpack("<2f", response.raw_output_contents[0]) == (2.0, 4.0)
    return "OK", ""


def _outcomes(http_calls: list[Future], grpc_calls: list[Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return ([call.result(timeout=HANG_GUARD_S) for call in http_calls],
            [_grpc_outcome(call) for call in grpc_calls])


# a request the stop fails says why: queued and never run, cut by the stop, or refused
_STOP_FAILURE = re.compile(r"model 'gated' was unloaded before the request ran|model 'gated' did not finish the "
                           r"request before the server stopped|the server stopped before the request was answered")


@pytest.mark.parametrize("exit_timeout_secs", [20.0, 1.0], ids=["ample-exit-timeout", "short-exit-timeout"])
def test_stop_answers_or_fails_every_request_in_flight_over_http_and_grpc(repo, errors, exit_timeout_secs):
    # 64 requests in 8 batches of 0.25 s (of 0.5 s with the short timeout): 2 s (4 s) of work
    ample = exit_timeout_secs > 5
    gate = _gated_model(repo, SLOW_SLEEP_S if ample else 2 * SLOW_SLEEP_S)
    server = serve(repo, http_port=0, grpc_port=0, exit_timeout_secs=exit_timeout_secs)
    frontends = server._frontends
    relay = frontends._grpc.process
    http_calls, grpc_calls, pool, channel = _fire(server.http_port, server.grpc_port)
    try:
        wait_until(lambda: server.pending_requests == 2 * IN_FLIGHT, "every request in flight")
        gate.touch()
        started = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - started
        http_outcomes, grpc_outcomes = _outcomes(http_calls, grpc_calls)
    finally:
        gate.touch()
        pool.shutdown()
        channel.close()
    assert stop_s < exit_timeout_secs + HANG_GUARD_S / 2  # a hang guard, not a timing
    if ample:  # every request is answered with its result
        assert http_outcomes == [("200", "")] * IN_FLIGHT
        assert grpc_outcomes == [("OK", "")] * IN_FLIGHT
    else:  # 4 s of work, 1 s to do it: the rest fail at once, with a status and a message that say why
        failed = [o for o in http_outcomes + grpc_outcomes if o not in (("200", ""), ("OK", ""))]
        assert failed
        assert all(o == ("200", "") or (o[0] == "503" and _STOP_FAILURE.search(o[1])) for o in http_outcomes), \
            http_outcomes
        assert all(o == ("OK", "") or (o[0] == "UNAVAILABLE" and _STOP_FAILURE.search(o[1]))
                   for o in grpc_outcomes), grpc_outcomes
    assert server.pending_requests == 0
    assert relay.poll() is not None and not frontends.running
    assert not errors.records, errors.report()


def test_a_request_still_arriving_when_the_server_stops_gets_408_after_the_exit_timeout(repo, errors):
    # the read timeout is a minute, but a stop waits only exit_timeout_secs for a request to arrive
    server = serve(repo, http_port=0, exit_timeout_secs=1.0)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=HANG_GUARD_S) as client:
        client.sendall(b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        # the head is read by the HTTP relay process, out of this test's sight: give it time to
        # (it takes milliseconds; the stop below must find the request already arriving)
        time.sleep(0.5)
        server.stop()
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    status, headers, body = _parse_answer(answer)
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body) == {"error": "the request had not arrived when the server stopped"}
    assert not errors.records, errors.report()  # uvicorn did not have to cancel it


def test_a_stop_that_outlasts_the_front_ends_grace_still_answers_every_request(repo, errors, monkeypatch, capfd):
    # no grace: the front ends cut what is left at exit_timeout_secs, before the core gives up on a
    # batch that hangs (which it does after exit_timeout_secs more); the clients are told why
    monkeypatch.setattr(network, "_ANSWER_GRACE_S", 0.0)
    gate = _gated_model(repo, 0.0)  # never opened while the server stops: the model hangs
    server = serve(repo, http_port=0, grpc_port=0, exit_timeout_secs=1.0)
    pool = ThreadPoolExecutor(4)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        http_calls = [pool.submit(_http_outcome, server.http_port) for _ in range(4)]
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        grpc_calls = [stub.ModelInfer.future(_grpc_request("gated"), timeout=HANG_GUARD_S * 2) for _ in range(4)]
        wait_until(lambda: server.pending_requests == 8, "one batch of 8 executing")
        server.stop()
        http_outcomes, grpc_outcomes = _outcomes(http_calls, grpc_calls)
    finally:
        gate.touch()
        pool.shutdown()
        channel.close()
    stopped = "the server stopped before the request was answered"
    assert http_outcomes == [("503", stopped)] * 4
    assert grpc_outcomes == [("UNAVAILABLE", stopped)] * 4
    # nothing in the server's log; the HTTP relay process prints uvicorn's own word that its grace ran out
    assert not errors.records, errors.report()
    assert "Cancel 4 running task(s), timeout graceful shutdown exceeded" in capfd.readouterr().err


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return children


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # exited (a zombie only waits for its parent to read its status)


def _queued(metrics_port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=HANG_GUARD_S)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    found = re.search(r'nv_inference_pending_request_count\{model="gated",version="1"\} (\d+)', text)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("target", ["process", "process-group"])
def test_sigterm_to_triton_nb_serve_answers_requests_in_flight_and_exits_0(repo, target):
    gate = _gated_model(repo, SLOW_SLEEP_S)
    # a process group of its own, as a service manager starts it
    process, ports, lines = start_serve(repo, "--exit-timeout-secs", "20", "--model-control-mode=explicit",
                                        "--load-model", "gated", new_session=True)
    pool = channel = None
    try:
        relays = _children(process.pid)
        assert len(relays) == 2, relays  # HTTP's and gRPC's
        http_calls, grpc_calls, pool, channel = _fire(ports["HTTPService"], ports["GRPCInferenceService"])
        # one batch of 8 waits at the gate, the other 56 requests are queued: all 64 are in flight
        wait_until(lambda: _queued(ports["Metrics"]) == 2 * IN_FLIGHT - 8, "every request in flight")
        if target == "process":
            process.send_signal(signal.SIGTERM)
        else:  # as systemd does by default: the relay gets it too
            os.killpg(process.pid, signal.SIGTERM)
        while "Stopping: waiting for requests in flight" not in lines[-1]:  # stopping, all still in flight
            lines.append(process.stdout.readline())
            assert lines[-1], "".join(lines)
        gate.touch()
        http_outcomes, grpc_outcomes = _outcomes(http_calls, grpc_calls)
        output, _ = process.communicate(timeout=HANG_GUARD_S)
    finally:
        gate.touch()
        if pool is not None:
            pool.shutdown()
            channel.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    assert "Stopped" in output
    assert "Traceback" not in output and "ERROR" not in output, output
    # the exit timeout is ample: every request in flight gets its result, over both protocols
    assert http_outcomes == [("200", "")] * IN_FLIGHT
    assert grpc_outcomes == [("OK", "")] * IN_FLIGHT
    wait_until(lambda: all(_gone(relay) for relay in relays), "the relay processes are gone")


# ---------------------------------------------------------------------------------------- one connection, many requests
def _read_responses(client: socket.socket, count: int, heads_only: tuple[int, ...] = ()
                    ) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` responses off one connection, in order; those at ``heads_only`` (answers to HEAD)
    have no body whatever their content-length says."""
    buffer, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = client.recv(65536)
            assert chunk, (answers, buffer)
            buffer += chunk
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        status, headers, _ = _parse_answer(head + b"\r\n\r\n")
        length = 0 if len(answers) in heads_only else int(headers.get("content-length", "0"))
        while len(buffer) < length:
            chunk = client.recv(65536)
            assert chunk, (answers, buffer)
            buffer += chunk
        answers.append((status, headers, buffer[:length]))
        buffer = buffer[length:]
    return answers


def test_pipelined_head_expect_continue_and_infer_requests_on_one_connection_are_all_answered(served, errors):
    infer = (f"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(GOOD_BODY)}\r\n\r\n"
             .encode() + GOOD_BODY)
    with socket.create_connection(("127.0.0.1", served.port), timeout=HANG_GUARD_S) as client:
        # three requests in one send (pipelined): an inference, a HEAD, another inference
        client.sendall(infer + b"HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n" + infer)
        answers = _read_responses(client, 3, heads_only=(1,))
        assert [status for status, _, _ in answers] == [200, 405, 200]  # HEAD: Triton's routes are GET
        assert int(answers[1][1]["content-length"]) > 0  # announced, and not sent: the next answer parses
        for _, _, body in answers[0::2]:
            assert json.loads(body)["outputs"][0]["data"] == [2.0, 4.0]
        # a client that waits for 100 Continue before its body gets it, then its answer
        client.sendall(f"POST /v2/models/scale/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                       f"Content-Length: {len(GOOD_BODY)}\r\n\r\n".encode())
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = client.recv(65536)
            assert chunk, interim
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n")
        client.sendall(GOOD_BODY)
        status, _, body = _read_responses(client, 1)[0]
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0, 4.0]
    assert not errors.records, errors.report()
