"""What Triton added to the Python backend after 2.51, in thread and process instances: response
parameters (2.55) in-process, over HTTP and gRPC and in BLS; cancelling a decoupled BLS request
from its response iterator (2.57); a model's ``is_ready()`` behind its readiness (2.67)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_nb import serve
from triton_nb.backends import pb_utils
from triton_nb.backends._pb_inference import InferenceResponse as ServedResponse
from triton_nb.errors import InternalError
from triton_nb.tensors import InferRequest, InferResponse

INSTANCES = ["thread", "process"]

ONE_IN_ONE_OUT = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "{output}" data_type: {output_type} dims: [ 1 ] }} ]
{extra}
"""

# X[0]: 0 answers with parameters of each allowed type; 1 with a float one; 2 with a list for them
PARAMS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            mode = int(x[0])
            if mode == 1:
                parameters = {"label": "ok", "score": 0.5}
            elif mode == 2:
                parameters = ["not", "a", "dict"]
            else:
                parameters = {"flag": True, "count": 3, "label": "caf\\u00e9"}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)], parameters=parameters))
        return responses
'''

# two responses with parameters, then the final flag alone
PARAMS_STREAM = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for index in range(2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([index], np.float32))],
                                                       parameters={"index": index}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# what BLS calls give back: the parameters() strings (or the error) of "params" and "params_stream"
BLS_PARAMS = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            answer = pb_utils.InferenceRequest(model_name="params", inputs=[x], requested_output_names=["Y"]).exec()
            one = "error: " + answer.error().message() if answer.has_error() else answer.parameters()
            stream = pb_utils.InferenceRequest(model_name="params_stream", inputs=[x],
                                               requested_output_names=["Y"]).exec(decoupled=True)
            text = json.dumps({"exec": one, "stream": [r.parameters() for r in stream]})
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([text.encode()],
                                                                                           dtype=object))]))
        return responses
'''

# streams up to 400 counts, 5 ms apart, until its request is cancelled: then a CANCELLED error, final
TICKER = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for count in range(400):
                if request.is_cancelled():
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "ticker cancelled", pb_utils.TritonError.CANCELLED)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([count], np.float32))]))
                time.sleep(0.005)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# calls the ticker, cancels after its first response, reads the rest; X[0] of 1 uses async_exec
CANCELLER = '''
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(model_name="ticker", inputs=[x], requested_output_names=["Y"])
            if int(x.as_numpy()[0]) == 1:
                async def started():
                    return await call.async_exec(decoupled=True)

                iterator = asyncio.run(started())
            else:
                iterator = call.exec(decoupled=True)
            first = next(iterator)
            iterator.cancel()
            rest = list(iterator)
            iterator.cancel()  # after the final response: nothing happens
            last = rest[-1] if rest else first
            summary = {"responses": 1 + len(rest), "first_error": first.has_error(),
                       "error": last.error().message() if last.has_error() else None,
                       "code": int(last.error().code()) if last.has_error() else None}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "TEXT", np.array([json.dumps(summary).encode()], dtype=object))]))
        return responses
'''

# is_ready() answers what the file "ready" in the model folder says: "true", "false", "raise",
# "number" (not a bool), "async-false" (from a coroutine); no file: ready
READY = '''
import asyncio
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.file = os.path.join(args["model_repository"], "ready")
        self.calls = 0

    def _said(self):
        if not os.path.exists(self.file):
            return "true"
        with open(self.file) as handle:
            return handle.read().strip()

    def is_ready(self):
        said = self._said()
        if said == "raise":
            raise ValueError("the model says no")
        if said == "number":
            return 1
        if said == "async-false":
            async def answer():
                await asyncio.sleep(0)
                return False
            return answer()
        return said == "true"

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(
            r, "X").as_numpy())]) for r in requests]
'''


def write_model(repo: Path, name: str, code: str, output: str = "Y", output_type: str = "TYPE_FP32",
                extra: str = "") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(ONE_IN_ONE_OUT.format(name=name, output=output, output_type=output_type,
                                                               extra=extra))
    (folder / "1" / "model.py").write_text(textwrap.dedent(code))
    return folder


