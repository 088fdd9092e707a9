"""The Python backend: decoupled models, their response senders and streams."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.helpers.python_models import SIMPLE_CONFIG, request, write_model
from triton_nb.errors import InternalError
from triton_nb.tensors import InferRequest

# --------------------------------------------------------------------------- decoupled models

DECOUPLED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [{{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }}]
output [{{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
"""

DECOUPLED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def streamed_request(model: str, n: int, sink: list) -> InferRequest:
    return InferRequest(model_name=model, inputs={"N": np.array([n], np.int32)},
                        response_sender=lambda response, final: sink.append((response, final)))


def test_decoupled_model_streams_three_responses_then_final(tmp_path, backends):
    backend = backends(write_model(tmp_path, "stream", DECOUPLED_MODEL, DECOUPLED_CONFIG.format(name="stream")))
    assert backend.decoupled is True
    sink: list = []
    assert backend.execute([streamed_request("stream", 3, sink)]) is None
    assert [final for _, final in sink] == [False, False, False, True]
    assert [int(r.outputs["OUT"][0]) for r, _ in sink[:3]] == [0, 1, 2]
    assert sink[3][0] is None
    assert all(r.model_name == "stream" for r, _ in sink[:3])


def test_async_decoupled_model_runs_in_the_background(tmp_path, backends):
    source = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                n = int(request.inputs()[0].as_numpy()[0])
                if n < 0:
                    raise ValueError("negative")
                for i in range(n):
                    await asyncio.sleep(0)
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
    backend = backends(write_model(tmp_path, "astream", source, DECOUPLED_CONFIG.format(name="astream")))
    done = threading.Event()
    sink: list = []

    def collect(response, final):
        sink.append((response, final))
        if final:
            done.set()

    assert backend.execute([InferRequest("astream", {"N": np.array([2], np.int32)}, response_sender=collect)]) is None
    assert done.wait(10)
    assert [final for _, final in sink] == [False, False, True]
    done.clear()
    sink.clear()
    backend.execute([InferRequest("astream", {"N": np.array([-1], np.int32)}, response_sender=collect)])
    assert done.wait(10)
    ((failed, final),) = sink
    assert final and isinstance(failed.error, InternalError) and "negative" in str(failed.error)


def test_sender_rules(tmp_path, backends):
    source = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            sender = requests[0].get_response_sender()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            sender.send(pb_utils.InferenceResponse([]))  # closed: raises
    """
    backend = backends(write_model(tmp_path, "rules", source, DECOUPLED_CONFIG.format(name="rules")))
    sink: list = []
    with pytest.raises(InternalError, match="Response sender has been closed"):
        backend.execute([streamed_request("rules", 1, sink)])
    assert sink == [(None, True)]


def test_default_mode_model_may_answer_through_the_sender(tmp_path, backends):
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                x = request.inputs()[0]
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.as_numpy() * 2)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            return None
    """
    backend = backends(write_model(tmp_path, "viasender", source, SIMPLE_CONFIG.format(name="viasender")))
    (response,) = backend.execute([request("viasender", X=np.array([[4.0]], np.float32))])
    np.testing.assert_array_equal(response.outputs["Y"], [[8.0]])
