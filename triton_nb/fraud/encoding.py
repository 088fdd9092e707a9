"""The fraud example's preprocessing as plain numpy: one implementation for the SDK and Triton.

:class:`FeatureEncoder` turns raw TabFormer transactions (a mapping of column name to array —
Triton's Python backend hands BYTES tensors over as object arrays of UTF-8 bytes shaped
``[batch, 1]`` — or a DataFrame) into the 15 float32 features of the example, given the sorted
class lists of its label encoders. :class:`triton_nb.fraud.FraudPreprocessor` wraps it in a
scikit-learn estimator; the exported preprocessing ``model.py`` ships this very file next to it
and imports it, so what was tested is what real Triton runs. That is why this module depends on
numpy alone (pandas, when importable, only speeds up large lookups) and imports nothing else
from triton_nb.

Values are handled as UTF-8 byte strings (numpy ``S`` arrays) throughout: Triton delivers them
that way, so serving never decodes, and UTF-8 preserves code-point order, so byte-sorted
classes are in the same order as the sorted strings the encoders store. Every step is a
whole-column numpy operation: there is no per-row Python loop on the success path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

try:  # optional: a hash index beats binary search for large batches
    import pandas as _pd
except ImportError:  # pragma: no cover - exercised in Triton images without pandas
    _pd = None

# numpy >= 2 has fast string ufuncs in numpy.strings. Triton's Python backend (24.x and the
# stub in nvidia-pytriton) is built against numpy 1.x and corrupts tensors under numpy 2, so a
# Triton image has numpy 1.x, where numpy.char offers the same functions.
_str = getattr(np, "strings", None) or np.char


def _partition(values: np.ndarray, separator: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts = _str.partition(values, separator)
    if isinstance(parts, tuple):  # numpy.strings
        return parts
    return parts[..., 0], parts[..., 1], parts[..., 2]  # numpy.char stacks the parts

__all__ = [
    "ENCODED_COLUMNS",
    "FEATURE_NAMES",
    "RAW_INPUT_COLUMNS",
    "UNKNOWN",
    "US_STATE_CODES",
    "FeatureEncoder",
    "FeatureInputError",
    "canonical_categories",
]

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
    array = values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    elif array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise FeatureInputError(
            f"column '{column}' must be 1-D (or [batch, 1]), got shape {list(array.shape)}"
        )
    return array


def gather_columns(data: Any, columns: Iterable[str]) -> dict[str, np.ndarray]:
    """The named columns of a mapping or DataFrame as 1-D numpy arrays of equal length."""
    if isinstance(data, Mapping):
        present = set(data.keys())
    elif hasattr(data, "columns") and hasattr(data, "__getitem__"):
        present = set(data.columns)
    else:
        raise FeatureInputError(
            f"expected a pandas DataFrame or a mapping of column name to array, got {type(data).__name__}"
        )
    wanted = tuple(columns)
    missing = [name for name in wanted if name not in present]
    if missing:
        raise FeatureInputError(
            "missing input column(s): " + ", ".join(repr(name) for name in missing)
        )
    arrays = {name: _column_array(data, name) for name in wanted}
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"'{name}': {n}" for name, n in lengths.items())
        raise FeatureInputError(f"input columns have different numbers of rows ({detail})")
    if next(iter(lengths.values())) == 0:
        raise FeatureInputError("no rows to transform: the input is empty")
    return arrays


# --------------------------------------------------------------------------- text as bytes
# Category values are handled as UTF-8 byte strings (numpy "S" arrays): Triton delivers BYTES
# tensors that way, so the serving path never decodes, and UTF-8 preserves code-point order,
# so byte-sorted classes are in the same order as the sorted strings the encoders store.


def _encode_utf8(array: np.ndarray) -> np.ndarray:
    try:
        return array.astype("S")  # ASCII, the common case, converts in one C loop
    except UnicodeEncodeError:
        return _str.encode(array.astype("U"), "utf-8")


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
        if not isinstance(first, (bytes, str, int, float, np.integer, np.floating)) and not _is_missing_scalar(first):
            raise FeatureInputError(
                f"column '{column}' holds {type(first).__name__} values; expected strings or numbers"
            )
        # None, NaN and pd.NA become b"None", b"nan" and b"<NA>", all spellings of "missing".
        try:
            return _encode_utf8(array)
        except (TypeError, ValueError) as exc:
            raise FeatureInputError(f"column '{column}' holds values that are not text: {exc}") from None
    raise FeatureInputError(f"column '{column}' has unsupported dtype {array.dtype}")


def _is_missing_scalar(value: Any) -> bool:
    return value is None or type(value).__name__ in ("NAType", "NaTType")


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
    return _in_sorted(_MISSING, _str.strip(raw))


def _canonical_integer_bytes(text: np.ndarray) -> np.ndarray:
    """``b"77539.0"``, ``b"077539"``, ``b"77539"`` -> ``b"77539"``; other text unchanged."""
    head, dot, fraction = _partition(text, b".")
    integral = (dot == b"") | (_str.strip(fraction, b"0") == b"")
    negative = _str.startswith(head, b"-")
    digits = np.where(negative, _partition(head, b"-")[2], head)  # drop the one leading "-"
    numeric = integral & _str.isdigit(digits)
    if not numeric.any():
        return text
    digits = _str.lstrip(digits, b"0")
    digits = np.where(digits == b"", b"0", digits)
    signed = np.where(negative & (digits != b"0"), _str.add(b"-", digits), digits)
    return np.where(numeric, signed, text)


def _canonical_bytes(raw: np.ndarray, column: str, unknown: bytes) -> np.ndarray:
    """The canonical form of one category column: stripped, integer codes normalised,
    missing values replaced by ``unknown``."""
    text = _str.strip(raw)
    try:
        _str.decode(text, "utf-8")
    except UnicodeDecodeError as exc:
        raise FeatureInputError(f"column '{column}' holds bytes that are not valid UTF-8: {exc}") from None
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


def canonical_category_arrays(arrays: Mapping[str, np.ndarray], unknown: str = UNKNOWN) -> dict[str, np.ndarray]:
    """The canonical text (unicode arrays) of each encoded column, after the location rules."""
    marker = unknown.encode()
    text = {column: _canonical_bytes(_as_bytes(arrays[column], column), column, marker) for column in ENCODED_COLUMNS}
    text["Merchant State"], text["Zip"] = _apply_location_rules(
        text["Merchant City"], text["Merchant State"], text["Zip"]
    )
    return {column: _str.decode(values, "utf-8") for column, values in text.items()}


def canonical_categories(data: Any, unknown_value: str = UNKNOWN) -> dict[str, np.ndarray]:
    """Apply the example's category rules and return the canonical text of each encoded column.

    This is the part of the pipeline before label encoding; :meth:`FraudPreprocessor.fit`
    learns its classes from exactly these values, so training and serving agree.
    """
    return canonical_category_arrays(gather_columns(data, ENCODED_COLUMNS), unknown_value)


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
            text = _str.lstrip(_str.strip(text), b"$")
        try:
            values = text.astype(np.float64)
        except ValueError:
            values = _parse_slowly(text, column)
    finite = np.isfinite(values)
    if not finite.all():
        raise FeatureInputError(
            f"column '{column}' has missing or non-finite value(s): {_bad_values(values, finite)}"
        )
    return values


def _parse_slowly(text: np.ndarray, column: str) -> np.ndarray:
    """Error path, or thousands separators: find the bad values so the message can name them."""
    missing = _is_missing(text)
    if missing.any():
        raise FeatureInputError(f"column '{column}' has missing value(s); a number is required")
    text = _str.replace(text, b",", b"")
    ok = np.array([_is_float(value) for value in text.tolist()], dtype=bool)
    if not ok.all():
        raise FeatureInputError(f"column '{column}' has non-numeric value(s): {_bad_values(text, ok)}")
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
    text = _str.strip(text)
    if _is_missing(text).any():
        raise FeatureInputError("column 'Time' has missing value(s); expected \"HH:MM\"")
    hour_text, colon, rest = _partition(text, b":")
    minute_text = _partition(rest, b":")[0]
    valid = (colon == b":") & _str.isdigit(hour_text) & _str.isdigit(minute_text)
    valid &= (_str.str_len(hour_text) <= 2) & (_str.str_len(minute_text) == 2)
    if valid.all():
        hour = hour_text.astype(np.int64)
        minute = minute_text.astype(np.int64)
        valid = (hour < 24) & (minute < 60)
    if not valid.all():
        raise FeatureInputError(
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
        class_bytes = _str.encode(classes, "utf-8") if classes.size else np.array([], dtype="S1")
        self.class_bytes = class_bytes
        class_codes = np.arange(class_bytes.size, dtype=np.int64)
        reachable = _canonical_bytes(class_bytes, column, unknown) == class_bytes
        keys = [_MISSING, class_bytes[reachable]]
        codes = [np.full(_MISSING.size, unknown_code, dtype=np.int64), class_codes[reachable]]
        if column in _INTEGER_CODE_COLUMNS:
            integers = reachable & _str.isdigit(_str.lstrip(class_bytes, b"-"))
            keys.append(_str.add(class_bytes[integers], b".0"))
            codes.append(class_codes[integers])
        self.keys, first = np.unique(np.concatenate(keys), return_index=True)  # missing spellings win
        self.codes = np.concatenate(codes)[first]
        self._hash_index: Any = None

    def code_of(self, canonical: bytes) -> int:
        position = min(int(np.searchsorted(self.keys, canonical)), len(self.keys) - 1)
        return int(self.codes[position]) if self.keys[position] == canonical else self.unknown_code

    def _search(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        position = np.searchsorted(self.keys, values).clip(max=len(self.keys) - 1)
        return self.codes[position], self.keys[position] == values

    def encode(self, array: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Return ``(codes, miss, canonical)``: ``miss`` marks the rows that needed
        canonicalising (None when none did) and ``canonical`` holds their canonical bytes."""
        if (_pd is not None and array.dtype.kind == "O" and array.size >= _HASH_LOOKUP_MIN_ROWS
                and isinstance(array[0], bytes)):
            if self._hash_index is None:
                self._hash_index = _pd.Index(self.keys.astype(object))
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


