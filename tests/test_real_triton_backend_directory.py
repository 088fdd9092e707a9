"""A Python-based backend against real Triton: the same backend folder (``scaler/model.py`` and a
helper module beside it) in each server's backend directory, the same two models naming it with
their own parameters and files, the same answers over HTTP and gRPC; and the config each server
reports for such a model names its runtime as Triton does."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from real_triton import RealTritonServer, tritonserver_unavailable_reason

sys.path.insert(0, str(Path(__file__).resolve().parent / "backends"))
from custom_backends import SCALED, X, write_scaled_models, write_scaler_backend

import triton_nb


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


@pytest.mark.parametrize("server", ["triton_nb", "real_triton"])
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
