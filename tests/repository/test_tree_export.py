"""Tree model export: describing models, FIL model files, and ONNX twins with FIL semantics."""

from __future__ import annotations

import json

import lightgbm as lgb
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import treelite
import xgboost as xgb
from sklearn import ensemble
from sklearn.datasets import make_classification, make_regression
from sklearn.linear_model import LogisticRegression

from triton_nb.errors import InvalidArgumentError
from triton_nb.repository.fil_semantics import FilSettings, fil_output
from triton_nb.repository.tree_export import (
    TreeModelInfo,
    describe_tree_model,
    write_fil_model_file,
    write_onnx_model,
)

# skl2onnx 1.20 passes numpy booleans as integer-list attributes of its tree nodes; protobuf warns
# (and will reject them from protobuf 7.34). Not ours to fix; the converted graphs are correct.
pytestmark = pytest.mark.filterwarnings("ignore:Field onnx.AttributeProto.ints:DeprecationWarning")

NUM_FEATURES = 6
NAMES = [f"col_{i}" for i in range(NUM_FEATURES)]  # names onnxmltools cannot map to columns


def _float32(x: np.ndarray) -> np.ndarray:
    # FIL and ONNX see float32; training on float32-representable values keeps every library's
    # split decisions identical to what they see at serving time.
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def binary() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_classification(400, NUM_FEATURES, n_informative=4, random_state=0)
    return _float32(x), y


@pytest.fixture(scope="module")
def multiclass() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_classification(400, NUM_FEATURES, n_informative=4, n_classes=3, random_state=1)
    return _float32(x), y


@pytest.fixture(scope="module")
def regression() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_regression(400, NUM_FEATURES, noise=5.0, random_state=2)
    return _float32(x), y / 100.0  # values of order 1, so an absolute tolerance means something


def _xgb_booster(params: dict, data: tuple[np.ndarray, np.ndarray], feature_names: list[str] | None = None):
    x, y = data
    return xgb.train({"max_depth": 3, **params}, xgb.DMatrix(x, label=y, feature_names=feature_names), 6)


def _xgb_predict(booster: xgb.Booster, x: np.ndarray) -> np.ndarray:
    return booster.predict(xgb.DMatrix(x, feature_names=booster.feature_names))


@pytest.fixture(scope="module")
def models(binary, multiclass, regression) -> dict:
    """One fitted model of each kind, keyed by a short name."""
    small = {"n_estimators": 6, "random_state": 0}
    return {
        "xgb_booster_binary": _xgb_booster({"objective": "binary:logistic"}, binary, NAMES),
        "xgb_booster_multi": _xgb_booster({"objective": "multi:softprob", "num_class": 3}, multiclass),
        "xgb_booster_softmax": _xgb_booster({"objective": "multi:softmax", "num_class": 3}, multiclass),
        "xgb_booster_reg": _xgb_booster({"objective": "reg:squarederror"}, regression),
        "xgb_clf_binary": xgb.XGBClassifier(n_estimators=6, max_depth=3).fit(*binary),
        "xgb_clf_multi": xgb.XGBClassifier(n_estimators=6, max_depth=3).fit(*multiclass),
        "xgb_reg": xgb.XGBRegressor(n_estimators=6, max_depth=3).fit(*regression),
        "lgb_booster_binary": lgb.train({"objective": "binary", "verbose": -1}, lgb.Dataset(*binary), 6),
        "lgb_clf_binary": lgb.LGBMClassifier(n_estimators=6, verbose=-1).fit(*binary),
        "lgb_clf_multi": lgb.LGBMClassifier(n_estimators=6, verbose=-1).fit(*multiclass),
        "lgb_reg": lgb.LGBMRegressor(n_estimators=6, verbose=-1).fit(*regression),
        "rf_binary": ensemble.RandomForestClassifier(**small).fit(*binary),
        "rf_multi": ensemble.RandomForestClassifier(**small).fit(*multiclass),
        "rf_reg": ensemble.RandomForestRegressor(**small).fit(*regression),
        "et_binary": ensemble.ExtraTreesClassifier(**small).fit(*binary),
        "et_reg": ensemble.ExtraTreesRegressor(**small).fit(*regression),
        "gb_binary": ensemble.GradientBoostingClassifier(**small).fit(*binary),
        "gb_multi": ensemble.GradientBoostingClassifier(**small).fit(*multiclass),
        "gb_reg": ensemble.GradientBoostingRegressor(**small).fit(*regression),
        "hgb_binary": ensemble.HistGradientBoostingClassifier(max_iter=6, random_state=0).fit(*binary),
        "hgb_reg": ensemble.HistGradientBoostingRegressor(max_iter=6, random_state=0).fit(*regression),
    }


