"""The example's columns, and reading them out of a Triton request or a DataFrame."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

UNKNOWN = "UNKNOWN"

#: The raw inputs of the example, in TabFormer file order (the label column excluded).
RAW_INPUT_COLUMNS: tuple[str, ...] = (
    "User", "Card", "Year", "Month", "Day", "Time", "Amount", "Use Chip", "Merchant Name",
    "Merchant City", "Merchant State", "Zip", "MCC", "Errors?",
)  # fmt: skip

#: The label-encoded columns, in the order the example lists its encoders.
ENCODED_COLUMNS: tuple[str, ...] = ("Zip", "MCC", "Merchant Name", "Use Chip", "Merchant City", "Merchant State")

#: The model's input features, in the order the XGBoost model expects them.
FEATURE_NAMES: tuple[str, ...] = (
    "User", "Card", "Year", "Month", "Day", "Amount", "Use Chip", "Merchant Name", "Merchant City",
    "Merchant State", "Zip", "MCC", "Errors?", "Hour", "Minute",
)  # fmt: skip

#: The 50 US state codes plus DC. Any other Merchant State value is a foreign country name.
US_STATE_CODES: frozenset[str] = frozenset(
    {
        "AL", "AK", "AZ", "AR", "CA", "CO", "CT", "DE", "DC", "FL", "GA", "HI", "ID", "IL", "IN", "IA",
        "KS", "KY", "LA", "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM",
        "NY", "NC", "ND", "OH", "OK", "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA",
        "WV", "WI", "WY",
    }
)  # fmt: skip

_NUMERIC_COLUMNS = ("User", "Card", "Year", "Month", "Day")
# Columns whose values are integers written as text, possibly as floats ("91750.0").
_INTEGER_CODE_COLUMNS = ("Zip", "MCC", "Merchant Name")
_FEATURE_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}


class FeatureInputError(ValueError):
    """Raw input the rules cannot turn into features; the message names the column."""


# --------------------------------------------------------------------------- column access


def _column_array(data: Any, column: str) -> np.ndarray:
    values = data[column]
    # Triton hands over [batch, 1]; DataFrames hand over 1-D Series.
    if type(values) is np.ndarray:
        array = values
    else:
        array = values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)
    shape = array.shape
    if len(shape) == 2 and shape[1] == 1:
        array = array.reshape(shape[0])
    elif not shape:
        array = array.reshape(1)
    if array.ndim != 1:
        raise FeatureInputError(
            f"column '{column}' must be 1-D (or [batch, 1]), got shape {list(array.shape)}"
        )
    return array


def gather_columns(data: Any, columns: Iterable[str]) -> dict[str, np.ndarray]:
    """The named columns of a mapping or DataFrame as 1-D numpy arrays of equal length."""
    if not (isinstance(data, (dict, Mapping)) or (hasattr(data, "columns") and hasattr(data, "__getitem__"))):
        raise FeatureInputError(
            f"expected a pandas DataFrame or a mapping of column name to array, got {type(data).__name__}"
        )
    wanted = tuple(columns)
    present = data.keys() if isinstance(data, (dict, Mapping)) else set(data.columns)
    missing = [name for name in wanted if name not in present]
    if missing:
        raise FeatureInputError(
            "missing input column(s): " + ", ".join(repr(name) for name in missing)
        )
    arrays = {name: _column_array(data, name) for name in wanted}
    rows = len(arrays[wanted[0]])
    if any(len(array) != rows for array in arrays.values()):
        detail = ", ".join(f"'{name}': {len(array)}" for name, array in arrays.items())
        raise FeatureInputError(f"input columns have different numbers of rows ({detail})")
    if rows == 0:
        raise FeatureInputError("no rows to transform: the input is empty")
    return arrays