class FeatureEncoder:
    """Raw transactions -> the ``(rows, 15)`` float32 features, for fixed encoder classes.

    ``classes`` maps each of :data:`ENCODED_COLUMNS` to its sorted class strings (the
    example's ``label_encoders.pkl``), which must include ``unknown_value``.
    """

    def __init__(self, classes: Mapping[str, np.ndarray], unknown_value: str = UNKNOWN) -> None:
        self.unknown_value = unknown_value
        self.classes = {column: np.asarray(classes[column]) for column in ENCODED_COLUMNS}
        self.unknown_codes = {
            column: int(np.searchsorted(values, unknown_value)) for column, values in self.classes.items()
        }
        marker = unknown_value.encode()
        self._lookup = {
            column: _ColumnLookup(values, column, self.unknown_codes[column], marker)
            for column, values in self.classes.items()
        }
        self._rule_codes = {
            (column, value): self._lookup[column].code_of(value)
            for column, value in (("Merchant State", b"ONLINE"), ("Zip", b"ONLINE"), ("Zip", b"FOREIGN"))
        }
        # The location rules read codes, not text: a code is "ONLINE" or a US state (or not)
        # once and for all. Only rows that missed the table need their text checked.
        self._online_city = self._lookup["Merchant City"].class_bytes == b"ONLINE"
        self._domestic_state = _in_sorted(_US_OR_ONLINE, self._lookup["Merchant State"].class_bytes)

    def transform(self, data: Any) -> np.ndarray:
        """The float32 feature matrix in :data:`FEATURE_NAMES` order."""
        arrays = gather_columns(data, RAW_INPUT_COLUMNS)
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


def check_numeric_columns(arrays: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`FeatureInputError` for what :meth:`FeatureEncoder.transform` would refuse
    in the numeric columns (so a bad training frame fails before any fitting)."""
    for column in _NUMERIC_COLUMNS:
        _numeric(arrays[column], column)
    _numeric(arrays["Amount"], "Amount", currency=True)
    _hour_minute(arrays["Time"])
