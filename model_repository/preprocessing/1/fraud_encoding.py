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
classes are in the same order as the sorted strings the encoders store. A batch of more than
a hundred or so rows goes through whole-column numpy operations, with no per-row Python loop on
the success path; a smaller one, where numpy's cost per call would be the whole cost, through
Python lists and dictionaries built once — the same rules, checked against each other.
"""

from __future__ import annotations

import itertools
import math
import re
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


def _is_ascii_space(codes: np.ndarray) -> np.ndarray:
    return (codes == 32) | ((codes >= 9) & (codes <= 13))


def _already_canonical(raw: np.ndarray, integer: bool) -> np.ndarray:
    """Which values of an ``S`` array :func:`_canonical_bytes` would leave as they are (or, for an
    integer column, turn from ``X.0`` into an ``X`` already canonical) — read from the bytes, with
    no string functions: ASCII (so valid UTF-8), no surrounding whitespace, no NUL inside, not
    empty and, for integer columns, ``-?[1-9][0-9]*`` or ``0`` with an optional ``.0``. Missing
    spellings are never asked about: they are in every lookup table."""
    width = raw.dtype.itemsize
    if raw.size == 0 or width == 0:
        return np.zeros(raw.shape, dtype=bool)
    matrix = np.ascontiguousarray(raw).view(np.uint8).reshape(raw.size, width)
    nonzero = matrix != 0
    length = nonzero.sum(axis=1)
    rows = np.arange(raw.size)
    last = matrix[rows, np.maximum(length - 1, 0)]
    # a NUL followed by a byte is a NUL inside: S arrays pad with NULs only at the end
    ok = (length > 0) & (matrix.max(axis=1) < 128) & ~_is_ascii_space(matrix[:, 0]) & ~_is_ascii_space(last)
    if width > 1:
        ok &= ~(nonzero[:, 1:] > nonzero[:, :-1]).any(axis=1)
    if not integer:
        return ok
    # drop one trailing ".0"; then an optional "-" and digits without a leading zero (or "0")
    point = (length >= 3) & (last == ord("0")) & (matrix[rows, np.maximum(length - 2, 0)] == ord("."))
    body = length - 2 * point
    negative = matrix[:, 0] == ord("-")
    start = negative.view(np.uint8)
    # digits or padding everywhere past the sign, but for the ".0" (the point is its only non-digit)
    not_digit = ((matrix < ord("0")) | (matrix > ord("9"))) & nonzero
    not_digit[:, 0] &= ~negative
    ok &= (not_digit.sum(axis=1) == point) & (body > start)
    first = matrix[rows, np.minimum(start, width - 1)]
    ok &= (first != ord("0")) | ((body - start == 1) & ~negative)  # "0" is canonical; "-0", "007" are not
    return ok


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
        raw = _as_bytes(array[miss], self.column)
        # Most misses are values the encoders never saw, already in canonical form: their
        # canonical form is themselves, not in the table, so unknown. Only the others need the
        # string functions (slow per call on numpy's side), and a check of their UTF-8.
        plain = _already_canonical(raw, integer=self.column in _INTEGER_CODE_COLUMNS)
        if plain.all():
            codes[miss] = self.unknown_code
            return codes, miss, raw
        canonical = raw.astype(f"S{max(raw.dtype.itemsize, len(self.unknown))}")
        rest = ~plain
        canonical[rest] = _canonical_bytes(raw[rest], self.column, self.unknown)
        found_codes, found = self._search(canonical)
        codes[miss] = np.where(found & rest, found_codes, self.unknown_code)
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
        self._rows = _RowPath(self)

    def transform(self, data: Any) -> np.ndarray:
        """The float32 feature matrix in :data:`FEATURE_NAMES` order.

        Small batches go through Python lists and dictionaries (numpy's per-call cost dominates
        there); larger ones, and any batch with a value the list path does not take as plain, go
        through the whole-column path. Both give the same features; only the column path raises.
        """
        arrays = gather_columns(data, RAW_INPUT_COLUMNS)
        if len(arrays["User"]) <= _ROW_PATH_MAX_ROWS:
            out = self._rows.transform(arrays)
            if out is not None:
                return out
        return self._transform_columns(arrays)

    def _transform_columns(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
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


# --------------------------------------------------------------------------- small batches, as lists
# At a few rows numpy's fixed cost per call (some 280 calls per transform) is the whole cost, and
# Python lists with dictionary look-ups are several times faster; per row they cost more, and
# past about 200 rows (measured: bench/bench_preprocessing.py) the whole-column path wins. The
# list path takes only plain values — the bytes or str Triton and DataFrames hand over, integer
# or float numbers, "HH:MM" times, amounts like "$-64.00" — and answers None for anything else,
# so that the column path, with its exact rules and error messages, decides every unusual row.
_ROW_PATH_MAX_ROWS = 160
_PLAIN_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]*)?")
_PLAIN_TIME = re.compile(rb"([0-9]{1,2}):([0-9]{2})(?::.*)?", re.DOTALL)
# an integer code already in canonical form (with TabFormer's ".0"): the rules leave it as it is
_CANONICAL_INTEGER = re.compile(rb"(?:-?[1-9][0-9]*|0)(?:\.0)?")
_MISSING_SET = frozenset(_MISSING.tolist())
_TEXT_COLUMNS = (*ENCODED_COLUMNS, "Time", "Amount", "Errors?")
_US_OR_ONLINE_SET = frozenset(_US_OR_ONLINE.tolist())
_WHITESPACE = b" \t\n\r\x0b\x0c"


def _plain_text(value: Any) -> bytes | None:
    if value is None:  # a DataFrame's missing value, spelled as numpy's S conversion spells it
        return b"None"
    if type(value) is float and value != value:
        return b"nan"
    text = value.encode("utf-8") if type(value) is str else value
    if type(text) is not bytes or b"\x00" in text:  # numpy's S arrays drop trailing NULs: not plain
        return None
    return text


def _plain_column(array: np.ndarray) -> list[bytes] | None:
    """The column's values as :func:`_as_bytes` converts them, or None when one is not plain."""
    kind = array.dtype.kind
    if kind in "OSU":
        values = array.tolist()
        kinds = set(map(type, values))
        if kinds == {bytes}:  # Triton's BYTES tensors: checked in two C calls, not per value
            return None if b"\x00" in b"".join(values) else values
        texts = [_plain_text(value) for value in values]
    elif kind in "iu":
        texts = [str(value).encode() for value in array.tolist()]
    elif kind == "f":
        texts = []
        for value in array.tolist():
            if not math.isfinite(value):
                texts.append(b"")
            elif value.is_integer() and abs(value) < 2.0**63:
                texts.append(str(int(value)).encode())
            else:  # how numpy prints a fraction is its own business: the column path decides
                return None
    else:
        return None
    return None if None in texts else texts


