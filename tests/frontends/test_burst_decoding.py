"""A burst of HTTP or gRPC inference requests that arrived together (one read of the relay's) is
decoded together where that changes nothing a client sees: requests of one signature to an ensemble
on its chain road enter the server as one carried request, and every request is still answered,
failed and counted as if it had come alone (``HttpApp.begin_infer_burst``,
``GrpcServicer.start_infer_burst``, ``InferenceService.infer_carried_async``).

The property every test here holds the burst to: each request's status and body are those the same
request gets on its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from tests.helpers.python_models import write_model
from triton_nb.errors import wire_message, wire_status
from triton_nb.server.core import Server
from triton_nb.server.frontends.grpc.servicer import GrpcServicer
from triton_nb.server.frontends.http.app import HttpApp
from triton_nb.server.frontends.protocol import WireLimits
from triton_nb.server.observability.logs import LogSettings
from triton_nb.tensors import serialize_bytes

WAIT_S = 30

# Y = X * 2 and the request's own id per row; a request holding a negative X fails alone.
DOUBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input in request " + request.request_id())))
                continue
            label = pb_utils.get_input_tensor_by_name(request, "LABEL").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", x * 2),
                pb_utils.Tensor("ID", np.array([[request.request_id().encode() + b":" + v]
                                                for v in label.ravel()], dtype=object))]))
        return responses
"""
DOUBLE_CONFIG = """
name: "double"
backend: "python"
max_batch_size: {max_batch_size}
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }}, {{ name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }}, {{ name: "ID" data_type: TYPE_STRING dims: [ 1 ] }}]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
"""
# Z = Y + 1
INCREMENT = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "Z", pb_utils.get_input_tensor_by_name(r, "Y").as_numpy() + 1)]) for r in requests]
"""
INCREMENT_CONFIG = """
name: "increment"
backend: "python"
max_batch_size: 64
input [{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }]
output [{ name: "Z" data_type: TYPE_FP32 dims: [ 2 ] }]
dynamic_batching { max_queue_delay_microseconds: 0 }
"""
PIPE_CONFIG = """
name: "pipe"
platform: "ensemble"
max_batch_size: 64
input [{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }]
output [{ name: "Z" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "ID" data_type: TYPE_STRING dims: [ 1 ] }]
ensemble_scheduling { step [
  { model_name: "double" model_version: -1 input_map [{ key: "X" value: "X" }, { key: "LABEL" value: "LABEL" }]
    output_map [{ key: "Y" value: "Y" }, { key: "ID" value: "ID" }] },
  { model_name: "increment" model_version: -1 input_map { key: "Y" value: "Y" } output_map { key: "Z" value: "Z" } }
] }
"""


def write_repository(root: Path, max_batch_size: int = 64) -> Path:
    write_model(root, "double", DOUBLE, DOUBLE_CONFIG.format(max_batch_size=max_batch_size))
    write_model(root, "increment", INCREMENT, INCREMENT_CONFIG)
    (root / "pipe" / "1").mkdir(parents=True)
    (root / "pipe" / "config.pbtxt").write_text(PIPE_CONFIG.replace("max_batch_size: 64",
                                                                     f"max_batch_size: {max_batch_size}"))
    return root


def start(root: Path, **settings: Any) -> Server:
    return Server(root, http_port=None, grpc_port=None, metrics_port=None, **settings).start()


@pytest.fixture(params=["thread", "process"])
def server(request: pytest.FixtureRequest, tmp_path: Path):
    with start(write_repository(tmp_path), python_instances=request.param) as started:
        yield started


def body(i: int, rows: int = 1, **changes: Any) -> dict[str, Any]:
    """A plain JSON request to 'pipe' with ``rows`` rows of X = [i, i + 0.5] and LABEL "l<i>"."""
    document: dict[str, Any] = {"id": f"r{i}", "inputs": [
        {"name": "X", "datatype": "FP32", "shape": [rows, 2], "data": [float(i), i + 0.5] * rows},
        {"name": "LABEL", "datatype": "BYTES", "shape": [rows, 1], "data": [f"l{i}"] * rows}]}
    document.update(changes)
    return document


Item = tuple[str, dict[str, Any] | bytes]  # (model, JSON document or raw body)


def answer(app: HttpApp, server: Server, items: list[Item], together: bool) -> list[tuple[int, Any]]:
    """(status, JSON answer) of each item: sent as one burst, or each alone and answered before the next."""
    requests = [(model, "", {}, item if isinstance(item, bytes) else json.dumps(item).encode())
                for model, item in items]
    if together:
        with server.infer_together():  # as the relay's link takes one read
            calls = app.begin_infer_burst(requests)
    else:
        calls = []
        for request in requests:
            calls += app.begin_infer_burst([request])
            if not isinstance(calls[-1], Exception):
                calls[-1].future.exception(timeout=WAIT_S)
    answers = []
    for call in calls:
        if isinstance(call, Exception):
            status, _, content = app.error_answer(call, "POST", "/v2/models/pipe/infer")
        else:
            call.future.exception(timeout=WAIT_S)
            try:
                reply = call.reply()
                status, content = reply.status, reply.body
            except Exception as error:
                status, _, content = app.error_answer(error, "POST", "/v2/models/pipe/infer")
        answers.append((status, json.loads(content)))
    return answers


def stats_of(server: Server, model: str) -> dict[str, Any]:
    return server.statistics(model)["model_stats"][0]


def successes(server: Server, model: str) -> tuple[int, int]:
    counts = stats_of(server, model)["inference_stats"]
    return counts["success"]["count"], counts["fail"]["count"]


def app_of(server: Server) -> HttpApp:
    return HttpApp(server, WireLimits(), LogSettings())


def taken_groups(server: Server, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The request ids of each group the server took as one carried request, as they come."""
    taken: list[tuple[str, ...]] = []
    infer_carried_async = server.infer_carried_async

    def spy(request):
        futures = infer_carried_async(request)
        if futures is not None:
            taken.append(request.carried_request_ids)
        return futures

    monkeypatch.setattr(server, "infer_carried_async", spy)
    return taken


