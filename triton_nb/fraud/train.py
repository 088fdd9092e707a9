"""Training the fraud model: the example's XGBoost recipe, on CPU, GPU or a Dask cluster.

:func:`train_fraud_model` fits the :class:`~triton_nb.fraud.features.FraudPreprocessor` and an
XGBoost ``binary:logistic`` booster (``tree_method="hist"``, depth 8, ``aucpr`` with early
stopping on a stratified validation split) and returns a :class:`TrainedFraudModel` that
predicts from raw transactions and saves itself in the files a Triton repository needs.

Given a ``dask.distributed.Client``, the same call trains with XGBoost's Dask integration over
a Dask DataFrame, which is how data that does not fit one machine is handled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xgboost as xgb

from triton_nb._optional import cudf_gpu_available, require_module, xgboost_cuda_available
from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.fraud.data import LABEL_COLUMN, RAW_INPUT_COLUMNS, label_array
from triton_nb.fraud.evaluate import evaluate_predictions
from triton_nb.fraud.features import (
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    UNKNOWN,
    FraudPreprocessor,
    canonical_categories,
)

__all__ = ["DEFAULT_NUM_BOOST_ROUND", "TrainedFraudModel", "resolve_device", "train_fraud_model"]

#: The example trains 2000 rounds on 24M rows. On the demo's few hundred thousand synthetic
#: rows early stopping ends far sooner, and 300 rounds keeps training under a minute on 2 cores.
DEFAULT_NUM_BOOST_ROUND = 300

MODEL_JSON = "xgboost.json"
MODEL_UBJ = "xgboost.ubj"
METRICS_JSON = "metrics.json"


def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"`` when XGBoost sees a GPU, else ``"cpu"``; check the others."""
    if device == "auto":
        return "cuda" if xgboost_cuda_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not xgboost_cuda_available():
            raise InvalidArgumentError(
                f"device={device!r}: this XGBoost build or machine has no usable CUDA device; "
                "use device='auto' or 'cpu'"
            )
        return device
    raise InvalidArgumentError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")


@dataclass
class TrainedFraudModel:
    """A fitted preprocessor + booster pair, with what training measured."""

    preprocessor: FraudPreprocessor
    booster: xgb.Booster
    params: dict[str, Any]
    best_iteration: int
    evaluation: pd.DataFrame
    history: dict[str, Any] = field(default_factory=dict)
    threshold: float = 0.5

    def features(self, frame: pd.DataFrame | Any) -> np.ndarray:
        """The 15 float32 features the booster takes, from raw transactions."""
        return self.preprocessor.transform(frame)

    def predict_proba(self, frame: pd.DataFrame | Any) -> np.ndarray:
        """Class probabilities per row of raw transactions, shape ``(n, 2)`` as scikit-learn's
        classifiers give them: column 0 is P(not fraud), column 1 P(fraud) (so
        ``predict_proba(frame)[:, 1]`` is the fraud score). The trees up to the best iteration."""
        fraud = self._fraud_probability(frame)
        return np.column_stack((1.0 - fraud, fraud))

    def predict(self, frame: pd.DataFrame | Any) -> np.ndarray:
        """1.0 for fraud, 0.0 otherwise, with Triton FIL's rule ``P(fraud) > threshold``."""
        return (self._fraud_probability(frame) > self.threshold).astype(np.float32)

    def _fraud_probability(self, frame: pd.DataFrame | Any) -> np.ndarray:
        # The booster's binary:logistic output is P(class 1) alone, one value per row
        features = self.features(frame)
        return self.booster.inplace_predict(features, iteration_range=(0, self.best_iteration + 1))

    def save(self, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Write ``xgboost.json``, ``xgboost.ubj``, the label encoders and ``metrics.json``.

        The saved booster is trimmed to the best iteration, so Triton's FIL backend (which
        always uses every tree) predicts what :meth:`predict_proba` predicts.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        trimmed = self.booster[: self.best_iteration + 1]
        paths = {"xgboost_json": directory / MODEL_JSON, "xgboost_ubj": directory / MODEL_UBJ}
        trimmed.save_model(paths["xgboost_json"])
        trimmed.save_model(paths["xgboost_ubj"])
        paths["encoders_pkl"], paths["encoders_json"] = self.preprocessor.save_encoders(directory)
        paths["metrics"] = directory / METRICS_JSON
        summary = {
            "metrics": {name: float(value) for name, value in self.evaluation["value"].items()},
            "best_iteration": self.best_iteration,
            "num_trees": self.best_iteration + 1,
            "threshold": self.threshold,
            "params": self.params,
            "feature_names": list(FEATURE_NAMES),
        }
        paths["metrics"].write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        return paths

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> TrainedFraudModel:
        """Read back what :meth:`save` wrote (the encoders through the restricted unpickler)."""
        directory = Path(directory)
        for name in (MODEL_JSON, METRICS_JSON, "label_encoders.pkl"):
            if not (directory / name).is_file():
                raise NotFoundError(f"{directory}: no {name}; expected the output of TrainedFraudModel.save")
        booster = xgb.Booster()
        booster.load_model(directory / MODEL_JSON)
        summary = json.loads((directory / METRICS_JSON).read_text(encoding="utf-8"))
        evaluation = pd.DataFrame({"value": summary["metrics"]})
        evaluation.index.name = "metric"
        return cls(
            preprocessor=FraudPreprocessor.load_encoders(directory),
            booster=booster,
            params=summary.get("params", {}),
            best_iteration=booster.num_boosted_rounds() - 1,
            evaluation=evaluation,
            threshold=float(summary.get("threshold", 0.5)),
        )


