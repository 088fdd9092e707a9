"""Front-end conformance: the same tritonclient calls against triton_nb and real Triton 2.51.

Every test runs once per ``endpoint`` ("triton_nb", "real_triton"; see conftest.py). Expected values
are computed here with NumPy; where the wire behaviour itself is the subject (status codes, error
messages, formats), the expectation is what real Triton 2.51 does, written down as a constant, so a
triton_nb run that differs fails and shows the gap.

Tests run in file order against one server per kind; the repository tests (which unload and reload
models) come last and leave every model loaded with its original configuration.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import triton_to_np_dtype

from tests.helpers.conformance_helpers import (
    ADD_SUB_INPUTS,
    ADD_SUB_OUTPUTS,
    MODELS,
    NO_ID,
    REQUIRED_EXTENSIONS,
    add_sub_data,
    add_sub_grpc_inputs,
    add_sub_http_inputs,
    assert_add_sub,
    assert_echo,
    grpc_input,
    http_input,
    outcome,
    sample,
    server_error,
)
from tests.helpers.conformance_repo import DATATYPES
from tests.helpers.waiting import wait_until

# ------------------------------------------------------------------------------ 1. health and metadata


def test_health_live_and_ready(http_client, grpc_client):
    assert http_client.is_server_live()
    assert http_client.is_server_ready()
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()


def test_server_metadata(http_client, grpc_client):
    meta = http_client.get_server_metadata()
    assert set(meta) >= {"name", "version", "extensions"}
    assert isinstance(meta["name"], str) and meta["name"]
    assert isinstance(meta["version"], str) and meta["version"]
    assert set(meta["extensions"]) >= REQUIRED_EXTENSIONS, meta["extensions"]
    grpc_meta = grpc_client.get_server_metadata()
    assert (grpc_meta.name, grpc_meta.version) == (meta["name"], meta["version"])
    assert set(grpc_meta.extensions) == set(meta["extensions"])


def test_model_metadata(http_client, grpc_client):
    expected_inputs = [{"name": n, "datatype": "FP32", "shape": [-1, 4]} for n in ADD_SUB_INPUTS]
    expected_outputs = [{"name": n, "datatype": "FP32", "shape": [-1, 4]} for n in ADD_SUB_OUTPUTS]
    assert http_client.get_model_metadata("add_sub") == {
        "name": "add_sub", "versions": ["1"], "platform": "python",
        "inputs": expected_inputs, "outputs": expected_outputs,
    }
    assert http_client.get_model_metadata("add_sub", model_version="1")["name"] == "add_sub"
    meta = grpc_client.get_model_metadata("add_sub")
    assert (meta.name, list(meta.versions), meta.platform) == ("add_sub", ["1"], "python")
    assert [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs] == expected_inputs
    assert [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs] == expected_outputs
    echo = http_client.get_model_metadata("echo_all")
    assert [(t["name"], t["datatype"], t["shape"]) for t in echo["inputs"]] == [
        (f"INPUT_{t}", t, [-1]) for t in DATATYPES
    ]


def test_model_ready(http_client, grpc_client):
    for model in MODELS:
        assert http_client.is_model_ready(model)
        assert grpc_client.is_model_ready(model)
    assert http_client.is_model_ready("add_sub", model_version="1")
    assert not http_client.is_model_ready("nonexistent")
    assert not grpc_client.is_model_ready("nonexistent")
    assert not http_client.is_model_ready("add_sub", model_version="7")


def test_model_config(http_client, grpc_client):
    config = http_client.get_model_config("add_sub")
    assert config["name"] == "add_sub"
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        (n, "TYPE_FP32", [4]) for n in ADD_SUB_INPUTS
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        (n, "TYPE_FP32", [4]) for n in ADD_SUB_OUTPUTS
    ]
    assert "dynamic_batching" in config
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 1)]
    echo = http_client.get_model_config("echo_all")
    assert echo["max_batch_size"] == 0
    assert [(t["name"], t["data_type"], t["optional"]) for t in echo["input"]] == [
        (f"INPUT_{t}", c, True) for t, c in DATATYPES.items()
    ]

    response = grpc_client.get_model_config("add_sub")
    grpc_config = response.config
    assert (grpc_config.name, grpc_config.backend, grpc_config.max_batch_size) == ("add_sub", "python", 8)
    assert [(t.name, t.data_type, list(t.dims)) for t in grpc_config.input] == [
        (n, model_config_pb2.TYPE_FP32, [4]) for n in ADD_SUB_INPUTS
    ]
    assert grpc_config.HasField("dynamic_batching")
    as_json = grpc_client.get_model_config("add_sub", as_json=True)
    assert as_json["config"]["name"] == "add_sub"


# ----------------------------------------------------------------------------------- 2. add_sub inference


def test_infer_http_json(http_client):
    in0, in1 = add_sub_data()
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ADD_SUB_OUTPUTS]
    result = http_client.infer("add_sub", add_sub_http_inputs(in0, in1, binary=False), outputs=outputs)
    response = result.get_response()
    assert (response["model_name"], response["model_version"]) == ("add_sub", "1")
    for output in response["outputs"]:
        assert "data" in output and "binary_data_size" not in output.get("parameters", {})
        assert output["datatype"] == "FP32" and output["shape"] == [2, 4]
    assert_add_sub(result, in0, in1)


def test_infer_http_binary(http_client):
    in0, in1 = add_sub_data(3)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ADD_SUB_OUTPUTS]
    result = http_client.infer("add_sub", add_sub_http_inputs(in0, in1), outputs=outputs)
    for output in result.get_response()["outputs"]:
        assert output["parameters"]["binary_data_size"] == 3 * 4 * 4
        assert "data" not in output
    assert_add_sub(result, in0, in1)


def test_infer_http_default_outputs_are_all_outputs(http_client):
    in0, in1 = add_sub_data(1)
    result = http_client.infer("add_sub", add_sub_http_inputs(in0, in1))
    assert sorted(o["name"] for o in result.get_response()["outputs"]) == list(ADD_SUB_OUTPUTS)
    assert_add_sub(result, in0, in1)


def test_infer_grpc(grpc_client):
    in0, in1 = add_sub_data(4)
    outputs = [grpcclient.InferRequestedOutput(n) for n in ADD_SUB_OUTPUTS]
    result = grpc_client.infer("add_sub", add_sub_grpc_inputs(in0, in1), outputs=outputs)
    response = result.get_response()
    assert (response.model_name, response.model_version) == ("add_sub", "1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        (n, "FP32", [4, 4]) for n in ADD_SUB_OUTPUTS
    ]
    assert_add_sub(result, in0, in1)


def test_infer_http_aio(endpoint):
    in0, in1 = add_sub_data(2)

    async def run():
        client = httpaio.InferenceServerClient(endpoint.http_url)
        try:
            assert await client.is_server_ready()
            assert await client.is_model_ready("add_sub")
            results = await asyncio.gather(
                *(client.infer("add_sub", add_sub_http_inputs(in0, in1)) for _ in range(4))
            )
            return results, await client.get_model_metadata("add_sub")
        finally:
            await client.close()

    results, meta = asyncio.run(run())
    assert meta["name"] == "add_sub"
    for result in results:
        assert_add_sub(result, in0, in1)


def test_infer_grpc_aio(endpoint):
    in0, in1 = add_sub_data(2)

    async def run():
        client = grpcaio.InferenceServerClient(endpoint.grpc_url)
        try:
            assert await client.is_server_ready()
            assert await client.is_model_ready("add_sub")
            return await asyncio.gather(
                *(client.infer("add_sub", add_sub_grpc_inputs(in0, in1), request_id=f"aio-{i}") for i in range(4))
            )
        finally:
            await client.close()

    results = asyncio.run(run())
    assert [r.get_response().id for r in results] == [f"aio-{i}" for i in range(4)]
    for result in results:
        assert_add_sub(result, in0, in1)


def test_requested_output_subset(http_client, grpc_client):
    in0, in1 = add_sub_data(2)
    result = http_client.infer("add_sub", add_sub_http_inputs(in0, in1),
                               outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
    result = grpc_client.infer("add_sub", add_sub_grpc_inputs(in0, in1),
                               outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT0"]
    assert result.as_numpy("OUTPUT1") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)


def test_request_id_is_echoed(http_client, grpc_client):
    in0, in1 = add_sub_data(1)
    result = http_client.infer("add_sub", add_sub_http_inputs(in0, in1), request_id="req-42")
    assert result.get_response()["id"] == "req-42"
    result = grpc_client.infer("add_sub", add_sub_grpc_inputs(in0, in1), request_id="req-43")
    assert result.get_response().id == "req-43"
    # without an id, the HTTP response has no "id" member and the gRPC one an empty id
    assert "id" not in http_client.infer("add_sub", add_sub_http_inputs(in0, in1)).get_response()
    assert grpc_client.infer("add_sub", add_sub_grpc_inputs(in0, in1)).get_response().id == ""


# --------------------------------------------------------------------------------- 3. every datatype


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_echo_http_binary(http_client, datatype):
    sent = sample(datatype)
    result = http_client.infer("echo_all", [http_input(f"INPUT_{datatype}", sent, datatype)],
                               outputs=[httpclient.InferRequestedOutput(f"OUTPUT_{datatype}", binary_data=True)])
    assert [(o["name"], o["datatype"], o["shape"]) for o in result.get_response()["outputs"]] == [
        (f"OUTPUT_{datatype}", datatype, [len(sent)])
    ]
    assert_echo(result.as_numpy(f"OUTPUT_{datatype}"), sent, datatype)


@pytest.mark.parametrize("datatype", [t for t in DATATYPES if t != "FP16"])
def test_echo_http_json(http_client, datatype):
    sent = sample(datatype, json_safe=True)
    result = http_client.infer("echo_all", [http_input(f"INPUT_{datatype}", sent, datatype, binary=False)],
                               outputs=[httpclient.InferRequestedOutput(f"OUTPUT_{datatype}", binary_data=False)])
    (output,) = result.get_response()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == (f"OUTPUT_{datatype}", datatype, [len(sent)])
    assert "data" in output
    assert_echo(result.as_numpy(f"OUTPUT_{datatype}"), sent, datatype, json_output=True)


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_echo_http_json_non_finite(http_client, datatype):
    # tritonclient writes NaN/Infinity (Python's json), which Triton accepts and writes back the same way
    sent = np.array([np.inf, -np.inf, np.nan, 1.0], dtype=triton_to_np_dtype(datatype))
    result = http_client.infer("echo_all", [http_input(f"INPUT_{datatype}", sent, datatype, binary=False)],
                               outputs=[httpclient.InferRequestedOutput(f"OUTPUT_{datatype}", binary_data=False)])
    assert_echo(result.as_numpy(f"OUTPUT_{datatype}"), sent, datatype, json_output=True)


def test_echo_http_json_fp16_input_is_refused(http_client):
    # tritonclient sends FP16 as JSON numbers without complaint; Triton refuses them
    status, message = server_error(lambda: http_client.infer(
        "echo_all", [http_input("INPUT_FP16", sample("FP16", json_safe=True), "FP16", binary=False)]))
    assert (status, message) == (
        "400", "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT_FP16"
    )


def test_echo_http_json_fp16_output_is_refused(http_client):
    status, message = server_error(lambda: http_client.infer(
        "echo_all", [http_input("INPUT_FP16", sample("FP16"), "FP16")],
        outputs=[httpclient.InferRequestedOutput("OUTPUT_FP16", binary_data=False)]))
    assert (status, message) == (
        "400", "sending FP16 data via JSON is not supported. Please use the binary data format for output"
    )


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_echo_grpc(grpc_client, datatype):
    sent = sample(datatype)
    result = grpc_client.infer("echo_all", [grpc_input(f"INPUT_{datatype}", sent, datatype)])
    assert [(o.name, o.datatype, list(o.shape)) for o in result.get_response().outputs] == [
        (f"OUTPUT_{datatype}", datatype, [len(sent)])
    ]
    assert_echo(result.as_numpy(f"OUTPUT_{datatype}"), sent, datatype)


def test_echo_all_datatypes_in_one_request(http_client, grpc_client):
    sent = {t: sample(t) for t in DATATYPES}
    result = http_client.infer("echo_all", [http_input(f"INPUT_{t}", a, t) for t, a in sent.items()])
    for datatype, array in sent.items():
        assert_echo(result.as_numpy(f"OUTPUT_{datatype}"), array, datatype)
    result = grpc_client.infer("echo_all", [grpc_input(f"INPUT_{t}", a, t) for t, a in sent.items()])
    for datatype, array in sent.items():
        assert_echo(result.as_numpy(f"OUTPUT_{datatype}"), array, datatype)


def test_echo_empty_tensor(http_client, grpc_client):
    empty = np.zeros(0, dtype=np.float32)
    result = http_client.infer("echo_all", [http_input("INPUT_FP32", empty, "FP32")])
    assert_echo(result.as_numpy("OUTPUT_FP32"), empty, "FP32")
    result = grpc_client.infer("echo_all", [grpc_input("INPUT_FP32", empty, "FP32")])
    assert_echo(result.as_numpy("OUTPUT_FP32"), empty, "FP32")


def test_echo_no_inputs_when_all_are_optional(http_client, grpc_client):
    # every input of echo_all is optional: a request with none is valid and has no outputs
    assert http_client.infer("echo_all", []).get_response()["outputs"] == []
    assert list(grpc_client.infer("echo_all", []).get_response().outputs) == []


# ---------------------------------------------------------------------------------- 4. classification


def expected_classes(values: np.ndarray, count: int) -> list[list[bytes]]:
    """Triton's classification strings: "<value>:<index>" (std::to_string, 6 decimals), highest first."""
    rows = []
    for row in values:
        order = np.argsort(-row, kind="stable")[:count]
        rows.append([f"{float(row[i]):f}:{i}".encode() for i in order])
    return rows