# ------------------------------------------------------------------------------------------------
# describe_tree_model
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "library", "task", "num_classes"),
    [
        ("xgb_booster_binary", "xgboost", "binary", 1),
        ("xgb_booster_multi", "xgboost", "multiclass", 3),
        ("xgb_booster_softmax", "xgboost", "multiclass", 3),
        ("xgb_booster_reg", "xgboost", "regression", 1),
        ("xgb_clf_binary", "xgboost", "binary", 1),
        ("xgb_clf_multi", "xgboost", "multiclass", 3),
        ("xgb_reg", "xgboost", "regression", 1),
        ("lgb_booster_binary", "lightgbm", "binary", 1),
        ("lgb_clf_binary", "lightgbm", "binary", 1),
        ("lgb_clf_multi", "lightgbm", "multiclass", 3),
        ("lgb_reg", "lightgbm", "regression", 1),
        ("rf_binary", "sklearn", "binary", 1),
        ("rf_multi", "sklearn", "multiclass", 3),
        ("rf_reg", "sklearn", "regression", 1),
        ("et_binary", "sklearn", "binary", 1),
        ("et_reg", "sklearn", "regression", 1),
        ("gb_binary", "sklearn", "binary", 1),
        ("gb_multi", "sklearn", "multiclass", 3),
        ("gb_reg", "sklearn", "regression", 1),
        ("hgb_binary", "sklearn", "binary", 1),
        ("hgb_reg", "sklearn", "regression", 1),
    ],
)
def test_describe_tree_model(models, name, library, task, num_classes):
    info = describe_tree_model(models[name])
    assert info == TreeModelInfo(library=library, task=task, num_features=NUM_FEATURES, num_classes=num_classes)


def test_tree_model_info_is_frozen(models):
    info = describe_tree_model(models["rf_binary"])
    with pytest.raises(AttributeError):
        info.task = "regression"  # type: ignore[misc]


@pytest.mark.parametrize(
    "model",
    [LogisticRegression(), {"trees": []}, ensemble.IsolationForest(), "xgboost.json"],
    ids=["sklearn-linear", "dict", "isolation-forest", "str"],
)
def test_describe_rejects_unsupported_objects(model):
    with pytest.raises(InvalidArgumentError, match=type(model).__name__):
        describe_tree_model(model)


@pytest.mark.parametrize(
    "model",
    [
        xgb.Booster(),
        xgb.XGBClassifier(),
        xgb.XGBRegressor(),
        lgb.LGBMClassifier(),
        lgb.LGBMRegressor(),
        ensemble.RandomForestClassifier(),
        ensemble.GradientBoostingRegressor(),
    ],
    ids=lambda model: type(model).__name__,
)
def test_describe_rejects_unfitted_models(model):
    with pytest.raises(InvalidArgumentError, match="not fitted"):
        describe_tree_model(model)


def test_describe_rejects_unsupported_xgboost_objective(binary):
    booster = _xgb_booster({"objective": "binary:hinge"}, binary)
    with pytest.raises(InvalidArgumentError, match="binary:hinge"):
        describe_tree_model(booster)


def test_describe_rejects_linear_xgboost(binary):
    with pytest.raises(InvalidArgumentError, match="gblinear"):
        describe_tree_model(xgb.train({"booster": "gblinear"}, xgb.DMatrix(*binary), 2))


@pytest.mark.parametrize("objective", ["cross_entropy", "multiclassova"])
def test_describe_rejects_unsupported_lightgbm_objective(binary, multiclass, objective):
    data = multiclass if objective == "multiclassova" else binary
    params = {"objective": objective, "verbose": -1, **({"num_class": 3} if objective == "multiclassova" else {})}
    booster = lgb.train(params, lgb.Dataset(*data), 2)
    with pytest.raises(InvalidArgumentError, match=objective):
        describe_tree_model(booster)


def test_describe_rejects_multi_output_forest(binary):
    x, y = binary
    forest = ensemble.RandomForestRegressor(n_estimators=2).fit(x, np.column_stack([y, 1 - y]))
    with pytest.raises(InvalidArgumentError, match="multi-output"):
        describe_tree_model(forest)


