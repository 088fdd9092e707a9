"""An ensemble's Python steps take a formed batch as one carried request, and the model still sees
the requests apart: their own rows, their own ids, their own answers and errors; the statistics
count each request; in thread and process instances alike. A burst of requests received together
(``infer_together``, as the network links take each read) reaches the first step as one carried
request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.python_models import write_model
from triton_nb.errors import TritonNBError
from triton_nb.server.core import Server
from triton_nb.tensors import InferRequest

WAIT_S = 30

# X * 2 per request; N: how many requests the model was handed in this execute() call; ID: the
# request's own id, per row. A request with a negative X fails alone.
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
            rows = len(x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", x * 2),
                pb_utils.Tensor("N", np.full((rows, 1), len(requests), np.int32)),
                pb_utils.Tensor("ID", np.full((rows, 1), request.request_id().encode(), object))]))
        return responses
"""
DOUBLE_CONFIG = """
name: "double"
backend: "python"
max_batch_size: 64
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] },
        { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "ID" data_type: TYPE_STRING dims: [ 1 ] }]
dynamic_batching { max_queue_delay_microseconds: 0 }
"""
# One row per request whatever rows it sent (the sum of them): answers that cannot be joined row-wise
SUM = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                    "S", pb_utils.get_input_tensor_by_name(r, "Y").as_numpy().sum(axis=0, keepdims=True))])
                for r in requests]
"""
SUM_CONFIG = """
name: "total"
backend: "python"
max_batch_size: 64
input [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "S" data_type: TYPE_FP32 dims: [ 1 ] }]
dynamic_batching { max_queue_delay_microseconds: 0 }
"""


def ensemble(steps: str, outputs: str, name: str) -> str:
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 64
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }}]
output [{outputs}]
ensemble_scheduling {{ step [ {steps} ] }}
"""


DOUBLE_STEP = ('{ model_name: "double" model_version: -1 input_map { key: "X" value: "X" } '
               'output_map [{ key: "Y" value: "Y" }, { key: "N" value: "N" }, { key: "ID" value: "ID" }] }')
SUM_STEP = ('{ model_name: "total" model_version: -1 input_map { key: "Y" value: "Y" } '
            'output_map { key: "S" value: "S" } }')


@pytest.fixture(params=["thread", "process"])
def server(request: pytest.FixtureRequest, tmp_path: Path):
    write_model(tmp_path, "double", DOUBLE, DOUBLE_CONFIG)
    write_model(tmp_path, "total", SUM, SUM_CONFIG)
    (tmp_path / "pipe" / "1").mkdir(parents=True)
    (tmp_path / "pipe" / "config.pbtxt").write_text(ensemble(
        DOUBLE_STEP, '{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }, '
        '{ name: "ID" data_type: TYPE_STRING dims: [ 1 ] }', "pipe"))
    (tmp_path / "summed" / "1").mkdir(parents=True)
    (tmp_path / "summed" / "config.pbtxt").write_text(ensemble(
        f"{DOUBLE_STEP}, {SUM_STEP}", '{ name: "S" data_type: TYPE_FP32 dims: [ 1 ] }', "summed"))
    with Server(tmp_path, http_port=None, grpc_port=None, metrics_port=None,
                python_instances=request.param).start() as started:
        yield started


def burst(server: Server, model: str, xs: list[np.ndarray]) -> list:
    with server.infer_together():
        futures = [server.infer_async(InferRequest(model, {"X": x}, request_id=f"r{i}")) for i, x in enumerate(xs)]
    return futures


def stats_of(server: Server, model: str) -> dict:
    return server.statistics(model)["model_stats"][0]


def test_a_burst_reaches_the_python_step_as_one_carried_request_handed_to_the_model_apart(server):
    xs = [np.full((rows, 1), i, np.float32) for i, rows in enumerate((1, 3, 2, 1))]
    futures = burst(server, "pipe", xs)
    for i, (x, future) in enumerate(zip(xs, futures, strict=True)):
        response = future.result(timeout=WAIT_S)
        np.testing.assert_array_equal(response.as_numpy("Y"), x * 2)
        assert response.as_numpy("ID").ravel().tolist() == [f"r{i}".encode()] * len(x)  # its own id
        assert response.as_numpy("N").ravel().tolist() == [len(xs)] * len(x)  # all four in one execute()
    double = stats_of(server, "double")
    assert double["execution_count"] == 1  # one batch: the carried request
    assert double["inference_stats"]["success"]["count"] == len(xs)  # each request counted
    assert double["inference_count"] == sum(len(x) for x in xs)
    assert stats_of(server, "pipe")["inference_stats"]["success"]["count"] == len(xs)


def test_a_bad_request_in_a_carried_batch_fails_alone_and_is_counted_alone(server):
    xs = [np.full((1, 1), 1, np.float32), np.full((2, 1), -1, np.float32), np.full((1, 1), 3, np.float32)]
    futures = burst(server, "pipe", xs)
    np.testing.assert_array_equal(futures[0].result(timeout=WAIT_S).as_numpy("Y"), xs[0] * 2)
    np.testing.assert_array_equal(futures[2].result(timeout=WAIT_S).as_numpy("Y"), xs[2] * 2)
    with pytest.raises(TritonNBError, match="negative input in request r1") as failed:
        futures[1].result(timeout=WAIT_S)
    assert "double" in str(failed.value)  # the ensemble names its failing step's model
    double = stats_of(server, "double")["inference_stats"]
    assert (double["success"]["count"], double["fail"]["count"]) == (2, 1)
    pipe = stats_of(server, "pipe")["inference_stats"]
    assert (pipe["success"]["count"], pipe["fail"]["count"]) == (2, 1)


def test_answers_that_cannot_be_joined_row_wise_reach_each_request_apart(server):
    # 'total' answers one row per request, whatever its rows: carried, it is answered apart
    xs = [np.full((rows, 1), i + 1, np.float32) for i, rows in enumerate((2, 3, 1))]
    futures = burst(server, "summed", xs)
    for x, future in zip(xs, futures, strict=True):
        np.testing.assert_array_equal(future.result(timeout=WAIT_S).as_numpy("S"), (x * 2).sum(axis=0, keepdims=True))
    total = stats_of(server, "total")
    assert total["inference_stats"]["success"]["count"] == len(xs)
    assert total["execution_count"] == 1

