"""The exported fraud repository loads in real NVIDIA Triton and answers like XGBoost does.

The server is the `tritonserver` of PyPI's nvidia-pytriton (Triton 2.51, Python backend, no FIL
backend), so the trees are exported with model_backend="python": the Python-backend twin with
FIL's tensors and semantics. CI installs the server; a server that cannot run fails the test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import xgboost as xgb
from tritonclient.utils import InferenceServerException

from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from triton_nb.fraud import request_tensors
from triton_nb.repository import export_fraud_repository

pytestmark = [pytest.mark.real_triton, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def _server_available():
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real Triton cannot run here: {reason}")


def tensors(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    return request_tensors(rows)


def _http_inputs(data: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in data.items():
        tensor = httpclient.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "BYTES")
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    return inputs


def _grpc_inputs(data: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in data.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_ensemble_predictions_equal_xgboost_over_http_and_grpc(trained, fraud_frame, tmp_path):
    root = export_fraud_repository(trained, tmp_path / "repo", model_backend="python")
    rows = fraud_frame.sample(240, random_state=4)
    expected = trained.predict(rows)
    assert 0 < expected.sum() < len(expected)  # both classes present, so equality means something
    with RealTritonServer(root) as server:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        for model in ("preprocessing", "fil", "ensemble"):
            assert http.is_model_ready(model), server.log_tail()
        got_http, got_grpc = [], []
        for start in range(0, len(rows), 80):
            data = tensors(rows.iloc[start:start + 80])
            got_http.append(http.infer("ensemble", _http_inputs(data)).as_numpy("predictions"))
            got_grpc.append(grpc.infer("ensemble", _grpc_inputs(data)).as_numpy("predictions"))
        np.testing.assert_array_equal(np.concatenate(got_http), expected)  # [rows]: FIL's squeezed shape
        np.testing.assert_array_equal(np.concatenate(got_grpc), expected)
        features = http.infer("preprocessing", _http_inputs(tensors(rows.head(50)))).as_numpy("OUTPUT")
        np.testing.assert_array_equal(features, trained.features(rows.head(50)))
        bad = tensors(rows.head(3))
        bad["Amount"][1, 0] = b"twelve"
        with pytest.raises(InferenceServerException, match=r"'Amount'.*twelve"):
            http.infer("ensemble", _http_inputs(bad))
        assert http.infer("ensemble", _http_inputs(tensors(rows.head(3)))).as_numpy("predictions").shape == (3,)


def test_probabilities_and_shap_values(trained, fraud_frame, tmp_path):
    root = export_fraud_repository(trained, tmp_path / "repo", model_backend="python", predict_proba=True,
                                   treeshap_output=True)
    rows = fraud_frame.sample(60, random_state=5)
    booster = trained.booster[: trained.best_iteration + 1]
    features = trained.features(rows)
    with RealTritonServer(root) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        result = client.infer("ensemble", _http_inputs(tensors(rows)))
    np.testing.assert_allclose(result.as_numpy("predictions"), trained.predict_proba(rows)[:, 1], rtol=1e-6)
    shap = booster.predict(xgb.DMatrix(features), pred_contribs=True, validate_features=False)
    np.testing.assert_allclose(result.as_numpy("shap_values"), shap, rtol=1e-5, atol=1e-6)