def test_classification_http(http_client):
    in0 = np.array([[1, 5, 3, 2], [0.5, -2, 7.25, 9]], np.float32)
    in1 = np.array([[0.5, 0.25, 3, -1], [1, 1, 1, 1]], np.float32)
    result = http_client.infer("add_sub", add_sub_http_inputs(in0, in1),
                               outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    (output,) = result.get_response()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("OUTPUT0", "BYTES", [2, 2])
    assert result.as_numpy("OUTPUT0").tolist() == expected_classes(in0 + in1, 2)
    # as JSON: the same strings
    result = http_client.infer("add_sub", add_sub_http_inputs(in0, in1),
                               outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=False, class_count=3)])
    (output,) = result.get_response()["outputs"]
    assert output["data"] == [s.decode() for row in expected_classes(in0 - in1, 3) for s in row]


def test_classification_grpc(grpc_client):
    in0 = np.array([[1, 5, 3, 2]], np.float32)
    in1 = np.array([[0.5, 0.25, 3, -1]], np.float32)
    result = grpc_client.infer("add_sub", add_sub_grpc_inputs(in0, in1),
                               outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert result.as_numpy("OUTPUT0").tolist() == expected_classes(in0 + in1, 2)
    assert result.as_numpy("OUTPUT0").tolist() == [[b"6.000000:2", b"5.250000:1"]]  # the format, spelled out


# ---------------------------------------------------------------------------------------- 5. statistics


def _metric(text: str, family: str, model: str) -> float:
    pattern = re.compile(rf'^{family}\{{([^}}]*)\}} (\S+)$', re.MULTILINE)
    for labels, value in pattern.findall(text):
        if f'model="{model}"' in labels and 'version="1"' in labels:
            return float(value)
    raise AssertionError(f"no {family} sample for model {model!r} in the metrics:\n{text[:3000]}")


def _metrics_text(endpoint) -> str:
    with urllib.request.urlopen(endpoint.metrics_url, timeout=10) as response:
        assert response.status == 200
        assert response.headers.get_content_type() == "text/plain"
        return response.read().decode()


def _http_counts(client, model: str) -> dict[str, int]:
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    assert (stats["name"], stats["version"]) == (model, "1")
    return {
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
        "success": stats["inference_stats"]["success"]["count"],
        "fail": stats["inference_stats"]["fail"]["count"],
        "queue": stats["inference_stats"]["queue"]["count"],
        "compute_infer": stats["inference_stats"]["compute_infer"]["count"],
        "last_inference": stats["last_inference"],
    }


def _grpc_counts(client, model: str) -> dict[str, int]:
    (stats,) = client.get_inference_statistics(model).model_stats
    assert (stats.name, stats.version) == (model, "1")
    return {
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "success": stats.inference_stats.success.count,
        "fail": stats.inference_stats.fail.count,
        "queue": stats.inference_stats.queue.count,
        "compute_infer": stats.inference_stats.compute_infer.count,
        "last_inference": stats.last_inference,
    }


def test_statistics(endpoint, http_client, grpc_client):
    n = 5
    before = _http_counts(http_client, "add_sub")
    assert _grpc_counts(grpc_client, "add_sub") == before
    in0, in1 = add_sub_data(1)
    for _ in range(n):
        http_client.infer("add_sub", add_sub_http_inputs(in0, in1))
    big0, big1 = add_sub_data(3)
    grpc_client.infer("add_sub", add_sub_grpc_inputs(big0, big1))  # one request of batch 3
    if endpoint.kind == "real_triton":
        # Triton 2.51 records a request's statistics after its response is sent: on a loaded machine
        # the last one may not be counted yet when the client has its answer (triton_nb counts it
        # before answering, which the assertions below check at once)
        wait_until(lambda: _http_counts(http_client, "add_sub")["success"] - before["success"] >= n + 1,
                   "real Triton to count the last request")
    after = _http_counts(http_client, "add_sub")
    assert after["inference_count"] - before["inference_count"] == n + 3  # counts batch items
    assert after["success"] - before["success"] == n + 1  # counts requests
    assert after["queue"] - before["queue"] == n + 1
    assert after["fail"] == before["fail"]
    assert 1 <= after["execution_count"] - before["execution_count"] <= n + 1
    assert after["compute_infer"] - before["compute_infer"] == n + 1
    assert after["last_inference"] > 0
    assert _grpc_counts(grpc_client, "add_sub") == after

    everything = http_client.get_inference_statistics()["model_stats"]
    assert set(MODELS) <= {s["name"] for s in everything}
    assert set(MODELS) <= {s.name for s in grpc_client.get_inference_statistics().model_stats}


def test_statistics_count_model_error_responses_as_success(endpoint, http_client, grpc_client):
    # Triton 2.51's Python backend: an execute() that returns InferenceResponse(error=...) succeeded as
    # far as the statistics and metrics go (the request is counted in "success", not in "fail")
    before = _http_counts(http_client, "fails")
    metrics_before = _metric(_metrics_text(endpoint), "nv_inference_request_success", "fails")
    for _ in range(2):
        server_error(lambda: http_client.infer("fails", [http_input("INPUT0", np.ones(2, np.float32), "FP32")]))
    after = _grpc_counts(grpc_client, "fails")
    metrics_after = _metric(_metrics_text(endpoint), "nv_inference_request_success", "fails")
    assert {
        "success": after["success"] - before["success"],
        "fail": after["fail"] - before["fail"],
        "inference_count": after["inference_count"] - before["inference_count"],
        "nv_inference_request_success": metrics_after - metrics_before,
    } == STATISTICS_OF_MODEL_ERRORS[endpoint.kind]


# triton_nb counts a request its model answered with an error as a failure (reason BACKEND), so the
# failure metrics show model errors; Triton 2.51's Python backend counts it as a success.
STATISTICS_OF_MODEL_ERRORS = {
    "real_triton": {"success": 2, "fail": 0, "inference_count": 2, "nv_inference_request_success": 2},
    "triton_nb": {"success": 0, "fail": 2, "inference_count": 0, "nv_inference_request_success": 0},
}



# ------------------------------------------------------------------------------------------- 8. metrics


def test_metrics(endpoint, http_client):
    in0, in1 = add_sub_data(2)
    http_client.infer("add_sub", add_sub_http_inputs(in0, in1))
    text = _metrics_text(endpoint)
    assert "# TYPE nv_inference_request_success counter" in text
    assert _metric(text, "nv_inference_request_success", "add_sub") >= 1
    assert _metric(text, "nv_inference_count", "add_sub") >= 2
    assert _metric(text, "nv_inference_exec_count", "add_sub") >= 1
    assert _metric(text, "nv_inference_request_duration_us", "add_sub") > 0
    assert _metric(text, "nv_inference_request_success", "echo_all") >= 1  # echo_all was used too


# ------------------------------------------------------------------------ 6. repository (keep these last)

ADD_SUB_OVERRIDE = {
    "name": "add_sub",
    "backend": "python",
    "max_batch_size": 4,
    "dynamic_batching": {},
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ADD_SUB_INPUTS],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ADD_SUB_OUTPUTS],
}