def _canonical_integer_one(text: bytes) -> bytes:
    """:func:`_canonical_integer_bytes` for one value."""
    head, dot, fraction = text.partition(b".")
    if dot and fraction.strip(b"0"):
        return text
    negative = head.startswith(b"-")
    digits = head.partition(b"-")[2] if negative else head
    if not digits.isdigit():
        return text
    digits = digits.lstrip(b"0") or b"0"
    return b"-" + digits if negative and digits != b"0" else digits


class _RowPath:
    """:meth:`FeatureEncoder.transform` for a small batch of plain rows, as Python lists, with
    dictionaries built once."""

    def __init__(self, encoder: FeatureEncoder) -> None:
        self.tables = {column: dict(zip(lookup.keys.tolist(), lookup.codes.tolist(), strict=True))
                       for column, lookup in encoder._lookup.items()}
        self.unknown_codes = encoder.unknown_codes
        self.unknown = encoder.unknown_value.encode()
        self.online_city = encoder._online_city.tolist()
        self.domestic_state = encoder._domestic_state.tolist()
        self.state_online = encoder._rule_codes["Merchant State", b"ONLINE"]
        self.zip_online = encoder._rule_codes["Zip", b"ONLINE"]
        self.zip_foreign = encoder._rule_codes["Zip", b"FOREIGN"]
        self.numeric_index = [_FEATURE_INDEX[c] for c in _NUMERIC_COLUMNS]
        self.columns = [(c, _FEATURE_INDEX[c]) for c in ENCODED_COLUMNS]

    def _canonical(self, text: bytes, column: str) -> bytes | None:
        """:func:`_canonical_bytes` for one value; None where that raises (not UTF-8)."""
        text = text.strip(_WHITESPACE)
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if text in _MISSING_SET:
            return self.unknown
        return _canonical_integer_one(text) if column in _INTEGER_CODE_COLUMNS else text

    def _codes(self, texts: list[bytes], column: str) -> tuple[list[int], list[bytes | None]] | None:
        """Each value's code, and its canonical bytes where it missed the table (else None);
        None when a miss is not valid UTF-8."""
        table = self.tables[column]
        codes = [table.get(text) for text in texts]
        canonical: list[bytes | None] = [None] * len(texts)
        if None in codes:
            unknown = self.unknown_codes[column]
            integer = column in _INTEGER_CODE_COLUMNS
            for row, code in enumerate(codes):
                if code is not None:
                    continue
                text = texts[row]
                # the common miss, a value never seen and already canonical: its own canonical
                # form, which the table lacks, so unknown — no string processing at all
                if (_CANONICAL_INTEGER.fullmatch(text) if integer
                        else text.isascii() and text and text.strip(_WHITESPACE) == text):
                    codes[row], canonical[row] = unknown, text.removesuffix(b".0") if integer else text
                    continue
                value = self._canonical(text, column)
                if value is None:
                    return None
                codes[row] = table.get(value, unknown)
                canonical[row] = value
        return codes, canonical  # type: ignore[return-value]

    def transform(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """The features, or None when a value is not plain (the column path then decides)."""
        features: list[list[float] | list[int] | None] = [None] * len(FEATURE_NAMES)
        for column, position in zip(_NUMERIC_COLUMNS, self.numeric_index, strict=True):
            array = arrays[column]
            if array.dtype.kind not in "iuf":
                return None
            values = [float(value) for value in array.tolist()]
            if not all(map(math.isfinite, values)):
                return None
            features[position] = values
        lists = [arrays[column].tolist() for column in _TEXT_COLUMNS]
        if set(map(type, itertools.chain.from_iterable(lists))) == {bytes}:
            # Triton's BYTES tensors, all of them checked in a few C calls
            if b"\x00" in b"".join(itertools.chain.from_iterable(lists)):
                return None
            texts = dict(zip(_TEXT_COLUMNS, lists, strict=True))
        else:
            texts = {}
            for column in _TEXT_COLUMNS:
                texts[column] = _plain_column(arrays[column])
                if texts[column] is None:
                    return None
        amounts = [text.strip(_WHITESPACE).lstrip(b"$") for text in texts["Amount"]]
        times = [_PLAIN_TIME.fullmatch(text.strip(_WHITESPACE)) for text in texts["Time"]]
        if None in times or not all(map(_PLAIN_NUMBER.fullmatch, amounts)):
            return None
        hours = [int(match.group(1)) for match in times]  # type: ignore[union-attr]
        minutes = [int(match.group(2)) for match in times]  # type: ignore[union-attr]
        if max(hours) >= 24 or max(minutes) >= 60:
            return None
        index = _FEATURE_INDEX
        features[index["Amount"]] = [float(amount) for amount in amounts]
        features[index["Hour"]], features[index["Minute"]] = hours, minutes
        features[index["Errors?"]] = [0.0 if text.strip(_WHITESPACE) in _MISSING_SET else 1.0
                                      for text in texts["Errors?"]]
        codes, canonical = {}, {}
        for column in ENCODED_COLUMNS:
            found = self._codes(texts[column], column)
            if found is None:
                return None
            codes[column], canonical[column] = found
        online = [self.online_city[code] if text is None else text == b"ONLINE"
                  for code, text in zip(codes["Merchant City"], canonical["Merchant City"], strict=True)]
        domestic = [self.domestic_state[code] if text is None else text in _US_OR_ONLINE_SET
                    for code, text in zip(codes["Merchant State"], canonical["Merchant State"], strict=True)]
        if any(online):
            codes["Merchant State"] = [self.state_online if on else code
                                       for on, code in zip(online, codes["Merchant State"], strict=True)]
            codes["Zip"] = [self.zip_online if on else code for on, code in zip(online, codes["Zip"], strict=True)]
            domestic = [on or inland for on, inland in zip(online, domestic, strict=True)]
        if not all(domestic):
            codes["Zip"] = [code if inland else self.zip_foreign
                            for inland, code in zip(domestic, codes["Zip"], strict=True)]
        for column, position in self.columns:
            features[position] = codes[column]
        # float64 first, as the column path computes: the same float32 values
        # Python floats are doubles: straight to float32 rounds as the column path's float64 does
        return np.ascontiguousarray(np.array(features, dtype=np.float32).T)


def check_numeric_columns(arrays: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`FeatureInputError` for what :meth:`FeatureEncoder.transform` would refuse
    in the numeric columns (so a bad training frame fails before any fitting)."""
    for column in _NUMERIC_COLUMNS:
        _numeric(arrays[column], column)
    _numeric(arrays["Amount"], "Amount", currency=True)
    _hour_minute(arrays["Time"])
