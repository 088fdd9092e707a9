"""Training on small samples: local, Dask, persistence and evaluation."""

from __future__ import annotations

import ctypes
import functools
import json
import warnings

import numpy as np
import pandas as pd
import pytest
import xgboost as xgb

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.fraud import (
    FEATURE_NAMES,
    TrainedFraudModel,
    confusion_matrix_frame,
    evaluate_predictions,
    generate_transactions,
    label_array,
    plot_feature_importance,
    plot_precision_recall,
    train_fraud_model,
)
from triton_nb.fraud.train import resolve_device, stratified_validation_mask


def _cuda_devices_visible() -> int:
    """How many CUDA devices the driver reports (0 without a driver), asked through libcuda
    itself rather than through XGBoost."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


@functools.cache
def xgboost_trains_on_cuda() -> bool:
    """Whether this machine can train XGBoost on CUDA, decided apart from ``resolve_device``.

    Three independent signals must agree: the build has CUDA, the driver reports a device, and a
    10-row model trained with ``device="cuda"`` neither fails nor warns that it fell back to the
    CPU (which CUDA builds do, with a warning, when they find no GPU).
    """
    if not xgb.build_info().get("USE_CUDA", False) or _cuda_devices_visible() == 0:
        return False
    features = np.arange(20, dtype=np.float32).reshape(10, 2)
    labels = (features[:, 0] > 9).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            xgb.train({"device": "cuda", "tree_method": "hist", "objective": "binary:logistic"},
                      xgb.DMatrix(features, label=labels), num_boost_round=2)
        except xgb.core.XGBoostError:
            return False
    # "No visible GPU is found, setting device to CPU" / "Device is changed from GPU to CPU"
    return not any("to CPU" in str(warning.message) for warning in caught)


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    return generate_transactions(20_000, seed=5, fraud_rate=0.03)


@pytest.fixture(scope="module")
def model(data) -> TrainedFraudModel:
    return train_fraud_model(data, num_boost_round=60, early_stopping_rounds=10, progress=False, nthread=2)


def test_trains_the_examples_recipe(model):
    params = model.params
    assert params["objective"] == "binary:logistic"
    assert params["tree_method"] == "hist"
    assert params["max_depth"] == 8
    assert params["eval_metric"] == "aucpr"
    # "auto" trains where the machine can: CUDA when XGBoost can use a GPU here, else the CPU
    assert params["device"] == ("cuda" if xgboost_trains_on_cuda() else "cpu")
    assert model.booster.feature_names == list(FEATURE_NAMES)
    assert 0 <= model.best_iteration < 60
    assert len(model.history["validation"]["aucpr"]) >= model.best_iteration + 1


def test_learns_the_fraud_signal(model, data):
    metrics = model.evaluation["value"]
    fraud_rate = label_array(data).mean()
    # far above the AUC-PR of a random ranking, which equals the fraud rate
    assert metrics["aucpr"] > 5 * fraud_rate
    assert metrics["roc_auc"] > 0.8
    assert metrics["rows"] == pytest.approx(0.2 * len(data), abs=2)


def test_predictions_from_raw_rows(model, data):
    rows = data.head(100)
    proba = model.predict_proba(rows)
    # scikit-learn's shape: one column per class, each row summing to 1
    assert proba.shape == (100, 2) and ((proba >= 0) & (proba <= 1)).all()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    expected = model.booster.inplace_predict(
        model.preprocessor.transform(rows), iteration_range=(0, model.best_iteration + 1)
    )
    np.testing.assert_allclose(proba[:, 1], expected)
    np.testing.assert_array_equal(model.predict(rows), (proba[:, 1] > 0.5).astype(np.float32))


def test_save_and_load_round_trip(model, data, tmp_path):
    paths = model.save(tmp_path)
    for name in ("xgboost.json", "xgboost.ubj", "label_encoders.pkl", "label_encoders.json", "metrics.json"):
        assert (tmp_path / name).is_file()
    summary = json.loads(paths["metrics"].read_text())
    assert summary["num_trees"] == model.best_iteration + 1
    assert summary["metrics"]["aucpr"] == pytest.approx(model.evaluation.loc["aucpr", "value"])
    # the saved model is trimmed to the best iteration: every tree counts, as in Triton FIL
    for fmt in ("xgboost.json", "xgboost.ubj"):
        booster = xgb.Booster(model_file=str(tmp_path / fmt))
        assert booster.num_boosted_rounds() == model.best_iteration + 1
        np.testing.assert_allclose(
            booster.inplace_predict(model.features(data.head(50))), model.predict_proba(data.head(50))[:, 1],
            rtol=1e-6,
        )
    loaded = TrainedFraudModel.load(tmp_path)
    np.testing.assert_allclose(loaded.predict_proba(data.head(50)), model.predict_proba(data.head(50)), rtol=1e-6)


def test_load_needs_the_files(tmp_path):
    with pytest.raises(NotFoundError, match=r"xgboost\.json"):
        TrainedFraudModel.load(tmp_path)


def test_stratified_split_keeps_the_fraud_rate():
    labels = np.zeros(10_000, dtype=np.int8)
    labels[:100] = 1
    mask = stratified_validation_mask(labels, 0.2, seed=1)
    assert mask.sum() == 2000
    assert labels[mask].sum() == 20
    assert labels[~mask].sum() == 80
    assert (mask == stratified_validation_mask(labels, 0.2, seed=1)).all()


def test_bad_training_input(data):
    with pytest.raises(InvalidArgumentError, match="'Is Fraud\\?'"):
        train_fraud_model(data.drop(columns=["Is Fraud?"]), progress=False)
    with pytest.raises(InvalidArgumentError, match="'MCC'"):
        train_fraud_model(data.drop(columns=["MCC"]), progress=False)
    no_fraud = data.head(500).assign(**{"Is Fraud?": "No"})
    with pytest.raises(InvalidArgumentError, match="at least 2 fraud"):
        train_fraud_model(no_fraud, progress=False)
    with pytest.raises(InvalidArgumentError, match="validation_fraction"):
        train_fraud_model(data, validation_fraction=1.5, progress=False)
    with pytest.raises(InvalidArgumentError, match="num_boost_round"):
        train_fraud_model(data, num_boost_round=0, progress=False)
    with pytest.raises(InvalidArgumentError, match="DataFrame"):
        train_fraud_model([1, 2, 3], progress=False)
    bad_amount = data.head(2000).copy()
    bad_amount.loc[bad_amount.index[3], "Amount"] = "twelve"
    with pytest.raises(InvalidArgumentError, match=r"'Amount'.*'twelve'"):
        train_fraud_model(bad_amount, progress=False)


def test_device_resolution():
    assert resolve_device("cpu") == "cpu"
    if xgboost_trains_on_cuda():
        assert resolve_device("auto") == "cuda"
        assert resolve_device("cuda") == "cuda"
        assert resolve_device("cuda:0") == "cuda:0"
    else:
        assert resolve_device("auto") == "cpu"
        for device in ("cuda", "cuda:0"):
            with pytest.raises(InvalidArgumentError, match="no usable CUDA"):
                resolve_device(device)
    with pytest.raises(InvalidArgumentError, match="'tpu'"):
        resolve_device("tpu")


def test_dask_training_on_a_local_two_worker_cluster(data):
    import os

    import dask.dataframe as dd
    import distributed

    environment = dict(os.environ)  # a LocalCluster sets OMP_NUM_THREADS=1 in this process and leaves it
    try:
        with distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster, distributed.Client(cluster) as client:
            ddf = dd.from_pandas(data, npartitions=4)
            model = train_fraud_model(ddf, client=client, num_boost_round=40, early_stopping_rounds=10, seed=3)
    finally:
        os.environ.clear()
        os.environ.update(environment)
    assert model.params["objective"] == "binary:logistic"
    assert model.evaluation.loc["roc_auc", "value"] > 0.8
    assert model.evaluation.loc["rows", "value"] == pytest.approx(0.2 * len(data), abs=8)
    # the encoders learned from per-partition uniques equal those learned locally
    local = train_fraud_model(data.head(4000), num_boost_round=2, progress=False)
    for column, classes in local.preprocessor.classes_.items():
        assert set(classes) <= set(model.preprocessor.classes_[column])
    from triton_nb.fraud import FraudPreprocessor

    whole = FraudPreprocessor().fit(data)
    for column, classes in whole.classes_.items():
        np.testing.assert_array_equal(model.preprocessor.classes_[column], classes)
    proba = model.predict_proba(data.head(20))
    assert proba.shape == (20, 2)


def test_evaluation_frame_and_plots(tmp_path):
    truth = np.array([0, 0, 1, 1, 0, 1])
    score = np.array([0.1, 0.6, 0.7, 0.4, 0.2, 0.9])
    metrics = evaluate_predictions(truth, score)["value"]
    assert metrics["tp"] == 2 and metrics["fp"] == 1 and metrics["fn"] == 1 and metrics["tn"] == 2
    assert metrics["precision"] == pytest.approx(2 / 3)
    assert metrics["recall"] == pytest.approx(2 / 3)
    assert metrics["roc_auc"] == pytest.approx(8 / 9)
    # Triton FIL's rule: fraud only when p > threshold, so p == threshold is not fraud
    edge = evaluate_predictions([0, 1], [0.5, 0.9])["value"]
    assert edge["fp"] == 0
    matrix = confusion_matrix_frame(truth, score)
    assert matrix.loc["fraud", "fraud"] == 2 and matrix.loc["not fraud", "fraud"] == 1
    with pytest.raises(InvalidArgumentError, match="single class"):
        evaluate_predictions([0, 0], [0.1, 0.2])
    with pytest.raises(InvalidArgumentError, match="3 labels but y_score has 2"):
        evaluate_predictions([0, 1, 0], [0.1, 0.2])
    with pytest.raises(InvalidArgumentError, match=r"pass the fraud column, y_score\[:, 1\]"):
        evaluate_predictions([0, 1], [[0.9, 0.1], [0.2, 0.8]])  # predict_proba's (n, 2), given whole
    figure = plot_precision_recall(truth, score)
    figure.savefig(tmp_path / "pr.png")
    assert (tmp_path / "pr.png").stat().st_size > 1000


def test_feature_importance_plot(model, tmp_path):
    figure = plot_feature_importance(model.booster)
    labels = [tick.get_text() for tick in figure.axes[0].get_yticklabels()]
    assert set(labels) <= set(FEATURE_NAMES) and labels
    figure.savefig(tmp_path / "importance.png")
