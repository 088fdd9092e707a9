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

Everything runs as whole-column numpy operations (``numpy.strings``), with no per-row Python
loop, because the same code is the serving hot path at batch size 1 and the training path at
millions of rows.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, TransformerMixin

from triton_nb.errors import InvalidArgumentError, NotFoundError, UnsafeFileError
from triton_nb.fraud._frame_path import frame_features, frame_uniques
from triton_nb.fraud.data import RAW_INPUT_COLUMNS, US_STATE_CODES
from triton_nb.fraud.safe_pickle import loads_label_encoders

__all__ = [
    "ENCODED_COLUMNS",
    "FEATURE_NAMES",
    "UNKNOWN",
    "FraudPreprocessor",
    "canonical_categories",
]

UNKNOWN = "UNKNOWN"

#: The label-encoded columns, in the order the example lists its encoders.
ENCODED_COLUMNS: tuple[str, ...] = ("Zip", "MCC", "Merchant Name", "Use Chip", "Merchant City", "Merchant State")

#: The model's input features, in the order the XGBoost model expects them.
FEATURE_NAMES: tuple[str, ...] = (
    "User",
    "Card",
    "Year",
    "Month",
    "Day",
    "Amount",
    "Use Chip",
    "Merchant Name",
    "Merchant City",
    "Merchant State",
    "Zip",
    "MCC",
    "Errors?",
    "Hour",
    "Minute",
)

_NUMERIC_COLUMNS = ("User", "Card", "Year", "Month", "Day")
# Columns whose values are integers written as text, possibly as floats ("91750.0").
_INTEGER_CODE_COLUMNS = ("Zip", "MCC", "Merchant Name")
_FEATURE_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}

Columns = Mapping[str, Any]


# --------------------------------------------------------------------------- column access


def _column_array(data: Columns | pd.DataFrame, column: str) -> np.ndarray:
    values = data[column]
    # Triton hands over [batch, 1]; DataFrames hand over 1-D Series.
    array = values.to_numpy() if isinstance(values, (pd.Series, pd.Index)) else np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    elif array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise InvalidArgumentError(
            f"column '{column}' must be 1-D (or [batch, 1]), got shape {list(array.shape)}"
        )
    return array


def _gather_columns(data: Columns | pd.DataFrame, columns: Iterable[str]) -> dict[str, np.ndarray]:
    if not isinstance(data, (pd.DataFrame, Mapping)):
        raise InvalidArgumentError(
            f"expected a pandas DataFrame or a mapping of column name to array, got {type(data).__name__}"
        )
    wanted = tuple(columns)
    present = set(data.columns) if isinstance(data, pd.DataFrame) else set(data.keys())
    missing = [name for name in wanted if name not in present]
    if missing:
        raise InvalidArgumentError(
            "missing input column(s): " + ", ".join(repr(name) for name in missing)
        )
    arrays = {name: _column_array(data, name) for name in wanted}
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"'{name}': {n}" for name, n in lengths.items())
        raise InvalidArgumentError(f"input columns have different numbers of rows ({detail})")
    if next(iter(lengths.values())) == 0:
        raise InvalidArgumentError("no rows to transform: the input is empty")
    return arrays


# --------------------------------------------------------------------------- text as bytes
# Category values are handled as UTF-8 byte strings (numpy "S" arrays): Triton delivers BYTES
# tensors that way, so the serving path never decodes, and UTF-8 preserves code-point order,
# so byte-sorted classes are in the same order as the sorted strings the encoders store.


def _encode_utf8(array: np.ndarray) -> np.ndarray:
    try:
        return array.astype("S")  # ASCII, the common case, converts in one C loop
    except UnicodeEncodeError:
        return np.strings.encode(array.astype("U"), "utf-8")