def test_a_burst_of_one_signature_enters_as_one_carried_request_and_each_is_answered_as_alone(server, monkeypatch):
    app = app_of(server)
    taken = taken_groups(server, monkeypatch)
    items: list[Item] = [("pipe", body(i)) for i in range(6)]
    together = answer(app, server, items, together=True)
    assert taken == [tuple(f"r{i}" for i in range(6))]
    double = stats_of(server, "double")
    assert double["execution_count"] == 1  # the six arrived at the first step as one request
    assert successes(server, "double") == (6, 0) and successes(server, "pipe") == (6, 0)
    alone = answer(app, server, items, together=False)
    assert together == alone
    for i, (status, document) in enumerate(together):
        assert status == 200 and document["id"] == f"r{i}"
        outputs = {output["name"]: output["data"] for output in document["outputs"]}
        assert outputs == {"Z": [2 * i + 1, 2 * i + 2], "ID": [f"r{i}:l{i}"]}
    assert successes(server, "pipe") == (12, 0)


BAD_OR_ODD: list[Item] = [
    ("pipe", body(1)),
    ("pipe", body(2, inputs=body(2)["inputs"][:1])),  # LABEL missing
    ("pipe", body(3)),
    ("pipe", body(-4)),  # fails in the model, alone
    ("pipe", body(5, id=5)),  # an id that is not text
    ("pipe", body(6, inputs=[{**body(6)["inputs"][0], "data": [True, 1.0]}, body(6)["inputs"][1]])),  # a bool
    ("pipe", body(7, inputs=[{**body(7)["inputs"][0], "data": [[7.0], [7.5]]}, body(7)["inputs"][1]])),  # nested
    ("pipe", body(8, inputs=[{**body(8)["inputs"][0], "shape": [True, 2]}, body(8)["inputs"][1]])),  # bool dim
    ("pipe", body(9, inputs=[{**body(9)["inputs"][0], "data": [9.0]}, body(9)["inputs"][1]])),  # too few values
    ("pipe", body(10, inputs=[body(10)["inputs"][0]] * 2)),  # an input twice
    ("pipe", body(11, inputs=[{**body(11)["inputs"][0], "datatype": "FP64"}, body(11)["inputs"][1]])),
    ("pipe", body(12, inputs=[body(12)["inputs"][0], {**body(12)["inputs"][1], "data": [12]}])),  # a number as BYTES
    ("pipe", b"{not json"),
    ("pipe", body(13, rows=2)),  # a signature of its own: another group
    ("pipe", body(-14, rows=2)),  # fails in the model, alone, inside a group taken whole
    ("pipe", body(15, outputs=[{"name": "Z"}])),  # outputs asked for: a group of its own
    ("pipe", body(16, outputs=[{"name": "Z"}])),
    ("pipe", body(17, outputs=[{"name": "W"}])),  # an unknown output
    ("pipe", body(18, outputs=[{"name": "W"}])),
    ("pipe", body(19, parameters={"priority": 1})),  # parameters the server acts on
    ("pipe", body(20, parameters={"custom": "x"})),  # parameters for the models: the general road, alone
    ("pipe", body(21, parameters={"custom": "x"})),
    ("double", {"id": "d", "inputs": body(22)["inputs"]}),  # a model that is no ensemble
    ("double", {"id": "e", "inputs": body(23)["inputs"]}),
    ("nothing", body(24)),  # an unknown model
    ("nothing", body(25)),
    ("pipe", body(26, rows=65)),  # over the ensemble's max_batch_size, alone
    ("pipe", body(27, rows=65)),
    ("pipe", body(28)),
    ("pipe", body(29, inputs=[body(29)["inputs"][0], body(29, rows=2)["inputs"][1]])),  # batch 1 and 2
    ("pipe", body(30, inputs=[body(30)["inputs"][0], body(30, rows=2)["inputs"][1]])),
]


