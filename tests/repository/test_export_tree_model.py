"""export_tree_model: any XGBoost, LightGBM or scikit-learn forest as a FIL-style model folder."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import onnxruntime as ort
import pytest
import xgboost as xgb
from sklearn.datasets import make_classification, make_regression
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InvalidArgumentError
from triton_nb.repository import export_fraud_repository, export_tree_model, load_config, validate_repository


def _outputs(config):
    return [(t.name, list(t.dims)) for t in config.output]


@pytest.fixture(scope="module")
def data():
    return make_classification(n_samples=400, n_features=6, n_informative=4, n_classes=3, random_state=0)


def test_xgboost_multiclass_with_probabilities_and_shap(data, tmp_path):
    X, y = data
    model = xgb.XGBClassifier(n_estimators=5, max_depth=3).fit(X, y)
    folder = export_tree_model(model, tmp_path, name="multi", predict_proba=True, treeshap_output=True)
    config = load_config(folder)
    assert config.name == "multi" and config.backend == "fil"
    assert config.parameters["model_type"].string_value == "xgboost_json"
    assert _outputs(config) == [("output__0", [3]), ("treeshap_output", [3, 7])]
    assert (folder / "1" / "xgboost.json").is_file()
    assert validate_repository(tmp_path) == []


def test_lightgbm_binary_class(tmp_path):
    X, y = make_classification(n_samples=300, n_features=5, random_state=1)
    model = lgb.LGBMClassifier(n_estimators=5, verbose=-1).fit(X, y)
    folder = export_tree_model(model, tmp_path, threshold=0.3)
    config = load_config(folder)
    assert config.parameters["model_type"].string_value == "lightgbm"
    assert config.parameters["threshold"].string_value == "0.3"
    assert _outputs(config) == [("output__0", [1])]
    assert (folder / "1" / "model.txt").is_file()
    assert validate_repository(tmp_path) == []


def test_sklearn_forest_goes_through_a_treelite_checkpoint(tmp_path):
    X, y = make_classification(n_samples=300, n_features=5, random_state=2)
    forest = RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(X, y)
    folder = export_tree_model(forest, tmp_path, predict_proba=True)
    config = load_config(folder)
    assert config.parameters["model_type"].string_value == "treelite_checkpoint"
    assert _outputs(config) == [("output__0", [2])]  # a two-class model in Treelite, as FIL sees it
    assert (folder / "1" / "checkpoint.tl").is_file()
    with pytest.raises(InvalidArgumentError, match="2 for a scikit-learn binary forest"):
        export_tree_model(forest, tmp_path, name="narrow", predict_proba=True, proba_width=1)
    Xr, yr = make_regression(n_samples=200, n_features=4, random_state=0)
    regressor = export_tree_model(RandomForestRegressor(n_estimators=3).fit(Xr, yr), tmp_path, name="reg")
    assert load_config(regressor).parameters["output_class"].string_value == "false"
    with pytest.raises(InvalidArgumentError, match="predict_proba needs a classifier"):
        export_tree_model(RandomForestRegressor(n_estimators=3).fit(Xr, yr), tmp_path, name="r2", predict_proba=True)
    assert validate_repository(tmp_path) == []


def test_onnx_and_python_backends(tmp_path):
    X, y = make_classification(n_samples=300, n_features=5, random_state=3)
    X = X.astype(np.float32)
    model = xgb.XGBClassifier(n_estimators=6, max_depth=3).fit(X, y)
    folder = export_tree_model(model, tmp_path, name="onnx", model_backend="onnxruntime", predict_proba=True,
                               proba_width=1)
    config = load_config(folder)
    assert (config.backend, config.platform) == ("onnxruntime", "onnxruntime_onnx")
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(["output__0"], {"input__0": X})
    np.testing.assert_allclose(got[:, 0], model.predict_proba(X)[:, 1], atol=1e-5)
    twin = export_tree_model(model, tmp_path, name="twin", model_backend="python")
    assert sorted(p.name for p in (twin / "1").iterdir()) == ["fil_semantics.py", "model.py", "xgboost.json"]
    assert load_config(twin).instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    with pytest.raises(InvalidArgumentError, match="serves XGBoost models"):
        export_tree_model(lgb.LGBMClassifier(n_estimators=2, verbose=-1).fit(X, y), tmp_path, name="x",
                          model_backend="python")
    with pytest.raises(InvalidArgumentError, match="ONNX Runtime cannot produce SHAP"):
        export_tree_model(model, tmp_path, name="y", model_backend="onnxruntime", treeshap_output=True)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert validate_repository(tmp_path) == []


def test_fraud_repository_with_onnxruntime_trees(trained, fraud_frame, tmp_path):
    root = export_fraud_repository(trained, tmp_path / "r", model_backend="onnxruntime")
    assert validate_repository(root) == []
    features = trained.features(fraud_frame.head(500))
    session = ort.InferenceSession(str(root / "fil" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    (classes,) = session.run(["output__0"], {"input__0": features})
    proba = trained.predict_proba(fraud_frame.head(500))[:, 1]
    clear = np.abs(proba - trained.threshold) > 1e-5
    np.testing.assert_array_equal(classes[clear, 0], (proba[clear] > trained.threshold).astype(np.float32))
