"""A real Triton Inference Server loads and serves a Python-backend model repository.

Proves the harness in real_triton.py works end to end, over both HTTP and gRPC. CI installs the
server (nvidia-pytriton) and the stub's numpy<2 overlay (see real_triton.py), so a server that
cannot run is a failure here, not a skip.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason

pytestmark = pytest.mark.real_triton

CONFIG = """\
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""

MODEL_PY = '''\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.dtype)),
                        pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.dtype)),
                    ]
                )
            )
        return responses

    def finalize(self):
        pass
'''


def _write_repository(root: Path) -> Path:
    model = root / "add_sub"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL_PY)
    return root


def _require_tritonserver() -> None:
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)


def _inputs(module, rng):
    in0 = rng.standard_normal((3, 4)).astype(np.float32)
    in1 = rng.standard_normal((3, 4)).astype(np.float32)
    inputs = [module.InferInput("INPUT0", [3, 4], "FP32"), module.InferInput("INPUT1", [3, 4], "FP32")]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    return in0, in1, inputs, outputs


def _check_http(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("add_sub")
        metadata = client.get_model_metadata("add_sub")
        assert [t["name"] for t in metadata["inputs"]] == ["INPUT0", "INPUT1"]
        assert [t["name"] for t in metadata["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        assert client.get_model_config("add_sub")["max_batch_size"] == 8

        in0, in1, inputs, outputs = _inputs(httpclient, np.random.default_rng(0))
        result = client.infer("add_sub", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
    finally:
        client.close()


def _check_grpc(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("add_sub")
        metadata = client.get_model_metadata("add_sub", as_json=True)
        assert [t["name"] for t in metadata["inputs"]] == ["INPUT0", "INPUT1"]
        assert [t["name"] for t in metadata["outputs"]] == ["OUTPUT0", "OUTPUT1"]

        in0, in1, inputs, outputs = _inputs(grpcclient, np.random.default_rng(1))
        result = client.infer("add_sub", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
    finally:
        client.close()


def test_real_triton_serves_python_backend_model_over_http_and_grpc(tmp_path):
    _require_tritonserver()
    repository = _write_repository(tmp_path / "model_repository")
    server = RealTritonServer(repository, startup_timeout_s=60.0)
    with server:
        pid = server.pid
        assert pid is not None
        _check_http(server.http_url)
        _check_grpc(server.grpc_url)
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            assert b"nv_inference_request_success" in response.read()

    # stopped: the process is gone (and reaped), the log is still readable
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "add_sub" in server.log_tail()