def test_every_request_of_a_mixed_burst_is_answered_and_counted_as_alone(server, monkeypatch):
    app = app_of(server)
    taken = taken_groups(server, monkeypatch)
    together = answer(app, server, BAD_OR_ODD, together=True)
    # the two-row group and the one asking for Z are taken whole; the rest, each alone
    assert sorted(taken) == [("r13", "r-14"), ("r15", "r16")]
    counted = successes(server, "pipe")
    alone = answer(app, server, BAD_OR_ODD, together=False)
    for item, burst_answer, alone_answer in zip(BAD_OR_ODD, together, alone, strict=True):
        assert burst_answer == alone_answer, item
    statuses = [status for status, _ in together]
    assert statuses.count(200) >= 10 and statuses.count(400) >= 10 and 404 in statuses
    assert "negative input in request r-4" in together[3][1]["error"]
    assert "negative input in request r-14" in together[14][1]["error"] and together[13][0] == 200
    assert successes(server, "pipe") == (2 * counted[0], 2 * counted[1])  # counted the same both ways


def test_a_burst_larger_than_the_first_steps_batch_is_answered_as_alone(tmp_path):
    with start(write_repository(tmp_path, max_batch_size=4)) as server:
        app = app_of(server)
        items: list[Item] = [("pipe", body(i)) for i in range(10)]
        together = answer(app, server, items, together=True)
        assert together == answer(app, server, items, together=False)
        assert all(status == 200 for status, _ in together)
        assert successes(server, "pipe") == (20, 0) and successes(server, "double") == (20, 0)


