"""The worked example: card-fraud data, the example's preprocessing, and XGBoost training.

Typical use::

    from triton_nb import fraud

    frame = fraud.generate_transactions(200_000, seed=0)
    model = fraud.train_fraud_model(frame)
    model.evaluation            # AUC-PR, ROC-AUC, precision/recall/F1, confusion counts
    model.save("artifacts/")    # xgboost.json, xgboost.ubj, label_encoders.pkl/.json, metrics.json
"""

from triton_nb.fraud.data import (
    LABEL_COLUMN,
    RAW_INPUT_COLUMNS,
    TABFORMER_COLUMNS,
    generate_transactions,
    label_array,
    load_tabformer_csv,
    write_tabformer_csv,
)
from triton_nb.fraud.evaluate import (
    PREDICTION_OUTPUT,
    confusion_matrix_frame,
    evaluate_predictions,
    label_predictions,
    plot_feature_importance,
    plot_precision_recall,
)
from triton_nb.fraud.features import ENCODED_COLUMNS, FEATURE_NAMES, UNKNOWN, FraudPreprocessor, request_tensors
from triton_nb.fraud.train import TrainedFraudModel, train_fraud_model

__all__ = [
    "ENCODED_COLUMNS",
    "FEATURE_NAMES",
    "LABEL_COLUMN",
    "PREDICTION_OUTPUT",
    "RAW_INPUT_COLUMNS",
    "TABFORMER_COLUMNS",
    "UNKNOWN",
    "FraudPreprocessor",
    "TrainedFraudModel",
    "confusion_matrix_frame",
    "evaluate_predictions",
    "generate_transactions",
    "label_array",
    "label_predictions",
    "load_tabformer_csv",
    "plot_feature_importance",
    "plot_precision_recall",
    "request_tensors",
    "train_fraud_model",
    "write_tabformer_csv",
]

# Internals that were exported by mistake: still reachable here, with a warning, for one release
_MOVED = {"DEFAULT_NUM_BOOST_ROUND": "triton_nb.fraud.train", "resolve_device": "triton_nb.fraud.train",
          "US_STATE_CODES": "triton_nb.fraud.data"}


def __getattr__(name: str) -> object:
    if name in _MOVED:
        import importlib
        import warnings

        warnings.warn(f"triton_nb.fraud.{name} is not public and leaves triton_nb.fraud in the next release; "
                      f"import it from {_MOVED[name]} if you need it", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'triton_nb.fraud' has no attribute {name!r}")