def _as_bytes(array: np.ndarray, column: str) -> np.ndarray:
    """The column as a 1-D ``S`` array; a missing float (NaN) becomes ``b""``."""
    kind = array.dtype.kind
    if kind == "S":
        return array
    if kind == "U":
        return _encode_utf8(array)
    if kind in "iub":
        return array.astype("S")
    if kind == "f":
        finite = np.isfinite(array)
        integral = finite & (np.abs(array) < 2.0**63)
        integral &= np.floor(array, where=integral, out=np.zeros_like(array)) == array
        whole = np.where(integral, array, 0.0).astype(np.int64)
        text = np.where(integral, whole.astype("S"), array.astype("S"))
        return np.where(finite, text, b"")
    if kind == "O":
        first = array[0]
        if not isinstance(first, (bytes, str, int, float, np.integer, np.floating)) and not pd.isna(first):
            raise InvalidArgumentError(
                f"column '{column}' holds {type(first).__name__} values; expected strings or numbers"
            )
        # None, NaN and pd.NA become b"None", b"nan" and b"<NA>", all spellings of "missing".
        try:
            return _encode_utf8(array)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"column '{column}' holds values that are not text: {exc}") from None
    raise InvalidArgumentError(f"column '{column}' has unsupported dtype {array.dtype}")


def _spellings(*words: str) -> np.ndarray:
    variants = {v for word in words for v in (word, word.lower(), word.upper(), word.capitalize())}
    return np.array(sorted(v.encode() for v in variants), dtype="S")


# "" covers empty CSV cells and Triton's b""; the rest are how pandas, numpy and Python print
# a missing value.
_MISSING = _spellings("", "NaN", "None", "null", "<NA>")
_MISSING_TEXT = [spelling.decode() for spelling in _MISSING.tolist()]
_US_OR_ONLINE = np.array(sorted(code.encode() for code in US_STATE_CODES | {"ONLINE"}), dtype="S")