# ------------------------------------------------------------------------------------------------
# write_fil_model_file
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "model_type", "filename"),
    [
        ("xgb_booster_binary", None, "xgboost.json"),
        ("xgb_booster_binary", "xgboost_ubj", "xgboost.ubj"),
        ("xgb_booster_multi", "xgboost_json", "xgboost.json"),
        ("xgb_clf_multi", "xgboost_ubj", "xgboost.ubj"),
        ("xgb_reg", None, "xgboost.json"),
    ],
)
def test_xgboost_file_round_trips(tmp_path, models, binary, multiclass, regression, name, model_type, filename):
    model = models[name]
    x = {"binary": binary, "multiclass": multiclass, "regression": regression}[describe_tree_model(model).task][0]
    written = write_fil_model_file(model, tmp_path / "1", model_type)
    assert written == (model_type or "xgboost_json", filename)
    path = tmp_path / "1" / filename
    if filename.endswith(".json"):
        json.loads(path.read_text())  # really JSON, not UBJSON with a .json name
    else:
        assert path.read_bytes()[:1] == b"{"  # UBJSON object marker
    booster = model if isinstance(model, xgb.Booster) else model.get_booster()
    expected = _xgb_predict(booster, x)
    np.testing.assert_array_equal(_xgb_predict(xgb.Booster(model_file=str(path)), x), expected)
    # FIL parses the file with Treelite: its reading must predict the same.
    loaded = treelite.frontend.load_xgboost_model(str(path))
    np.testing.assert_allclose(treelite.gtil.predict(loaded, x).reshape(expected.shape), expected, atol=1e-6)


def test_xgboost_wrapper_exports_best_iteration_only(tmp_path):
    x, y = make_classification(600, NUM_FEATURES, flip_y=0.3, random_state=3)
    x = _float32(x)
    model = xgb.XGBClassifier(n_estimators=60, max_depth=4, learning_rate=0.5, early_stopping_rounds=3)
    model.fit(x[:400], y[:400], eval_set=[(x[400:], y[400:])], verbose=False)
    assert model.best_iteration + 1 < model.get_booster().num_boosted_rounds()  # early stopping kicked in
    write_fil_model_file(model, tmp_path)
    exported = xgb.Booster(model_file=str(tmp_path / "xgboost.json"))
    assert exported.num_boosted_rounds() == model.best_iteration + 1
    np.testing.assert_allclose(_xgb_predict(exported, x), model.predict_proba(x)[:, 1], atol=1e-7)


@pytest.mark.parametrize("name", ["lgb_booster_binary", "lgb_clf_binary", "lgb_clf_multi", "lgb_reg"])
def test_lightgbm_file_round_trips(tmp_path, models, binary, multiclass, regression, name):
    model = models[name]
    x = {"binary": binary, "multiclass": multiclass, "regression": regression}[describe_tree_model(model).task][0]
    assert write_fil_model_file(model, tmp_path) == ("lightgbm", "model.txt")
    path = tmp_path / "model.txt"
    booster = model if isinstance(model, lgb.Booster) else model.booster_
    expected = booster.predict(x)
    np.testing.assert_array_equal(lgb.Booster(model_file=str(path)).predict(x), expected)
    loaded = treelite.frontend.load_lightgbm_model(str(path))
    np.testing.assert_allclose(treelite.gtil.predict(loaded, x).reshape(expected.shape), expected, atol=1e-6)


def _sklearn_expected(model, x: np.ndarray) -> np.ndarray:
    """What Treelite's GTIL gives for a scikit-learn model, in scikit-learn's terms."""
    if not hasattr(model, "predict_proba"):
        return model.predict(x).reshape(-1, 1)
    proba = model.predict_proba(x)
    # Forests keep one probability per class, even for two classes; boosting keeps P(class 1).
    if proba.shape[1] == 2 and isinstance(model, ensemble.GradientBoostingClassifier):
        return proba[:, 1:]
    return proba


@pytest.mark.parametrize("name", ["rf_binary", "rf_multi", "rf_reg", "et_binary", "gb_binary", "gb_multi", "gb_reg"])
def test_sklearn_checkpoint_round_trips(tmp_path, models, binary, multiclass, regression, name):
    model = models[name]
    x = {"binary": binary, "multiclass": multiclass, "regression": regression}[describe_tree_model(model).task][0]
    assert write_fil_model_file(model, tmp_path) == ("treelite_checkpoint", "checkpoint.tl")
    loaded = treelite.Model.deserialize(str(tmp_path / "checkpoint.tl"))
    assert loaded.num_feature == NUM_FEATURES
    predicted = treelite.gtil.predict(loaded, x)  # (rows, targets, classes)
    assert predicted.shape[:2] == (len(x), 1)
    np.testing.assert_allclose(predicted[:, 0, :], _sklearn_expected(model, x), atol=1e-6)