def _index_entry(client, model: str) -> dict:
    return next(m for m in client.get_model_repository_index() if m["name"] == model)


def _wait_unloaded(client, model: str, timeout_s: float = 15.0) -> dict:
    """Triton unloads in the background: the index says UNLOADING until the model is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        entry = _index_entry(client, model)
        if entry["state"] != "UNLOADING" or time.monotonic() > deadline:
            return entry
        time.sleep(0.05)


def test_repository_index(http_client, grpc_client):
    # READY entries have no "reason" member in HTTP; strays from failed loads are test_load_errors' business
    expected = [{"name": n, "version": "1", "state": "READY"} for n in MODELS]
    assert [m for m in http_client.get_model_repository_index() if m.get("name") in MODELS] == expected
    index = [m for m in grpc_client.get_model_repository_index().models if m.name in MODELS]
    assert [{"name": m.name, "version": m.version, "state": m.state} for m in index] == expected
    assert all(m.reason == "" for m in index)


def test_unload_and_load(http_client, grpc_client):
    in0, in1 = add_sub_data(1)
    http_client.unload_model("add_sub")
    assert not http_client.is_model_ready("add_sub")
    assert not grpc_client.is_model_ready("add_sub")
    # what the index and the errors say while unloaded is compared at the end, after the reload is checked
    observed: dict[str, Any] = {"index_unloaded": _wait_unloaded(http_client, "add_sub")}
    observed["http_infer"] = server_error(lambda: http_client.infer("add_sub", add_sub_http_inputs(in0, in1)))
    observed["grpc_infer"] = server_error(lambda: grpc_client.infer("add_sub", add_sub_grpc_inputs(in0, in1)))
    observed["http_metadata"] = server_error(lambda: http_client.get_model_metadata("add_sub"))
    assert grpc_client.is_model_ready("echo_all")  # the others are untouched

    grpc_client.load_model("add_sub")
    assert http_client.is_model_ready("add_sub")
    observed["index_reloaded"] = _index_entry(http_client, "add_sub")
    assert_add_sub(http_client.infer("add_sub", add_sub_http_inputs(in0, in1)), in0, in1)

    # unloading through gRPC, loading through HTTP
    grpc_client.unload_model("add_sub")
    assert not http_client.is_model_ready("add_sub")
    _wait_unloaded(http_client, "add_sub")
    http_client.load_model("add_sub")
    assert grpc_client.is_model_ready("add_sub")
    assert_add_sub(grpc_client.infer("add_sub", add_sub_grpc_inputs(in0, in1)), in0, in1)

    gone = "Request for unknown model: 'add_sub' has no available versions"
    assert observed == {
        "index_unloaded": {"name": "add_sub", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        "http_infer": ("404", gone),
        "grpc_infer": ("StatusCode.NOT_FOUND", gone),
        "http_metadata": ("404", gone),
        "index_reloaded": {"name": "add_sub", "version": "1", "state": "READY"},
    }


def _reload_from_repository(http_client) -> None:
    """Unload + load: what makes Triton read the repository's config.pbtxt again after an override."""
    http_client.unload_model("add_sub")
    _wait_unloaded(http_client, "add_sub")
    http_client.load_model("add_sub")


