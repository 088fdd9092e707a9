"""Evaluation of a fraud classifier: metrics as a DataFrame, the served answer labelled, and matplotlib
plot helpers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from sklearn import metrics as skm

from triton_nb.errors import InvalidArgumentError

if TYPE_CHECKING:
    import xgboost as xgb
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "PREDICTION_OUTPUT",
    "confusion_matrix_frame",
    "evaluate_predictions",
    "label_predictions",
    "plot_feature_importance",
    "plot_precision_recall",
]


#: The output the exported fraud ensemble answers with.
PREDICTION_OUTPUT = "predictions"


def label_predictions(outputs: Any, threshold: float = 0.5) -> pd.DataFrame | None:
    """The fraud ensemble's answer (``outputs``: tensors by name), labelled FRAUD / NOT FRAUD; None
    when there is no :data:`PREDICTION_OUTPUT`. Classes {0, 1} (the FIL backend's default
    ``predict_proba: false``) give a ``label`` column; probabilities (``predict_proba``: one column,
    or two of which the second is fraud) also a ``fraud_probability`` column, labelled at
    ``threshold``."""
    values = outputs.get(PREDICTION_OUTPUT)
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 2 and array.shape[1] == 2:
        array = array[:, 1]
    array = array.reshape(len(array), -1)[:, 0] if array.ndim > 1 else array.reshape(-1)
    labels = np.where(array >= threshold, "FRAUD", "NOT FRAUD")
    if np.isin(array, (0.0, 1.0)).all():
        return pd.DataFrame({"label": labels})
    return pd.DataFrame({"fraud_probability": array, "label": labels})


def _check_scores(y_true: Any, y_score: Any) -> tuple[np.ndarray, np.ndarray]:
    truth = np.asarray(y_true).astype(np.int64).ravel()
    score = np.asarray(y_score, dtype=np.float64)
    if score.ndim == 2 and score.shape[1] == 2:  # predict_proba's two columns, given whole
        raise InvalidArgumentError(f"y_score has shape {score.shape} (both classes' probabilities): pass the "
                                   "fraud column, y_score[:, 1]")
    score = score.ravel()
    if truth.shape != score.shape:
        raise InvalidArgumentError(
            f"y_true has {truth.size} labels but y_score has {score.size} scores"
        )
    if truth.size == 0:
        raise InvalidArgumentError("cannot evaluate on zero rows")
    if not np.isin(truth, (0, 1)).all():
        raise InvalidArgumentError("y_true must hold only 0 (not fraud) and 1 (fraud)")
    if np.unique(truth).size < 2:
        raise InvalidArgumentError(
            "y_true holds a single class; AUC-PR and ROC-AUC need both fraud and non-fraud rows"
        )
    if not np.isfinite(score).all():
        raise InvalidArgumentError("y_score holds NaN or infinite scores")
    return truth, score


def evaluate_predictions(y_true: Any, y_score: Any, threshold: float = 0.5) -> pd.DataFrame:
    """Metrics of fraud probabilities ``y_score`` against 0/1 labels ``y_true``.

    Returns a one-column DataFrame (``value``) indexed by metric name: ``aucpr`` (average
    precision, XGBoost's ``aucpr``), ``roc_auc``, and at ``threshold`` — with Triton FIL's rule
    that a row is fraud when ``p > threshold`` — ``precision``, ``recall``, ``f1``,
    ``accuracy`` and the confusion counts ``tp``, ``fp``, ``tn``, ``fn``; plus ``rows``,
    ``positives`` and ``threshold``.
    """
    truth, score = _check_scores(y_true, y_score)
    predicted = (score > threshold).astype(np.int64)
    tn, fp, fn, tp = skm.confusion_matrix(truth, predicted, labels=[0, 1]).ravel()
    values = {
        "aucpr": skm.average_precision_score(truth, score),
        "roc_auc": skm.roc_auc_score(truth, score),
        "precision": skm.precision_score(truth, predicted, zero_division=0.0),
        "recall": skm.recall_score(truth, predicted, zero_division=0.0),
        "f1": skm.f1_score(truth, predicted, zero_division=0.0),
        "accuracy": skm.accuracy_score(truth, predicted),
        "tp": tp,
        "fp": fp,
        "tn": tn,
        "fn": fn,
        "rows": truth.size,
        "positives": int(truth.sum()),
        "threshold": threshold,
    }
    frame = pd.DataFrame({"value": [float(v) for v in values.values()]}, index=list(values))
    frame.index.name = "metric"
    return frame


def confusion_matrix_frame(y_true: Any, y_score: Any, threshold: float = 0.5) -> pd.DataFrame:
    """The confusion matrix at ``threshold`` as a labelled 2x2 DataFrame (rows: actual)."""
    truth, score = _check_scores(y_true, y_score)
    matrix = skm.confusion_matrix(truth, (score > threshold).astype(np.int64), labels=[0, 1])
    labels = ["not fraud", "fraud"]
    return pd.DataFrame(
        matrix,
        index=pd.Index(labels, name="actual"),
        columns=pd.Index(labels, name="predicted"),
    )


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    # A bare Figure (not pyplot) so helpers work headless and never leak global figures.
    figure = Figure(figsize=figsize, layout="constrained")
    return figure, figure.add_subplot()


def plot_precision_recall(
    y_true: Any, y_score: Any, threshold: float = 0.5, ax: Axes | None = None
) -> Figure:
    """Precision-recall curve with the operating point at ``threshold`` marked."""
    truth, score = _check_scores(y_true, y_score)
    precision, recall, _ = skm.precision_recall_curve(truth, score)
    figure, ax = _axes(ax, (5.0, 4.0))
    aucpr = skm.average_precision_score(truth, score)
    ax.plot(recall, precision, label=f"AUC-PR = {aucpr:.3f}")
    predicted = score > threshold
    if predicted.any():
        ax.scatter(
            [skm.recall_score(truth, predicted)],
            [skm.precision_score(truth, predicted)],
            color="tab:red",
            zorder=3,
            label=f"threshold {threshold:g}",
        )
    ax.axhline(truth.mean(), color="grey", linestyle=":", label="fraud rate")
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title="Precision-recall")
    ax.legend(loc="lower left")
    return figure


def plot_feature_importance(
    booster: xgb.Booster,
    importance_type: str = "gain",
    max_features: int = 15,
    ax: Axes | None = None,
) -> Figure:
    """Horizontal bar chart of the booster's feature importance (``gain`` by default)."""
    scores = booster.get_score(importance_type=importance_type)
    if not scores:
        raise InvalidArgumentError("the booster has no feature importance (did it train any trees?)")
    ranked = sorted(scores.items(), key=lambda item: item[1])[-max_features:]
    figure, ax = _axes(ax, (5.0, 0.3 * len(ranked) + 1.0))
    ax.barh([name for name, _ in ranked], [value for _, value in ranked], color="tab:blue")
    ax.set(xlabel=importance_type, title="Feature importance")
    return figure
