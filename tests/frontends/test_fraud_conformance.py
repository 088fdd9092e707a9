"""The exported fraud ensemble answers the same on triton_nb and on real Triton 2.51.

One exported folder (``model_backend="python"``: real Triton has no FIL backend) is served by each
server in turn; each must give XGBoost's own predictions (so the two agree with each other) over
HTTP binary and gRPC, and the preprocessing model's features must match the trained model's.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.conformance_servers import SERVER_PARAMS, start_server
from triton_nb.fraud import request_tensors
from triton_nb.repository import export_fraud_repository

N_ROWS = 200
CHUNK = 50


@pytest.fixture(scope="module")
def fraud_repo(trained, tmp_path_factory):
    return export_fraud_repository(trained, tmp_path_factory.mktemp("fraud") / "repo", model_backend="python")


@pytest.fixture(scope="module")
def rows(fraud_frame, trained):
    rows = fraud_frame.sample(N_ROWS, random_state=4)
    expected = trained.predict(rows)
    assert 0 < expected.sum() < len(expected)  # both classes, so equal predictions mean something
    return rows


def _datatype(array: np.ndarray) -> str:
    return "FP32" if array.dtype == np.float32 else "BYTES"


def _http_inputs(data: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in data.items():
        tensor = httpclient.InferInput(name, list(array.shape), _datatype(array))
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    return inputs


def _grpc_inputs(data: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in data.items():
        tensor = grpcclient.InferInput(name, list(array.shape), _datatype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@pytest.mark.parametrize("kind", SERVER_PARAMS)
def test_fraud_ensemble_predictions(kind, fraud_repo, rows, trained):
    expected = trained.predict(rows)
    server = start_server(kind, fraud_repo)
    try:
        http = httpclient.InferenceServerClient(server.endpoint.http_url, network_timeout=60.0)
        grpc = grpcclient.InferenceServerClient(server.endpoint.grpc_url)
        for model in ("preprocessing", "fil", "ensemble"):
            assert http.is_model_ready(model) and grpc.is_model_ready(model), model
        got_http, got_grpc = [], []
        for start in range(0, len(rows), CHUNK):
            data = request_tensors(rows.iloc[start:start + CHUNK])
            got_http.append(http.infer("ensemble", _http_inputs(data)).as_numpy("predictions"))
            got_grpc.append(grpc.infer("ensemble", _grpc_inputs(data)).as_numpy("predictions"))
        features = grpc.infer("preprocessing", _grpc_inputs(request_tensors(rows.head(CHUNK)))).as_numpy("OUTPUT")
        http.close()
        grpc.close()
    finally:
        server.stop()
    got_http, got_grpc = np.concatenate(got_http), np.concatenate(got_grpc)
    assert got_http.shape == got_grpc.shape == (N_ROWS,)  # FIL squeezes dims [1]
    np.testing.assert_array_equal(got_http, got_grpc)
    np.testing.assert_array_equal(got_http, expected)
    np.testing.assert_array_equal(features, trained.features(rows.head(CHUNK)))
