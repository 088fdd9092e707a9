"""Feature engineering of the Triton fraud example, vectorised and hardened.

:class:`FraudPreprocessor` turns raw TabFormer transactions (a pandas DataFrame, or a mapping
of column name to numpy array as Triton's Python backend hands them over) into the 15 float32
features the XGBoost model was trained on, in the example's order (:data:`FEATURE_NAMES`).

The rules are the example's:

* Merchant City ``"ONLINE"`` -> Merchant State and Zip become ``"ONLINE"``;
* a Merchant State outside the 50 US states + DC + ``"ONLINE"`` -> Zip becomes ``"FOREIGN"``;
* Errors? -> 1.0 when present, else 0.0;
* Amount without ``"$"`` as a float; Time ``"HH:MM"`` -> Hour and Minute;
* Zip, MCC, Merchant Name, Use Chip, Merchant City and Merchant State are label-encoded with
  sorted class lists that include ``"UNKNOWN"``.

and these are the example's defects, fixed:

* a category not seen at fit time maps to the ``UNKNOWN`` code instead of failing the batch;
* non-ASCII text (``"Zürich"``, UTF-8 bytes from Triton) works;
* integer-like codes are canonical: Zip ``"77539"``, ``"77539.0"`` and ``77539`` are one class
  (TabFormer writes zips as floats, so leading zeros are dropped too: ``"02151"`` is ``"2151"``);
* a missing value (``""``, ``None``, ``NaN``, ``"nan"``) is the same category at training and
  at serving: it is canonicalised to the ``UNKNOWN`` class in the label-encoded columns and to
  0.0 in Errors?. In the numeric columns (User, Card, Year, Month, Day, Amount, Time) a missing
  or non-numeric value is an error naming the column, never a silent NaN feature.

The rules themselves live in :mod:`triton_nb.fraud.encoding` (numpy only), which the exported
Triton preprocessing model ships and imports, so the SDK and the served model cannot drift
apart. This module adds the scikit-learn estimator, the encoder files, and the cuDF path.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, TransformerMixin

from triton_nb.errors import InvalidArgumentError, NotFoundError, UnsafeFileError
from triton_nb.fraud._frame_path import frame_features, frame_uniques
from triton_nb.fraud.encoding import (
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    RAW_INPUT_COLUMNS,
    UNKNOWN,
    FeatureEncoder,
    FeatureInputError,
    canonical_category_arrays,
    check_numeric_columns,
    gather_columns,
)
from triton_nb.fraud.encoding import canonical_categories as _canonical_categories
from triton_nb.fraud.safe_pickle import loads_label_encoders

__all__ = [
    "ENCODED_COLUMNS",
    "FEATURE_NAMES",
    "UNKNOWN",
    "FraudPreprocessor",
    "canonical_categories",
    "request_tensors",
]

#: The raw inputs Triton carries as FP32; the others are BYTES.
FP32_INPUTS: tuple[str, ...] = ("User", "Card", "Year", "Month", "Day")

Columns = Mapping[str, Any]


def request_tensors(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The 14 tensors of a Triton request for these transactions, as Triton's Python backend
    hands them to the preprocessing model: FP32 ``[n, 1]`` for User, Card, Year, Month, Day and
    BYTES (object arrays of UTF-8 bytes) ``[n, 1]`` for the rest."""
    from triton_nb.tensors import text_to_bytes

    missing = [name for name in RAW_INPUT_COLUMNS if name not in frame.columns]
    if missing:
        raise InvalidArgumentError("missing input column(s): " + ", ".join(repr(name) for name in missing))
    return {
        name: (frame[name].to_numpy(np.float32) if name in FP32_INPUTS else text_to_bytes(frame[name])).reshape(-1, 1)
        for name in RAW_INPUT_COLUMNS
    }


def canonical_categories(data: Columns | pd.DataFrame, unknown_value: str = UNKNOWN) -> dict[str, np.ndarray]:
    """Apply the example's category rules and return the canonical text of each encoded column.

    This is the part of the pipeline before label encoding; :meth:`FraudPreprocessor.fit`
    learns its classes from exactly these values, so training and serving agree.
    """
    try:
        return _canonical_categories(data, unknown_value)
    except FeatureInputError as exc:
        raise InvalidArgumentError(str(exc)) from None


