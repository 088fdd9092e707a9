"""The preprocessing rules written with DataFrame operations, so they run on cuDF on a GPU.

:mod:`triton_nb.fraud.features` runs the rules with numpy on the host, tuned for serving. For
training on a GPU the frame is already in device memory as a cuDF DataFrame, and copying
millions of string rows to the host to encode them would dominate. This module expresses the
same rules with the Series operations that pandas and cuDF share (``isna``, ``astype``,
``str.strip``, ``str.extract``, ``isin``, ``where``, ``unique``, ``map``), so the same code
runs on either library: on pandas in the test suite, where it is checked against the numpy
implementation row for row, and on cuDF when a GPU is there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from triton_nb.errors import InvalidArgumentError
from triton_nb.fraud.encoding.columns import (
    _INTEGER_CODE_COLUMNS,
    _NUMERIC_COLUMNS,
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    US_STATE_CODES,
)
from triton_nb.fraud.encoding.text import _MISSING_TEXT

__all__ = ["frame_canonical_categories", "frame_features", "frame_uniques"]

_INTEGER_PATTERN = r"^(-?)0*([0-9]+)(?:\.0*)?$"


def _text(series: Any, column: str) -> tuple[Any, Any]:
    """(stripped text, missing mask) of one column, as the numpy path defines them."""
    missing = series.isna()
    kind = series.dtype.kind
    if kind == "f":
        integral = series == series.round()
        whole = series.where(integral, 0).astype("int64").astype(str)
        text = whole.where(integral, series.astype(str))
    elif kind in "iub" or kind == "O" or str(series.dtype) in ("str", "string"):
        text = series.astype(str)
    else:
        raise InvalidArgumentError(f"column '{column}' has unsupported dtype {series.dtype}")
    text = text.str.strip()
    missing = missing | text.isin(_MISSING_TEXT)
    return text.where(~missing, ""), missing


def _canonical_integers(text: Any) -> Any:
    parts = text.str.extract(_INTEGER_PATTERN)
    matched = parts[1].notna()
    sign = parts[0].where(parts[1] != "0", "")  # "-0" is "0", as in the numpy path
    return (sign + parts[1]).where(matched, text)


def frame_canonical_categories(frame: Any, unknown_value: str) -> dict[str, Any]:
    """The canonical text of each label-encoded column, as Series of the frame's library."""
    text = {}
    for column in ENCODED_COLUMNS:
        values, missing = _text(frame[column], column)
        if column in _INTEGER_CODE_COLUMNS:
            values = _canonical_integers(values)
        text[column] = values.where(~missing, unknown_value)
    online = text["Merchant City"] == "ONLINE"
    text["Merchant State"] = text["Merchant State"].where(~online, "ONLINE")
    text["Zip"] = text["Zip"].where(~online, "ONLINE")
    foreign = ~text["Merchant State"].isin(sorted(US_STATE_CODES | {"ONLINE"}))
    text["Zip"] = text["Zip"].where(~foreign, "FOREIGN")
    return text


def frame_uniques(frame: Any, unknown_value: str) -> dict[str, np.ndarray]:
    """Sorted class lists (host numpy arrays, including ``unknown_value``) per encoded column."""
    uniques = {}
    for column, values in frame_canonical_categories(frame, unknown_value).items():
        # drop_duplicates gives a Series on pandas 2 and 3 and on cuDF alike (pandas 2's unique()
        # is a bare ndarray); the classes are few, the rows stay on the device
        host = values.drop_duplicates().to_numpy()
        uniques[column] = np.unique(np.append(host.astype(str), unknown_value))
    return uniques


def _number(series: Any, column: str) -> Any:
    if series.dtype.kind in "iufb":
        values = series.astype("float64")
    else:
        text, missing = _text(series, column)
        if bool(missing.any()):
            raise InvalidArgumentError(f"column '{column}' has missing value(s); a number is required")
        values = text.str.lstrip("$").str.replace(",", "", regex=False).astype("float64")
    if not bool(values.notna().all()):
        raise InvalidArgumentError(f"column '{column}' has missing or non-finite value(s)")
    return values


def frame_features(
    frame: Any, classes: Mapping[str, np.ndarray], unknown_codes: Mapping[str, int], unknown_value: str
) -> Any:
    """The 15 features as a float32 DataFrame of the frame's library, in FEATURE_NAMES order."""
    columns = {}
    for column in (*_NUMERIC_COLUMNS, "Amount"):
        columns[column] = _number(frame[column], column)
    time_text, missing = _text(frame["Time"], "Time")
    parts = time_text.str.extract(r"^([0-9]{1,2}):([0-9]{2})")
    if bool(missing.any()) or not bool(parts[0].notna().all()):
        raise InvalidArgumentError("column 'Time' has value(s) that are not a time \"HH:MM\"")
    columns["Hour"] = parts[0].astype("int64")
    columns["Minute"] = parts[1].astype("int64")
    if bool((columns["Hour"] > 23).any()) or bool((columns["Minute"] > 59).any()):
        raise InvalidArgumentError("column 'Time' has value(s) that are not a time \"HH:MM\"")
    columns["Errors?"] = (~_text(frame["Errors?"], "Errors?")[1]).astype("float32")
    for column, text in frame_canonical_categories(frame, unknown_value).items():
        codes = {value: code for code, value in enumerate(classes[column].tolist())}
        columns[column] = text.map(codes).fillna(unknown_codes[column])
    return frame[[]].assign(**{name: columns[name].astype("float32") for name in FEATURE_NAMES})