@pytest.mark.parametrize("name", ["xgb_clf_binary", "lgb_clf_multi"])
def test_boosters_can_be_written_as_checkpoints(tmp_path, models, binary, multiclass, name):
    model = models[name]
    x = binary[0] if name == "xgb_clf_binary" else multiclass[0]
    assert write_fil_model_file(model, tmp_path, "treelite_checkpoint") == ("treelite_checkpoint", "checkpoint.tl")
    loaded = treelite.Model.deserialize(str(tmp_path / "checkpoint.tl"))
    expected = model.predict_proba(x)
    expected = expected[:, 1:] if expected.shape[1] == 2 else expected
    np.testing.assert_allclose(treelite.gtil.predict(loaded, x)[:, 0, :], expected, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "model_type", "message"),
    [
        ("xgb_booster_binary", "lightgbm", "does not fit a xgboost model"),
        ("lgb_clf_binary", "xgboost_json", "does not fit a lightgbm model"),
        ("rf_binary", "xgboost_ubj", "does not fit a sklearn model"),
        ("xgb_booster_binary", "xgboost", "legacy binary"),
        ("xgb_booster_binary", "onnx", "unknown FIL model_type 'onnx'"),
    ],
)
def test_write_fil_model_file_rejects_wrong_model_types(tmp_path, models, name, model_type, message):
    with pytest.raises(InvalidArgumentError, match=message):
        write_fil_model_file(models[name], tmp_path, model_type)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_write_fil_model_file_rejects_unfitted_models(tmp_path):
    with pytest.raises(InvalidArgumentError, match="not fitted"):
        write_fil_model_file(ensemble.RandomForestClassifier(), tmp_path)


# ------------------------------------------------------------------------------------------------
# write_onnx_model
# ------------------------------------------------------------------------------------------------


def _native(model, x: np.ndarray) -> np.ndarray:
    """What fil_output expects: values, P(class 1), or class probabilities."""
    if isinstance(model, xgb.Booster):
        if json.loads(model.save_config())["learner"]["objective"]["name"] == "multi:softmax":
            softprob = model.copy()  # multi:softmax predicts labels; FIL works from probabilities
            softprob.set_param({"objective": "multi:softprob"})
            return _xgb_predict(softprob, x)
        return _xgb_predict(model, x)
    if isinstance(model, lgb.Booster):
        return model.predict(x)
    if not hasattr(model, "predict_proba"):
        return model.predict(x)
    proba = model.predict_proba(x)
    return proba[:, 1] if proba.shape[1] == 2 else proba


def _run_onnx(path, x: np.ndarray) -> np.ndarray:
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {"input__0": x})
    return output


def _assert_fil_io(path, width: int) -> None:
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["input__0"]
    assert [o.name for o in graph.output] == ["output__0"]
    (inp,), (out,) = graph.input, graph.output
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    in_dims = inp.type.tensor_type.shape.dim
    out_dims = out.type.tensor_type.shape.dim
    assert len(in_dims) == 2 and not in_dims[0].HasField("dim_value") and in_dims[1].dim_value == NUM_FEATURES
    assert len(out_dims) == 2 and not out_dims[0].HasField("dim_value") and out_dims[1].dim_value == width


def _check_onnx(tmp_path, model, x: np.ndarray, settings: FilSettings, proba_width: int = 1) -> np.ndarray:
    path = write_onnx_model(model, tmp_path / "1", settings, proba_width)
    assert path == tmp_path / "1" / "model.onnx"
    native = _native(model, x)
    expected = fil_output(native, settings, proba_width)
    actual = _run_onnx(path, x)
    _assert_fil_io(path, expected.shape[1])
    assert actual.dtype == np.float32
    assert actual.shape == expected.shape
    if settings.output_class and not settings.predict_proba:
        if native.ndim == 1:  # binary: no row may sit on the threshold, or float noise could flip it
            assert np.min(np.abs(native - settings.threshold)) > 1e-5
            np.testing.assert_array_equal(actual, expected)
        else:
            # Multiclass: forests vote in fractions, so exact ties happen; a tied row may name any
            # of its top classes (FIL, ONNX and numpy all pick the first, but float sums may differ).
            top = native.max(axis=1, keepdims=True)
            tied = (native >= top - 1e-5).sum(axis=1) > 1
            assert tied.mean() < 0.2
            np.testing.assert_array_equal(actual[~tied], expected[~tied])
            picked = actual[tied, 0].astype(int)
            assert np.all(native[tied, picked] >= top[tied, 0] - 1e-5)
        assert len(np.unique(actual)) > 1  # the data exercises more than one class
    else:
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)
    return actual