def _in_sorted(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    position = np.searchsorted(table, values).clip(max=len(table) - 1)
    return table[position] == values


def _is_missing(raw: np.ndarray) -> np.ndarray:
    return _in_sorted(_MISSING, np.strings.strip(raw))


def _canonical_integer_bytes(text: np.ndarray) -> np.ndarray:
    """``b"77539.0"``, ``b"077539"``, ``b"77539"`` -> ``b"77539"``; other text unchanged."""
    head, dot, fraction = np.strings.partition(text, b".")
    integral = (dot == b"") | (np.strings.strip(fraction, b"0") == b"")
    negative = np.strings.startswith(head, b"-")
    digits = np.where(negative, np.strings.slice(head, 1, None), head)
    numeric = integral & np.strings.isdigit(digits)
    if not numeric.any():
        return text
    digits = np.strings.lstrip(digits, b"0")
    digits = np.where(digits == b"", b"0", digits)
    signed = np.where(negative & (digits != b"0"), np.strings.add(b"-", digits), digits)
    return np.where(numeric, signed, text)


def _canonical_bytes(raw: np.ndarray, column: str, unknown: bytes) -> np.ndarray:
    """The canonical form of one category column: stripped, integer codes normalised,
    missing values replaced by ``unknown``."""
    text = np.strings.strip(raw)
    try:
        np.strings.decode(text, "utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"column '{column}' holds bytes that are not valid UTF-8: {exc}") from None
    missing = _in_sorted(_MISSING, text)
    if column in _INTEGER_CODE_COLUMNS:
        text = _canonical_integer_bytes(text)
    return np.where(missing, unknown, text)


def _apply_location_rules(city: np.ndarray, state: np.ndarray, zip_code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The example's ONLINE / FOREIGN rules on canonical bytes; returns (state, zip)."""
    online = city == b"ONLINE"
    if online.any():
        state = np.where(online, b"ONLINE", state)
        zip_code = np.where(online, b"ONLINE", zip_code)
    foreign = ~_in_sorted(_US_OR_ONLINE, state)
    if foreign.any():
        zip_code = np.where(foreign, b"FOREIGN", zip_code)
    return state, zip_code


def _canonical_categories(arrays: Mapping[str, np.ndarray], unknown: str = UNKNOWN) -> dict[str, np.ndarray]:
    marker = unknown.encode()
    text = {column: _canonical_bytes(_as_bytes(arrays[column], column), column, marker) for column in ENCODED_COLUMNS}
    text["Merchant State"], text["Zip"] = _apply_location_rules(
        text["Merchant City"], text["Merchant State"], text["Zip"]
    )
    return {column: np.strings.decode(values, "utf-8") for column, values in text.items()}


def canonical_categories(data: Columns | pd.DataFrame, unknown_value: str = UNKNOWN) -> dict[str, np.ndarray]:
    """Apply the example's category rules and return the canonical text of each encoded column.

    This is the part of the pipeline before label encoding; :meth:`FraudPreprocessor.fit`
    learns its classes from exactly these values, so training and serving agree.
    """
    return _canonical_categories(_gather_columns(data, ENCODED_COLUMNS), unknown_value)


# --------------------------------------------------------------------------- numeric handling


def _bad_values(values: np.ndarray, ok: np.ndarray) -> str:
    examples = np.unique(values[~ok])[:3]
    return ", ".join(repr(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)) for v in examples)


def _is_float(value: bytes) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _numeric(array: np.ndarray, column: str, currency: bool = False) -> np.ndarray:
    if array.dtype.kind in "iufb":
        values = array.astype(np.float64)
    else:
        text = _as_bytes(array, column)
        if currency:  # "$134.09", "$-64.00"
            text = np.strings.lstrip(np.strings.strip(text), b"$")
        try:
            values = text.astype(np.float64)
        except ValueError:
            values = _parse_slowly(text, column)
    finite = np.isfinite(values)
    if not finite.all():
        raise InvalidArgumentError(
            f"column '{column}' has missing or non-finite value(s): {_bad_values(values, finite)}"
        )
    return values


def _parse_slowly(text: np.ndarray, column: str) -> np.ndarray:
    """Error path, or thousands separators: find the bad values so the message can name them."""
    missing = _is_missing(text)
    if missing.any():
        raise InvalidArgumentError(f"column '{column}' has missing value(s); a number is required")
    text = np.strings.replace(text, b",", b"")
    ok = np.array([_is_float(value) for value in text.tolist()], dtype=bool)
    if not ok.all():
        raise InvalidArgumentError(f"column '{column}' has non-numeric value(s): {_bad_values(text, ok)}")
    return text.astype(np.float64)


def _hour_minute(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    text = _as_bytes(array, "Time")
    if text.dtype.itemsize == 5:
        # "HH:MM" read straight from the bytes: no string splitting at all.
        digits = np.ascontiguousarray(text).view(np.uint8).reshape(-1, 5).astype(np.int16) - ord("0")
        hour = digits[:, 0] * 10 + digits[:, 1]
        minute = digits[:, 3] * 10 + digits[:, 4]
        valid = (digits[:, 2] == ord(":") - ord("0")) & (hour < 24) & (minute < 60)
        valid &= (digits[:, [0, 1, 3, 4]] >= 0).all(axis=1) & (digits[:, [0, 1, 3, 4]] <= 9).all(axis=1)
        if valid.all():
            return hour, minute
    return _hour_minute_slowly(text)


def _hour_minute_slowly(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """"H:MM", "HH:MM:SS" and padded forms; and the error message for everything else."""
    text = np.strings.strip(text)
    if _is_missing(text).any():
        raise InvalidArgumentError("column 'Time' has missing value(s); expected \"HH:MM\"")
    hour_text, colon, rest = np.strings.partition(text, b":")
    minute_text = np.strings.partition(rest, b":")[0]
    valid = (colon == b":") & np.strings.isdigit(hour_text) & np.strings.isdigit(minute_text)
    valid &= (np.strings.str_len(hour_text) <= 2) & (np.strings.str_len(minute_text) == 2)
    if valid.all():
        hour = hour_text.astype(np.int64)
        minute = minute_text.astype(np.int64)
        valid = (hour < 24) & (minute < 60)
    if not valid.all():
        raise InvalidArgumentError(
            f"column 'Time' has value(s) that are not a time \"HH:MM\": {_bad_values(text, valid)}"
        )
    return hour, minute


# Above this many rows a hash lookup of Triton's object arrays of bytes beats converting them
# to a fixed-width array and binary-searching; below it the hash index's call overhead loses.
_HASH_LOOKUP_MIN_ROWS = 256


class _ColumnLookup:
    """Maps the raw values of one label-encoded column to codes.

    The table holds each reachable class, plus the spellings that canonicalise to it, so the
    usual request needs no string processing at all: missing-value spellings map to the
    unknown code, and for integer-code columns ``b"X.0"`` maps to the code of ``b"X"``, the way
    TabFormer writes zips. A class is reachable when it is its own canonical form (encoders
    loaded from elsewhere may hold classes our rules can never produce). Values not in the
    table are canonicalised and looked up again; those still unknown get the unknown code.
    """

    def __init__(self, classes: np.ndarray, column: str, unknown_code: int, unknown: bytes) -> None:
        self.column = column
        self.unknown_code = unknown_code
        self.unknown = unknown
        class_bytes = np.strings.encode(classes, "utf-8") if classes.size else np.array([], dtype="S1")
        self.class_bytes = class_bytes
        class_codes = np.arange(class_bytes.size, dtype=np.int64)
        reachable = _canonical_bytes(class_bytes, column, unknown) == class_bytes
        keys = [_MISSING, class_bytes[reachable]]
        codes = [np.full(_MISSING.size, unknown_code, dtype=np.int64), class_codes[reachable]]
        if column in _INTEGER_CODE_COLUMNS:
            integers = reachable & np.strings.isdigit(np.strings.lstrip(class_bytes, b"-"))
            keys.append(np.strings.add(class_bytes[integers], b".0"))
            codes.append(class_codes[integers])
        self.keys, first = np.unique(np.concatenate(keys), return_index=True)  # missing spellings win
        self.codes = np.concatenate(codes)[first]
        self._hash_index: pd.Index | None = None

    def code_of(self, canonical: bytes) -> int:
        position = min(int(np.searchsorted(self.keys, canonical)), len(self.keys) - 1)
        return int(self.codes[position]) if self.keys[position] == canonical else self.unknown_code

    def _search(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        position = np.searchsorted(self.keys, values).clip(max=len(self.keys) - 1)
        return self.codes[position], self.keys[position] == values

    def encode(self, array: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Return ``(codes, miss, canonical)``: ``miss`` marks the rows that needed
        canonicalising (None when none did) and ``canonical`` holds their canonical bytes."""
        if array.dtype.kind == "O" and array.size >= _HASH_LOOKUP_MIN_ROWS and isinstance(array[0], bytes):
            if self._hash_index is None:
                self._hash_index = pd.Index(self.keys.astype(object))
            position = self._hash_index.get_indexer(array)
            hit = position >= 0
            codes = self.codes[position]
        else:
            array = _as_bytes(array, self.column)
            codes, hit = self._search(array)
        if hit.all():
            return codes, None, None
        miss = ~hit
        canonical = _canonical_bytes(_as_bytes(array[miss], self.column), self.column, self.unknown)
        found_codes, found = self._search(canonical)
        codes[miss] = np.where(found, found_codes, self.unknown_code)
        return codes, miss, canonical


# --------------------------------------------------------------------------- the estimator


# auto_wrap_output_keys=None: scikit-learn's set_output wrapper costs microseconds per call on
# the batch-1 serving path, and the output here is always the float32 matrix Triton needs.
class FraudPreprocessor(TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """The example's preprocessing as a scikit-learn transformer.

    Parameters
    ----------
    unknown_value:
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
        arrays = _gather_columns(X, RAW_INPUT_COLUMNS)
        self._check_numeric_columns(arrays)
        categories = _canonical_categories(arrays, self.unknown_value)
        self._set_classes(
            {column: np.unique(np.append(values, self.unknown_value)) for column, values in categories.items()}
        )
        return self

    def _check_numeric_columns(self, arrays: Mapping[str, np.ndarray]) -> None:
        # Fit refuses data that transform would refuse, so a bad training frame fails early.
        for column in _NUMERIC_COLUMNS:
            _numeric(arrays[column], column)
        _numeric(arrays["Amount"], "Amount", currency=True)
        _hour_minute(arrays["Time"])

    def _set_classes(self, classes: Mapping[str, np.ndarray]) -> None:
        self.classes_ = {column: np.asarray(classes[column]) for column in ENCODED_COLUMNS}
        self.unknown_codes_ = {
            column: int(np.searchsorted(values, self.unknown_value)) for column, values in self.classes_.items()
        }
        self.n_features_in_ = len(RAW_INPUT_COLUMNS)
        self.feature_names_in_ = np.array(RAW_INPUT_COLUMNS, dtype=object)
        marker = self.unknown_value.encode()
        self._lookup = {
            column: _ColumnLookup(values, column, self.unknown_codes_[column], marker)
            for column, values in self.classes_.items()
        }
        self._rule_codes = {
            (column, value): self._lookup[column].code_of(value)
            for column, value in (("Merchant State", b"ONLINE"), ("Zip", b"ONLINE"), ("Zip", b"FOREIGN"))
        }
        # The location rules read codes, not text: a code is "ONLINE" or a US state (or not)
        # once and for all. Only rows that missed the table need their text checked.
        self._online_city = self._lookup["Merchant City"].class_bytes == b"ONLINE"
        self._domestic_state = _in_sorted(_US_OR_ONLINE, self._lookup["Merchant State"].class_bytes)

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
        arrays = _gather_columns(X, RAW_INPUT_COLUMNS)
        out = np.empty((len(arrays["User"]), len(FEATURE_NAMES)), dtype=np.float32)
        for column in _NUMERIC_COLUMNS:
            out[:, _FEATURE_INDEX[column]] = _numeric(arrays[column], column)
        out[:, _FEATURE_INDEX["Amount"]] = _numeric(arrays["Amount"], "Amount", currency=True)
        out[:, _FEATURE_INDEX["Hour"]], out[:, _FEATURE_INDEX["Minute"]] = _hour_minute(arrays["Time"])
        out[:, _FEATURE_INDEX["Errors?"]] = ~_is_missing(_as_bytes(arrays["Errors?"], "Errors?"))
        codes = {}
        for column in ENCODED_COLUMNS:
            codes[column], miss, canonical = self._lookup[column].encode(arrays[column])
            if column == "Merchant City":
                online = self._online_city[codes[column]]
                if miss is not None:
                    online[miss] = canonical == b"ONLINE"
            elif column == "Merchant State":
                domestic = self._domestic_state[codes[column]]
                if miss is not None:
                    domestic[miss] = _in_sorted(_US_OR_ONLINE, canonical)
        if online.any():
            domestic |= online
            codes["Merchant State"] = np.where(online, self._rule_codes["Merchant State", b"ONLINE"],
                                               codes["Merchant State"])
            codes["Zip"] = np.where(online, self._rule_codes["Zip", b"ONLINE"], codes["Zip"])
        if not domestic.all():
            codes["Zip"] = np.where(domestic, codes["Zip"], self._rule_codes["Zip", b"FOREIGN"])
        for column, values in codes.items():
            out[:, _FEATURE_INDEX[column]] = values
        return out

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