DECOUPLED = "model_transaction_policy { decoupled: true }"


def write_repository(repo: Path) -> None:
    write_model(repo, "params", PARAMS)
    write_model(repo, "params_stream", PARAMS_STREAM, extra=DECOUPLED)
    write_model(repo, "bls_params", BLS_PARAMS, output="TEXT", output_type="TYPE_STRING")
    write_model(repo, "ticker", TICKER, extra=DECOUPLED)
    write_model(repo, "canceller", CANCELLER, output="TEXT", output_type="TYPE_STRING")
    write_model(repo, "ready_model", READY)
    (repo / "through_ensemble").mkdir()
    (repo / "through_ensemble" / "1").mkdir()
    (repo / "through_ensemble" / "config.pbtxt").write_text("""
name: "through_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "params" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
""")


@pytest.fixture(scope="module", params=INSTANCES)
def served(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp(f"newer_{request.param}")
    write_repository(repo)
    with serve(repo, http_port=0, grpc_port=0, python_instances=request.param) as server:
        yield server


def x(value: float) -> dict[str, np.ndarray]:
    return {"X": np.array([value], np.float32)}


def http_client(server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def grpc_client(server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def wire_input(module, value: float):
    tensor = module.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    return tensor


def text_of(response: InferResponse) -> dict:
    return json.loads(response.outputs["TEXT"][0])


# ---------------------------------------------------------------------- response parameters (2.55)
EXPECTED = {"flag": True, "count": 3, "label": "café"}


def test_response_parameters_reach_the_in_process_client(served):
    response = served.infer(InferRequest("params", x(0)), timeout_s=60)
    assert response.parameters == EXPECTED


def test_response_parameters_reach_an_http_client(served):
    client = http_client(served)
    try:
        result = client.infer("params", [wire_input(httpclient, 0)])
    finally:
        client.close()
    assert result.get_response()["parameters"] == EXPECTED


def test_response_parameters_reach_a_grpc_client_as_typed_parameters(served):
    client = grpc_client(served)
    try:
        parameters = client.infer("params", [wire_input(grpcclient, 0)]).get_response().parameters
    finally:
        client.close()
    assert parameters["flag"].WhichOneof("parameter_choice") == "bool_param" and parameters["flag"].bool_param
    assert parameters["count"].WhichOneof("parameter_choice") == "int64_param" and parameters["count"].int64_param == 3
    assert parameters["label"].string_param == "café"


def test_bls_responses_carry_the_called_models_parameters_as_triton_s_json(served):
    answer = text_of(served.infer(InferRequest("bls_params", x(0)), timeout_s=60))
    assert json.loads(answer["exec"]) == EXPECTED
    assert answer["exec"] == '{"flag":true,"count":3,"label":"café"}'  # TritonJson: compact, UTF-8
    # each streamed response's parameters; the final flag alone has none at all ("")
    assert answer["stream"] == ['{"index":0}', '{"index":1}', ""]


def test_an_unsupported_parameter_value_fails_the_request_naming_model_and_parameter(served):
    with pytest.raises(InternalError) as failed:
        served.infer(InferRequest("params", x(1)), timeout_s=60)
    message = str(failed.value)
    assert "model 'params'" in message and "parameter 'score'" in message
    assert "Expect parameters values to have type bool/int/str, found type <class 'float'>" in message
    client = http_client(served)
    try:
        with pytest.raises(InferenceServerException, match="parameter 'score'"):
            client.infer("params", [wire_input(httpclient, 1)])
        with pytest.raises(InferenceServerException, match="expect parameters to be a dict, got <class 'list'>"):
            client.infer("params", [wire_input(httpclient, 2)])
        assert client.infer("params", [wire_input(httpclient, 0)]).get_response()["parameters"] == EXPECTED
    finally:
        client.close()
    # a BLS caller gets the failure as its response's error
    answer = text_of(served.infer(InferRequest("bls_params", x(1)), timeout_s=60))
    assert answer["exec"].startswith("error: ") and "parameter 'score'" in answer["exec"]


def test_an_ensemble_does_not_pass_a_steps_parameters_on(served):
    # Triton's ensemble answers with the sequence parameters only (EnsembleContext::CheckAndSetEnsembleOutput)
    response = served.infer(InferRequest("through_ensemble", x(0)), timeout_s=60)
    assert response.parameters == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}


def test_parameters_are_checked_as_python_backend_checks_them():
    assert pb_utils.InferenceResponse(parameters=None).parameters() == "{}"
    assert json.loads(pb_utils.InferenceResponse(parameters={"a": 1, "b": False}).parameters()) == {"a": 1, "b": False}
    with pytest.raises(pb_utils.TritonModelException, match="keys to have type str, found type <class 'int'>"):
        pb_utils.InferenceResponse(parameters={1: "x"})
    with pytest.raises(pb_utils.TritonModelException, match="found type <class 'NoneType'> \\(parameter 'n'\\)"):
        pb_utils.InferenceResponse(parameters={"n": None})
    # a server response with a float parameter becomes an error in BLS, as python_backend's executor
    bls = ServedResponse._from_server(InferResponse("m", 1, parameters={"ratio": 0.5}))
    assert bls.has_error() and bls.error().message() == "Unsupported parameter type for parameter 'ratio'."


# ---------------------------------------------------------------------- BLS cancellation (2.57)
@pytest.mark.parametrize("how", [0, 1], ids=["exec", "async_exec"])
def test_cancelling_a_decoupled_bls_call_reaches_the_called_model_and_ends_the_iteration(served, how):
    summary = text_of(served.infer(InferRequest("canceller", x(how)), timeout_s=60))
    assert summary["first_error"] is False
    assert summary["responses"] < 401  # the ticker stopped before its 400 counts
    assert summary["error"] == "ticker cancelled"
    assert summary["code"] == int(pb_utils.TritonError.CANCELLED)


def test_a_cancelled_request_is_cancelled_for_good():
    request = InferRequest("m", {})
    assert not request.is_cancelled()
    request.cancelled = True
    assert request.is_cancelled()
    served = pb_utils.InferenceRequest._from_server(request, decoupled=True, output_names=[])
    assert served.is_cancelled() and served.get_response_sender().is_cancelled()


# ---------------------------------------------------------------------- is_ready() (2.67)
@pytest.fixture(params=INSTANCES)
def readiness(request, tmp_path):
    repo = tmp_path / "repo"
    folder = write_model(repo, "ready_model", READY)
    write_model(repo, "plain", PARAMS)
    with serve(repo, http_port=0, grpc_port=0, python_instances=request.param) as server:
        yield server, folder


def ready_everywhere(server) -> tuple[bool, bool, bool]:
    """(in-process, HTTP, gRPC) answers to 'is ready_model ready?'"""
    http, grpc = http_client(server), grpc_client(server)
    try:
        return (server.is_model_ready("ready_model"), http.is_model_ready("ready_model"),
                grpc.is_model_ready("ready_model"))
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize("said", ["false", "raise", "number", "async-false"])
def test_a_model_whose_is_ready_says_no_is_not_ready_on_every_path(readiness, said):
    server, folder = readiness
    assert ready_everywhere(server) == (True, True, True)
    (folder / "ready").write_text(said)
    assert ready_everywhere(server) == (False, False, False)  # asked at each check: never cached
    assert not server.is_server_ready()  # strict readiness asks every loaded model
    assert server.is_model_ready("plain")  # a model without is_ready() is ready
    assert server.infer(InferRequest("ready_model", x(4)), timeout_s=60).outputs["Y"].tolist() == [4.0]
    (folder / "ready").write_text("true")
    assert ready_everywhere(server) == (True, True, True)
    assert server.is_server_ready()