# auto_wrap_output_keys=None: scikit-learn's set_output wrapper costs microseconds per call on
# the batch-1 serving path, and the output here is always the float32 matrix Triton needs.
class FraudPreprocessor(TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """The example's preprocessing as a scikit-learn transformer.

    Parameters
    ----------
    unknown_value : str
        The class every unseen or missing category maps to. The example's encoders call it
        ``"UNKNOWN"``; it is always part of each learned class list.

    Attributes
    ----------
    classes_ : dict[str, numpy.ndarray]
        Sorted class strings per label-encoded column (the example's ``label_encoders.pkl``).
    unknown_codes_ : dict[str, int]
        The code of ``unknown_value`` in each column's classes.
    n_features_in_ : int
        Number of raw input columns (14).
    """

    def __init__(self, unknown_value: str = UNKNOWN) -> None:
        self.unknown_value = unknown_value

    # -- fitting ------------------------------------------------------------------------
    def fit(self, X: Columns | pd.DataFrame, y: Any = None) -> FraudPreprocessor:
        """Learn the sorted class list of each label-encoded column from ``X``.

        A cuDF DataFrame is preprocessed on its GPU (see :mod:`triton_nb.fraud._frame_path`).
        """
        if _is_device_frame(X):
            _check_frame_columns(X)
            self._set_classes(frame_uniques(X, self.unknown_value))
            return self
        try:
            arrays = gather_columns(X, RAW_INPUT_COLUMNS)
            check_numeric_columns(arrays)
            categories = canonical_category_arrays(arrays, self.unknown_value)
        except FeatureInputError as exc:
            raise InvalidArgumentError(str(exc)) from None
        self._set_classes(
            {column: np.unique(np.append(values, self.unknown_value)) for column, values in categories.items()}
        )
        return self

    def _set_classes(self, classes: Mapping[str, np.ndarray]) -> None:
        self._encoder = FeatureEncoder(classes, self.unknown_value)
        self.classes_ = self._encoder.classes
        self.unknown_codes_ = self._encoder.unknown_codes
        self.n_features_in_ = len(RAW_INPUT_COLUMNS)
        self.feature_names_in_ = np.array(RAW_INPUT_COLUMNS, dtype=object)

    # -- transforming -------------------------------------------------------------------
    def transform(self, X: Columns | pd.DataFrame) -> np.ndarray:
        """Return the ``(rows, 15)`` float32 feature matrix in :data:`FEATURE_NAMES` order.

        A cuDF DataFrame gives a float32 cuDF DataFrame with those columns, left on the GPU
        for XGBoost to train from.
        """
        self._require_fitted()
        if _is_device_frame(X):
            _check_frame_columns(X)
            return frame_features(X, self.classes_, self.unknown_codes_, self.unknown_value)
        try:
            return self._encoder.transform(X)
        except FeatureInputError as exc:
            raise InvalidArgumentError(str(exc)) from None

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        return np.array(FEATURE_NAMES, dtype=object)

    # -- encoders in the example's formats ----------------------------------------------
    @classmethod
    def from_encoders(cls, encoders: Mapping[str, Any], unknown_value: str = UNKNOWN) -> FraudPreprocessor:
        """Build a fitted preprocessor from per-column class lists.

        Each value may be an array or list of class strings, or a fitted label encoder with a
        ``classes_`` attribute: scikit-learn's ``LabelEncoder`` or cuML's (whose classes are a
        cuDF Series, copied to the host here). Class lists must be sorted as strings and
        contain ``unknown_value``, since the codes the model was trained on are positions in
        those lists.
        """
        missing = [column for column in ENCODED_COLUMNS if column not in encoders]
        if missing:
            raise InvalidArgumentError(
                "label encoders are missing column(s): " + ", ".join(repr(c) for c in missing)
            )
        classes = {column: _classes_array(encoders[column], column) for column in ENCODED_COLUMNS}
        for column, values in classes.items():
            if values.size > 1 and not (values[1:] > values[:-1]).all():
                raise InvalidArgumentError(
                    f"label encoder of column '{column}': classes must be unique and sorted as strings "
                    "(the codes the model learned are positions in that order)"
                )
            if not (values == unknown_value).any():
                raise InvalidArgumentError(
                    f"label encoder of column '{column}' has no '{unknown_value}' class to map unseen values to"
                )
        preprocessor = cls(unknown_value=unknown_value)
        preprocessor._set_classes(classes)
        return preprocessor

    def encoders(self) -> dict[str, np.ndarray]:
        """The learned classes as the example stores them: ``{column: sorted class strings}``."""
        self._require_fitted()
        return {column: values.copy() for column, values in self.classes_.items()}

    def save_encoders(self, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write ``label_encoders.pkl`` (the example's format) and ``label_encoders.json``."""
        self._require_fitted()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        pkl_path = directory / "label_encoders.pkl"
        json_path = directory / "label_encoders.json"
        with open(pkl_path, "wb") as handle:
            pickle.dump(self.encoders(), handle, protocol=4)
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({column: values.tolist() for column, values in self.classes_.items()}, handle,
                      ensure_ascii=False, indent=1)
        return pkl_path, json_path

    @classmethod
    def load_encoders(cls, path: str | os.PathLike[str], unknown_value: str = UNKNOWN) -> FraudPreprocessor:
        """Load ``label_encoders.pkl`` (restricted unpickler) or ``label_encoders.json``.

        A directory means "the ``label_encoders.pkl`` inside it".
        """
        path = Path(path)
        if path.is_dir():
            path = path / "label_encoders.pkl"
        if not path.is_file():
            raise NotFoundError(f"label encoder file not found: {path}")
        if path.suffix == ".json":
            try:
                with open(path, encoding="utf-8") as handle:
                    loaded = json.load(handle)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InvalidArgumentError(f"{path}: not valid JSON ({exc})") from None
            if not isinstance(loaded, dict):
                raise InvalidArgumentError(f"{path}: expected a JSON object of column -> class list")
        else:
            try:
                loaded = loads_label_encoders(path.read_bytes(), source=str(path))
            except ValueError as exc:
                raise UnsafeFileError(str(exc)) from None
        return cls.from_encoders(loaded, unknown_value=unknown_value)

    def _require_fitted(self) -> None:
        if not hasattr(self, "classes_"):
            raise InvalidArgumentError("FraudPreprocessor is not fitted: call fit() or load encoders first")


def _is_device_frame(data: Any) -> bool:
    """A DataFrame from another library (cuDF) rather than pandas or a mapping of arrays."""
    return not isinstance(data, (pd.DataFrame, Mapping)) and hasattr(data, "to_pandas") and hasattr(data, "columns")


def _check_frame_columns(frame: Any) -> None:
    missing = [name for name in RAW_INPUT_COLUMNS if name not in frame.columns]
    if missing:
        raise InvalidArgumentError("missing input column(s): " + ", ".join(repr(name) for name in missing))
    if len(frame) == 0:
        raise InvalidArgumentError("no rows to transform: the input is empty")


def _classes_array(encoder: Any, column: str) -> np.ndarray:
    classes = getattr(encoder, "classes_", encoder)
    for host_copy in ("to_numpy", "values_host"):  # cuDF Series (cuML) and pandas Series
        attribute = getattr(classes, host_copy, None)
        if attribute is not None:
            classes = attribute() if callable(attribute) else attribute
            break
    array = np.asarray(classes)
    if array.ndim != 1:
        raise InvalidArgumentError(f"label encoder of column '{column}': classes must be 1-D")
    if array.dtype.kind == "O":
        if not all(isinstance(value, str) for value in array.tolist()):
            raise InvalidArgumentError(f"label encoder of column '{column}': classes must be strings")
        array = array.astype(str)
    elif array.dtype.kind != "U":
        raise InvalidArgumentError(
            f"label encoder of column '{column}': classes must be strings, got dtype {array.dtype}"
        )
    return array