CLASS_030 = FilSettings("xgboost_json", output_class=True, threshold=0.3)
PROBA = FilSettings("xgboost_json", output_class=True, predict_proba=True)


@pytest.mark.parametrize("name", ["xgb_booster_binary", "xgb_clf_binary", "lgb_clf_binary", "lgb_booster_binary"])
def test_onnx_binary_class_uses_threshold(tmp_path, models, binary, name):
    x = binary[0]
    actual = _check_onnx(tmp_path, models[name], x, CLASS_030)
    # The threshold matters: at 0.5 some rows would be answered differently.
    assert not np.array_equal(actual, fil_output(_native(models[name], x), FilSettings("x", True)))


@pytest.mark.parametrize("name", ["xgb_booster_binary", "xgb_clf_binary", "lgb_clf_binary", "rf_binary"])
@pytest.mark.parametrize("proba_width", [1, 2])
def test_onnx_binary_probabilities(tmp_path, models, binary, name, proba_width):
    actual = _check_onnx(tmp_path, models[name], binary[0], PROBA, proba_width)
    assert actual.shape == (len(binary[0]), proba_width)


@pytest.mark.parametrize("name", ["xgb_booster_multi", "xgb_booster_softmax", "xgb_clf_multi", "lgb_clf_multi"])
@pytest.mark.parametrize("settings", [FilSettings("x", True), PROBA], ids=["class", "proba"])
def test_onnx_multiclass(tmp_path, models, multiclass, name, settings):
    actual = _check_onnx(tmp_path, models[name], multiclass[0], settings)
    assert actual.shape[1] == (3 if settings.predict_proba else 1)


@pytest.mark.parametrize("name", ["xgb_booster_reg", "xgb_reg", "lgb_reg", "rf_reg", "gb_reg"])
def test_onnx_regression(tmp_path, models, regression, name):
    actual = _check_onnx(tmp_path, models[name], regression[0], FilSettings("xgboost_json", output_class=False))
    assert actual.shape == (len(regression[0]), 1)


@pytest.mark.parametrize(
    ("name", "settings", "proba_width"),
    [
        ("rf_binary", CLASS_030, 1),
        ("rf_binary", PROBA, 2),
        ("rf_multi", FilSettings("x", True), 1),
        ("gb_binary", CLASS_030, 1),
        ("hgb_binary", PROBA, 2),
    ],
)
def test_onnx_sklearn_classifiers(tmp_path, models, binary, multiclass, name, settings, proba_width):
    x = multiclass[0] if name.endswith("multi") else binary[0]
    _check_onnx(tmp_path, models[name], x, settings, proba_width)


def test_onnx_classifier_without_output_class_gives_probabilities(tmp_path, models, binary):
    actual = _check_onnx(tmp_path, models["xgb_booster_binary"], binary[0], FilSettings("x", output_class=False))
    assert actual.min() > 0.0 and actual.max() < 1.0 and len(np.unique(actual)) > 2


def test_onnx_keeps_feature_named_booster_intact(tmp_path, models):
    booster = models["xgb_booster_binary"]
    write_onnx_model(booster, tmp_path, CLASS_030)
    assert booster.feature_names == NAMES  # the names were dropped from a copy only


def test_onnx_rejects_output_class_on_regressor(tmp_path, models):
    with pytest.raises(InvalidArgumentError, match="regressor"):
        write_onnx_model(models["xgb_reg"], tmp_path, CLASS_030)


def test_onnx_rejects_bad_proba_width(tmp_path, models):
    with pytest.raises(InvalidArgumentError, match="proba_width"):
        write_onnx_model(models["xgb_clf_binary"], tmp_path, PROBA, proba_width=3)


def test_onnx_rejects_unsupported_models(tmp_path):
    with pytest.raises(InvalidArgumentError, match="LogisticRegression"):
        write_onnx_model(LogisticRegression(), tmp_path, PROBA)