def test_load_with_config_override(http_client, grpc_client):
    http_client.load_model("add_sub", config=json.dumps(ADD_SUB_OVERRIDE))
    assert http_client.is_model_ready("add_sub")
    assert http_client.get_model_config("add_sub")["max_batch_size"] == 4
    assert grpc_client.get_model_config("add_sub").config.max_batch_size == 4
    big0, big1 = add_sub_data(5)
    too_big = server_error(lambda: http_client.infer("add_sub", add_sub_http_inputs(big0, big1)))
    in0, in1 = add_sub_data(4)
    assert_add_sub(http_client.infer("add_sub", add_sub_http_inputs(in0, in1)), in0, in1)
    _reload_from_repository(http_client)
    assert http_client.get_model_config("add_sub")["max_batch_size"] == 8

    # the same over gRPC
    grpc_client.load_model("add_sub", config=json.dumps(ADD_SUB_OVERRIDE))
    assert grpc_client.get_model_config("add_sub").config.max_batch_size == 4
    _reload_from_repository(http_client)
    assert grpc_client.get_model_config("add_sub").config.max_batch_size == 8
    assert http_client.is_model_ready("add_sub")
    assert too_big == ("400", NO_ID + "inference request batch-size must be <= 4 for 'add_sub'")


def test_plain_load_after_a_config_override(endpoint, http_client):
    # Triton 2.51: a load without a config, of a model whose files did not change, keeps the override
    # (only unload + load reads config.pbtxt again). triton_nb reads the repository on every load
    # without an override: what the repository says is what a plain load serves.
    http_client.load_model("add_sub", config=json.dumps(ADD_SUB_OVERRIDE))
    http_client.load_model("add_sub")
    after_plain_load = http_client.get_model_config("add_sub")["max_batch_size"]
    _reload_from_repository(http_client)
    assert http_client.get_model_config("add_sub")["max_batch_size"] == 8
    assert after_plain_load == {"real_triton": 4, "triton_nb": 8}[endpoint.kind]