class _ProgressBar(xgb.callback.TrainingCallback):
    """A tqdm bar over boosting rounds showing the latest validation AUC-PR."""

    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, desc="training", unit="round", leave=False)

    def after_iteration(self, model: Any, epoch: int, evals_log: dict[str, Any]) -> bool:
        latest = evals_log.get("validation", {}).get("aucpr")
        if latest:
            self._bar.set_postfix(aucpr=f"{latest[-1]:.4f}", refresh=False)
        self._bar.update(1)
        return False

    def after_training(self, model: Any) -> Any:
        self._bar.close()
        return model


def stratified_validation_mask(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """True for the rows held out for validation: ``fraction`` of each class, chosen at random.

    Stratifying keeps the rare fraud class in both parts, which early stopping on ``aucpr``
    needs. The same function splits each Dask partition, so both paths agree.
    """
    rng = np.random.default_rng(seed)
    mask = np.zeros(labels.shape[0], dtype=bool)
    for value in (0, 1):
        rows = np.flatnonzero(labels == value)
        count = round(fraction * rows.size)
        mask[rng.choice(rows, size=count, replace=False)] = True
    return mask


def _check_options(num_boost_round: int, validation_fraction: float, early_stopping_rounds: int | None) -> None:
    if num_boost_round < 1:
        raise InvalidArgumentError(f"num_boost_round must be >= 1, got {num_boost_round}")
    if not 0.0 < validation_fraction < 1.0:
        raise InvalidArgumentError(f"validation_fraction must be between 0 and 1, got {validation_fraction}")
    if early_stopping_rounds is not None and early_stopping_rounds < 1:
        raise InvalidArgumentError(f"early_stopping_rounds must be >= 1 or None, got {early_stopping_rounds}")


def _check_frame(frame: Any) -> None:
    columns = getattr(frame, "columns", None)
    if columns is None:
        raise InvalidArgumentError(
            f"expected a pandas, cuDF or Dask DataFrame of TabFormer transactions, got {type(frame).__name__}"
        )
    missing = [name for name in (*RAW_INPUT_COLUMNS, LABEL_COLUMN) if name not in columns]
    if missing:
        raise InvalidArgumentError("training frame is missing column(s): " + ", ".join(map(repr, missing)))


def train_fraud_model(
    frame: Any,
    *,
    num_boost_round: int = DEFAULT_NUM_BOOST_ROUND,
    max_depth: int = 8,
    learning_rate: float = 0.1,
    early_stopping_rounds: int | None = 30,
    validation_fraction: float = 0.2,
    threshold: float = 0.5,
    device: str = "auto",
    client: Any = None,
    seed: int = 0,
    nthread: int | None = None,
    progress: bool = True,
) -> TrainedFraudModel:
    """Train the example's preprocessor + XGBoost model on raw TabFormer transactions.

    ``frame`` is a pandas or cuDF DataFrame, or, with ``client`` (a
    ``dask.distributed.Client``), a Dask DataFrame — a pandas frame is then partitioned over
    the cluster's workers. ``device="auto"`` trains on CUDA when XGBoost sees a GPU; with cuDF
    installed the preprocessing then runs on the GPU too. The progress bar counts rounds on the
    local path (on Dask the rounds run on the workers, where a bar cannot be shown).
    """
    _check_frame(frame)
    _check_options(num_boost_round, validation_fraction, early_stopping_rounds)
    resolved = resolve_device(device)
    params: dict[str, Any] = {
        "objective": "binary:logistic",
        "tree_method": "hist",
        "max_depth": max_depth,
        "learning_rate": learning_rate,
        "eval_metric": "aucpr",
        "device": resolved,
        "seed": seed,
        "verbosity": 0,
    }
    if nthread is not None:
        params["nthread"] = nthread
    run = _Run(params, num_boost_round, early_stopping_rounds, validation_fraction, threshold, seed)
    if client is not None:
        return _train_dask(frame, client, run)
    return _train_local(frame, run, progress)


@dataclass(frozen=True)
class _Run:
    """The settings both training paths share."""

    params: dict[str, Any]
    num_boost_round: int
    early_stopping_rounds: int | None
    validation_fraction: float
    threshold: float
    seed: int

    def result(
        self, preprocessor: FraudPreprocessor, booster: xgb.Booster, history: dict[str, Any],
        truth: np.ndarray, scores: np.ndarray,
    ) -> TrainedFraudModel:
        return TrainedFraudModel(
            preprocessor=preprocessor,
            booster=booster,
            params=self.params,
            best_iteration=_best_iteration(booster),
            evaluation=evaluate_predictions(truth, scores, self.threshold),
            history=history,
            threshold=self.threshold,
        )


def _place_frame(frame: Any, device: str) -> tuple[Any, bool]:
    """Put the frame where preprocessing will run: on the GPU as cuDF when training on CUDA
    and cuDF can use the device, else on the host as pandas. Returns (frame, on_gpu)."""
    if device.startswith("cuda") and cudf_gpu_available():
        if isinstance(frame, pd.DataFrame):
            import cudf

            frame = cudf.from_pandas(frame)
        return frame, True
    if isinstance(frame, pd.DataFrame):
        return frame, False
    to_pandas = getattr(frame, "to_pandas", None)
    if to_pandas is None:
        raise InvalidArgumentError(
            f"expected a pandas or cuDF DataFrame without a Dask client, got {type(frame).__name__}; "
            "pass client=... to train on a Dask DataFrame"
        )
    return to_pandas(), False


def _train_local(frame: Any, run: _Run, progress: bool) -> TrainedFraudModel:
    frame, on_gpu = _place_frame(frame, run.params["device"])
    labels = label_array(frame)
    if np.count_nonzero(labels) < 2 or np.count_nonzero(labels == 0) < 2:
        raise InvalidArgumentError(
            f"'{LABEL_COLUMN}' needs at least 2 fraud and 2 non-fraud rows to train and validate; "
            f"got {int(labels.sum())} fraud of {labels.size}"
        )
    preprocessor = FraudPreprocessor().fit(frame)
    features = preprocessor.transform(frame)
    valid = stratified_validation_mask(labels, run.validation_fraction, run.seed)
    # QuantileDMatrix builds the hist bins once; validation reuses the training bins.
    names = list(FEATURE_NAMES)
    train_rows, valid_rows = np.flatnonzero(~valid), np.flatnonzero(valid)
    # On the GPU the features are a cuDF DataFrame; XGBoost reads it without a host copy.
    take = (lambda rows: features.iloc[rows]) if on_gpu else (lambda rows: features[rows])
    dtrain = xgb.QuantileDMatrix(take(train_rows), label=labels[train_rows], feature_names=names)
    dvalid = xgb.QuantileDMatrix(take(valid_rows), label=labels[valid_rows], feature_names=names, ref=dtrain)
    history: dict[str, Any] = {}
    booster = xgb.train(
        run.params,
        dtrain,
        num_boost_round=run.num_boost_round,
        evals=[(dvalid, "validation")],
        early_stopping_rounds=run.early_stopping_rounds,
        evals_result=history,
        verbose_eval=False,
        callbacks=[_ProgressBar(run.num_boost_round)] if progress else [],
    )
    scores = booster.predict(dvalid, iteration_range=(0, _best_iteration(booster) + 1))
    return run.result(preprocessor, booster, history, labels[valid_rows], scores)


def _best_iteration(booster: xgb.Booster) -> int:
    best = booster.attr("best_iteration")
    return int(best) if best is not None else booster.num_boosted_rounds() - 1


# --------------------------------------------------------------------------- Dask


def _partition_uniques(part: pd.DataFrame) -> dict[str, np.ndarray]:
    return {column: np.unique(values) for column, values in canonical_categories(part).items()}


def _partition_features(
    part: pd.DataFrame, preprocessor: FraudPreprocessor, fraction: float, seed: int, partition_info: Any = None
) -> pd.DataFrame:
    """Features, label and the validation flag of one partition, in one frame so that
    selecting the training or validation rows needs no index alignment across frames."""
    labels = label_array(part)
    number = partition_info["number"] if partition_info else 0
    out = pd.DataFrame(preprocessor.transform(part), columns=list(FEATURE_NAMES), index=part.index)
    out[_LABEL] = labels
    out[_VALID] = stratified_validation_mask(labels, fraction, seed + number)
    return out


_LABEL = "__label__"
_VALID = "__validation__"


def _train_dask(frame: Any, client: Any, run: _Run) -> TrainedFraudModel:
    # The [dask] extra: imported here only, so the core install trains without it.
    dask = require_module("dask", "Training the fraud model on a Dask cluster (client=...)")
    require_module("distributed", "Training the fraud model on a Dask cluster (client=...)")
    import dask.dataframe as dd
    import xgboost.dask as dxgb

    if isinstance(frame, pd.DataFrame):
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        frame = dd.from_pandas(frame, npartitions=workers)
    if not isinstance(frame, dd.DataFrame):
        raise InvalidArgumentError(
            f"with a Dask client, expected a Dask or pandas DataFrame, got {type(frame).__name__}"
        )

    # Learn the classes from per-partition uniques, then encode every partition with them.
    partitions = frame[list(ENCODED_COLUMNS)].to_delayed()
    uniques = dask.compute(*(dask.delayed(_partition_uniques)(part) for part in partitions))
    preprocessor = FraudPreprocessor.from_encoders(
        {
            column: np.unique(np.concatenate([part[column] for part in uniques] + [np.array([UNKNOWN])]))
            for column in ENCODED_COLUMNS
        }
    )
    meta = {name: "float32" for name in FEATURE_NAMES} | {_LABEL: "int8", _VALID: "bool"}
    table = frame.map_partitions(_partition_features, preprocessor, run.validation_fraction, run.seed, meta=meta)
    names = list(FEATURE_NAMES)
    train_rows = table[~table[_VALID]]
    valid_rows = table[table[_VALID]]
    dtrain = dxgb.DaskDMatrix(client, train_rows[names], train_rows[_LABEL], feature_names=names)
    dvalid = dxgb.DaskDMatrix(client, valid_rows[names], valid_rows[_LABEL], feature_names=names)
    output = dxgb.train(
        client,
        run.params,
        dtrain,
        num_boost_round=run.num_boost_round,
        evals=[(dvalid, "validation")],
        early_stopping_rounds=run.early_stopping_rounds,
        verbose_eval=False,
    )
    booster = output["booster"]
    scores = dxgb.predict(client, booster, dvalid, iteration_range=(0, _best_iteration(booster) + 1))
    # computed apart: the predictions are a dask array, the labels a dataframe expression
    truth = valid_rows[_LABEL].compute()
    return run.result(preprocessor, booster, output["history"], np.asarray(truth), np.asarray(scores.compute()))