def test_a_burst_over_max_pending_requests_is_refused_as_alone(tmp_path):
    with start(write_repository(tmp_path), max_pending_requests=3) as server:
        app = app_of(server)
        items: list[Item] = [("pipe", body(i)) for i in range(5)]
        statuses = [status for status, _ in answer(app, server, items, together=True)]
        # inside one burst none is answered before the next arrives: three admitted, two refused
        assert statuses == [200, 200, 200, 503, 503]
        assert successes(server, "pipe") == (3, 0)
        assert server.pending_requests == 0


def test_a_burst_is_not_joined_where_the_response_cache_serves_the_ensemble(tmp_path):
    write_repository(tmp_path)
    config = tmp_path / "pipe" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    with start(tmp_path, cache_size_bytes=1 << 20) as server:
        app = app_of(server)
        items: list[Item] = [("pipe", body(i % 2)) for i in range(4)]
        together = answer(app, server, items, together=True)
        assert together == answer(app, server, items, together=False)
        assert stats_of(server, "pipe")["inference_stats"]["cache_hit"]["count"] >= 4


# ---------------------------------------------------------------------------------- gRPC


def message(model: str, i: int, rows: int = 1, labels: list[bytes] | None = None, x_bytes: bytes | None = None,
            **fields: Any) -> pb.ModelInferRequest:
    """A ``ModelInferRequest`` with raw contents, as tritonclient sends it: X = [i, i + 0.5] per row."""
    x = np.tile(np.array([i, i + 0.5], np.float32), (rows, 1))
    label = np.array(labels if labels is not None else [f"l{i}".encode()] * rows, dtype=object).reshape(rows, -1)
    request = pb.ModelInferRequest(model_name=model, id=f"r{i}", **fields)
    request.inputs.add(name="X", datatype="FP32", shape=[rows, 2])
    request.inputs.add(name="LABEL", datatype="BYTES", shape=list(label.shape))
    request.raw_input_contents.extend([x.tobytes() if x_bytes is None else x_bytes, serialize_bytes(label)])
    return request


def grpc_answer(servicer: GrpcServicer, server: Server, messages: list[pb.ModelInferRequest],
                together: bool) -> list[tuple[str, Any]]:
    """("OK", the response as JSON) or (status code, message) of each message: as one burst, or each alone."""
    if together:
        with server.infer_together():
            started = servicer.start_infer_burst(messages)
    else:
        started = []
        for one in messages:
            started += servicer.start_infer_burst([one])
            if not isinstance(started[-1], Exception):
                started[-1].future.exception(timeout=WAIT_S)
    answers: list[tuple[str, Any]] = []
    for item in started:
        error = item if isinstance(item, Exception) else item.future.exception(timeout=WAIT_S)
        if error is not None:
            answers.append((wire_status(error)[1], wire_message(error)))
            continue
        response = servicer.encode_infer(item.future.result(), item.classes, item.lease)
        answers.append(("OK", json_format.MessageToDict(response)))
    return answers


def test_grpc_a_burst_of_one_signature_enters_as_one_carried_request_and_each_is_answered_as_alone(server,
                                                                                                   monkeypatch):
    servicer = GrpcServicer(server, WireLimits(), LogSettings())
    taken = taken_groups(server, monkeypatch)
    messages = [message("pipe", i) for i in range(5)]
    together = grpc_answer(servicer, server, messages, together=True)
    assert taken == [tuple(f"r{i}" for i in range(5))]
    assert stats_of(server, "double")["execution_count"] == 1
    assert together == grpc_answer(servicer, server, messages, together=False)
    for i, (status, response) in enumerate(together):
        assert status == "OK" and response["id"] == f"r{i}"
        z = np.frombuffer(__import__("base64").b64decode(response["rawOutputContents"][
            [output["name"] for output in response["outputs"]].index("Z")]), np.float32)
        assert z.tolist() == [2 * i + 1, 2 * i + 2]
    assert successes(server, "pipe") == (10, 0)