def test_load_errors(endpoint, http_client, grpc_client):
    observed = {
        "http_load_unknown": server_error(lambda: http_client.load_model("nonexistent")),
        "grpc_load_unknown": server_error(lambda: grpc_client.load_model("nonexistent")),
        # a config override that is not JSON fails the load and leaves the loaded model alone
        "grpc_load_bad_override": server_error(lambda: grpc_client.load_model("add_sub", config="{not json")),
        "ready_after_bad_override": http_client.is_model_ready("add_sub"),
        "max_batch_size_after_bad_override": http_client.get_model_config("add_sub")["max_batch_size"],
    }
    # unloading a model that does not exist is not an error; neither that nor the failed loads (here and in
    # test_raw_http) add anything to the index
    observed["http_unload_unknown"] = outcome(lambda: http_client.unload_model("nonexistent"))
    observed["grpc_unload_unknown"] = outcome(lambda: grpc_client.unload_model("nonexistent"))
    observed["index"] = sorted(m["name"] for m in http_client.get_model_repository_index())
    message = "failed to load 'nonexistent', failed to poll from model repository"
    expected_errors = {
        "http_load_unknown": ("500", message),
        "grpc_load_unknown": ("StatusCode.INTERNAL", message),
        "grpc_load_bad_override": (
            "StatusCode.INTERNAL", "failed to load 'add_sub', failed to poll from model repository"),
    }
    if endpoint.kind == "triton_nb":
        # the client's mistakes, named: a model the repository lacks (404) and an override that is not JSON
        # (400), where Triton answers 500 "failed to poll" and logs the cause
        missing = f"no model 'nonexistent' in repository {endpoint.server.repository}"
        expected_errors = {
            "http_load_unknown": ("404", missing),
            "grpc_load_unknown": ("StatusCode.NOT_FOUND", missing),
            "grpc_load_bad_override": ("StatusCode.INVALID_ARGUMENT", observed["grpc_load_bad_override"][1]),
        }
        assert observed["grpc_load_bad_override"][1].startswith("model 'add_sub' config override: not valid JSON")
    assert observed == {
        **expected_errors,
        "ready_after_bad_override": True,
        "max_batch_size_after_bad_override": 8,
        "http_unload_unknown": "ok",
        "grpc_unload_unknown": "ok",
        "index": list(MODELS),
    }
