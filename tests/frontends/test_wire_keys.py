"""The wire as real Triton 2.51 answers it: the same top-level keys for the same repository.

Each server in turn (real Triton first, then triton_nb) serves the conformance repository and the
exported fraud ensemble (``model_backend="python"``, which real Triton can serve); every route of
the conformance suite is asked once over HTTP and the gRPC infer and config answers once, and the
key sets (the JSON keys; for gRPC the fields set and the parameter names) are compared. Values are
the conformance suite's business; here a key one server sends and the other does not fails.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.helpers.conformance_repo import write_conformance_repo
from tests.helpers.conformance_servers import SERVER_KINDS, start_server
from triton_nb.fraud import request_tensors
from triton_nb.repository import export_fraud_repository
from triton_nb.server.observability.stats import BATCH_REASONS_KEY

pytestmark = pytest.mark.real_triton


def _ask(url: str, body: dict | None = None) -> Any:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return {"error status": error.code}


def _json_inputs(tensors: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    return [{"name": name, "datatype": "FP32" if array.dtype.kind == "f" else "BYTES", "shape": list(array.shape),
             "data": [v.decode() if isinstance(v, bytes) else float(v) for v in array.ravel().tolist()]}
            for name, array in tensors.items()]


def _keys(answer: Any, nested: tuple[str, ...] = ()) -> dict[str, Any]:
    """Top-level keys, and the keys one level into ``nested`` ones (a list: its first element)."""
    if not isinstance(answer, dict):
        return {"<not an object>": type(answer).__name__}
    shape: dict[str, Any] = {key: None for key in answer}
    for key in nested:
        value = answer.get(key)
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, dict):
            shape[key] = sorted(value)
    return shape


def _grpc_fields(message: Any) -> list[str]:
    return sorted(field.name for field, _ in message.ListFields())


def _answers(kind: str, repo, models: tuple[str, ...], infer: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    started = start_server(kind, repo)
    try:
        base = f"http://{started.endpoint.http_url}"
        found: dict[str, Any] = {"server metadata": _keys(_ask(f"{base}/v2")),
                                 "repository index": _keys(_ask(f"{base}/v2/repository/index", {})[0])}
        for model in models:
            found[f"{model} metadata"] = _keys(_ask(f"{base}/v2/models/{model}"), ("inputs", "outputs"))
            found[f"{model} config"] = _keys(_ask(f"{base}/v2/models/{model}/config"),
                                             ("input", "output", "instance_group", "optimization", "dynamic_batching",
                                              "version_policy", "model_transaction_policy"))
            stats = _ask(f"{base}/v2/models/{model}/stats")["model_stats"][0]
            if kind == "triton_nb":  # our one extra key (beyond Triton, documented): there, and set aside
                assert BATCH_REASONS_KEY in stats, sorted(stats)
                del stats[BATCH_REASONS_KEY]
            found[f"{model} stats"] = _keys(stats, ("inference_stats",))
        grpc = grpcclient.InferenceServerClient(started.endpoint.grpc_url)
        try:
            for model, tensors in infer.items():
                found[f"{model} infer"] = _keys(_ask(f"{base}/v2/models/{model}/infer",
                                                     {"inputs": _json_inputs(tensors)}), ("outputs",))
                inputs = []
                for name, array in tensors.items():
                    datatype = "FP32" if array.dtype.kind == "f" else "BYTES"
                    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
                    tensor.set_data_from_numpy(array)
                    inputs.append(tensor)
                response = grpc.infer(model, inputs).get_response()
                found[f"{model} grpc infer"] = (_grpc_fields(response), sorted(response.parameters))
                config = grpc.get_model_config(model).config
                found[f"{model} grpc config"] = _grpc_fields(config)
        finally:
            grpc.close()
        return found
    finally:
        started.stop()


def _compare(answers: dict[str, dict[str, Any]]) -> None:
    real, ours = answers["real_triton"], answers["triton_nb"]
    assert real.keys() == ours.keys()
    differing = {route: {"real Triton": real[route], "triton_nb": ours[route]}
                 for route in real if real[route] != ours[route]}
    assert differing == {}, json.dumps(differing, indent=1, default=str)


def test_conformance_repository_routes_have_real_tritons_keys(tmp_path):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    answers = {kind: _answers(kind, write_conformance_repo(tmp_path / kind / "repo"), ("add_sub", "echo_all"),
                              {"add_sub": {"INPUT0": x, "INPUT1": x}})
               for kind in reversed(SERVER_KINDS)}
    _compare(answers)


@pytest.fixture(scope="module")
def fraud_repo(trained, tmp_path_factory):
    return export_fraud_repository(trained, tmp_path_factory.mktemp("wire-fraud") / "repo", model_backend="python")


def test_fraud_ensemble_routes_have_real_tritons_keys(fraud_repo, fraud_frame):
    tensors = request_tensors(fraud_frame.head(2))
    answers = {kind: _answers(kind, fraud_repo, ("preprocessing", "fil", "ensemble"),
                              {"ensemble": tensors, "preprocessing": tensors})
               for kind in reversed(SERVER_KINDS)}
    _compare(answers)