def test_grpc_every_request_of_a_mixed_burst_is_answered_and_counted_as_alone(server, monkeypatch):
    servicer = GrpcServicer(server, WireLimits(), LogSettings())
    taken = taken_groups(server, monkeypatch)
    messages = [
        message("pipe", 1),
        message("pipe", -2),  # fails in the model, alone, inside a group taken whole
        message("pipe", 3),
        message("pipe", 5, rows=2),  # two BYTES elements a request: read alone
        message("pipe", 7, rows=2),
        message("pipe", 8, labels=[b"x", b"y"], rows=1),  # LABEL of shape [1, 2]: a signature of its own
        message("pipe", 9, parameters={"priority": pb.InferParameter(int64_param=1)}),
        message("double", 10),  # a model that is no ensemble
        message("double", 11),
        message("nothing", 12),  # an unknown model
        message("nothing", 13),
        message("pipe", 14, outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="Z")]),
        message("pipe", 15, outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="Z")]),
        message("pipe", 16, outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="W")]),  # unknown
        message("pipe", 17, outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="W")]),
        two_rows_of_x(18),  # X of 2 rows, LABEL of 1: refused alone
        two_rows_of_x(19),
    ]
    together = grpc_answer(servicer, server, messages, together=True)
    counted = successes(server, "pipe")
    alone = grpc_answer(servicer, server, messages, together=False)
    for one, burst_answer, alone_answer in zip(messages, together, alone, strict=True):
        assert burst_answer == alone_answer, one.id
    assert sorted(taken) == [("r1", "r-2", "r3"), ("r14", "r15")]
    assert together[1][0] != "OK" and "negative input in request r-2" in together[1][1]
    assert [status for status, _ in together].count("OK") == 9
    assert successes(server, "pipe") == (2 * counted[0], 2 * counted[1])


def two_rows_of_x(i: int) -> pb.ModelInferRequest:
    odd = message("pipe", i)
    odd.inputs[0].shape[:] = [2, 2]
    odd.raw_input_contents[0] = np.zeros((2, 2), np.float32).tobytes()
    return odd


def _two_labels_for_one() -> pb.ModelInferRequest:
    odd = message("pipe", 4)
    odd.raw_input_contents[1] = serialize_bytes(np.array([b"a", b"b"], dtype=object))
    return odd


def _label_longer_than_its_buffer() -> pb.ModelInferRequest:
    odd = message("pipe", 4)
    odd.raw_input_contents[1] = b"\x09\0\0\0abc"
    return odd


@pytest.mark.parametrize("odd", [lambda: message("pipe", 4, x_bytes=b"\0" * 4), _two_labels_for_one,
                                 _label_longer_than_its_buffer], ids=["short X", "two labels", "long label"])
def test_grpc_a_burst_with_a_malformed_buffer_is_read_one_by_one(tmp_path, monkeypatch, odd):
    with start(write_repository(tmp_path)) as server:
        servicer = GrpcServicer(server, WireLimits(), LogSettings())
        taken = taken_groups(server, monkeypatch)
        messages = [message("pipe", 1), message("pipe", 3), odd()]
        together = grpc_answer(servicer, server, messages, together=True)
        assert taken == []
        assert together == grpc_answer(servicer, server, messages, together=False)
        assert [status for status, _ in together] == ["OK", "OK", "INVALID_ARGUMENT"]


def test_a_string_over_max_string_bytes_in_a_burst_is_refused_as_alone(tmp_path, monkeypatch):
    with start(write_repository(tmp_path), max_string_bytes=4) as server:
        app = app_of(server)
        taken = taken_groups(server, monkeypatch)
        long_label = body(2, inputs=[body(2)["inputs"][0], {**body(2)["inputs"][1], "data": ["longer"]}])
        items: list[Item] = [("pipe", body(1)), ("pipe", long_label), ("pipe", body(3))]
        together = answer(app, server, items, together=True)
        assert taken == []  # one of them is refused alone: the group is read one by one
        assert together == answer(app, server, items, together=False)
        assert [status for status, _ in together] == [200, 400, 200]
