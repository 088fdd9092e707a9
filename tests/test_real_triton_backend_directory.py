"""A Python-based backend against real Triton: the same backend folder (``scaler/model.py`` and a
helper module beside it) in each server's backend directory, the same two models naming it with
their own parameters and files, the same answers over HTTP and gRPC; the config each server
reports for such a model names its runtime as Triton does; and a backend's ``auto_complete_config``
completes the config of a model that names only the backend, as Triton runs it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import triton_nb
from tests.helpers.custom_backends import SCALED, X, write_scaled_models, write_scaler_backend, write_tripler
from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason


def _observe(urls: dict[str, str]) -> dict:
    seen: dict = {}
    for protocol, tc in (("http", httpclient), ("grpc", grpcclient)):
        client = tc.InferenceServerClient(urls[protocol])
        for model in SCALED:
            tensor = tc.InferInput("X", list(X.shape), "FP32")
            tensor.set_data_from_numpy(X)
            seen[(protocol, model)] = client.infer(model, [tensor]).as_numpy("Y").tolist()
        client.close()
    config = httpclient.InferenceServerClient(urls["http"]).get_model_config("scaled_a")
    seen["config"] = (config.get("backend"), config.get("runtime"))
    return seen


@pytest.mark.parametrize("server", ["triton_nb", pytest.param("real_triton", marks=pytest.mark.real_triton)])
def test_a_python_based_backend_serves_as_on_triton(tmp_path, server):
    repo, backends = tmp_path / "repo", tmp_path / "backends"
    repo.mkdir()
    folder = write_scaler_backend(backends)
    write_scaled_models(repo)
    if server == "real_triton":
        reason = tritonserver_unavailable_reason()
        if reason is not None:
            pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)
        with RealTritonServer(repo, python_based_backends=[folder]) as real:
            seen = _observe({"http": real.http_url, "grpc": real.grpc_url})
    else:
        with triton_nb.serve(repo, http_port=0, grpc_port=0, backend_directory=backends) as ours:
            seen = _observe({"http": f"127.0.0.1:{ours.http_port}", "grpc": f"127.0.0.1:{ours.grpc_port}"})
    for model, (factor, offset) in SCALED.items():
        for protocol in ("http", "grpc"):
            np.testing.assert_allclose(seen[(protocol, model)], X * factor + offset)
    assert seen["config"] == ("scaler", "model.py")  # Triton reports the Python-based backend's runtime


@pytest.mark.parametrize("server", ["triton_nb", "triton_nb_process",
                                    pytest.param("real_triton", marks=pytest.mark.real_triton)])
def test_a_python_based_backend_completes_its_models_config_as_on_triton(tmp_path, server):
    """A model whose config names only its Python-based backend: the backend's model.py
    ``auto_complete_config`` declares its tensors and batch size (where the instances run: in
    this process for thread instances, in another for process ones) and the model serves."""
    repo, backends = tmp_path / "repo", tmp_path / "backends"
    folder = write_tripler(backends, repo)
    x = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)

    def observe(url: str) -> tuple:
        client = httpclient.InferenceServerClient(url)
        config = client.get_model_config("tripled")
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        answer = client.infer("tripled", [tensor]).as_numpy("Y")
        client.close()
        return (config["max_batch_size"], [(t["name"], t["data_type"], t["dims"]) for t in config["input"]],
                [(t["name"], t["data_type"], t["dims"]) for t in config["output"]]), answer

    if server == "real_triton":
        reason = tritonserver_unavailable_reason()
        if reason is not None:
            pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)
        with RealTritonServer(repo, python_based_backends=[folder]) as real:
            config, answer = observe(real.http_url)
    else:
        kind = "process" if server == "triton_nb_process" else "thread"
        with triton_nb.serve(repo, http_port=0, backend_directory=backends, python_instances=kind) as ours:
            config, answer = observe(f"127.0.0.1:{ours.http_port}")
        completed_in = {int(pid) for pid in (folder / "completed_in.txt").read_text().split()}
        assert (completed_in == {os.getpid()}) if kind == "thread" else (os.getpid() not in completed_in)
    assert config == (8, [("X", "TYPE_FP32", [2])], [("Y", "TYPE_FP32", [2])])
    np.testing.assert_allclose(answer, x * 3)
