"""The fraud example's preprocessing as plain numpy: one implementation for the SDK and Triton.

:class:`FeatureEncoder` turns raw TabFormer transactions (a mapping of column name to array —
Triton's Python backend hands BYTES tensors over as object arrays of UTF-8 bytes shaped
``[batch, 1]`` — or a DataFrame) into the 15 float32 features of the example, given the sorted
class lists of its label encoders. :class:`triton_nb.fraud.FraudPreprocessor` wraps it in a
scikit-learn estimator; the exported preprocessing ``model.py`` ships this very file next to it
and imports it, so what was tested is what real Triton runs. That is why this module depends on
numpy alone and imports nothing else from triton_nb.

Values are handled as UTF-8 byte strings (numpy ``S`` arrays) throughout: Triton delivers them
that way, so serving never decodes, and UTF-8 preserves code-point order, so byte-sorted
classes are in the same order as the sorted strings the encoders store. A batch of more than
a hundred or so rows goes through whole-column numpy operations; a smaller one, where numpy's
cost per call would be the whole cost, through Python lists — the same rules, checked against
each other. Both look a category value up in a dictionary of every spelling met so far (the
classes and their TabFormer spellings from the start, then each value the rules have judged),
so a served value is judged by the rules once and looked up ever after.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from itertools import chain, repeat
from operator import attrgetter
from typing import Any

import numpy as np

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
    elif currency and (amounts := _tabformer_amounts(array)) is not None:
        return amounts
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


def _joined(array: np.ndarray) -> tuple[int, bytes, np.ndarray] | None:
    """An object array of bytes (Triton's BYTES tensors) as one buffer, each value followed by a
    newline: one C call, several times cheaper than converting to a fixed-width array. Returns
    (rows, buffer as bytes, buffer as uint8), or None for other arrays.

    Only the first value's type is checked, which a check of every value would cost as much as
    the join: a value that is no buffer makes the join raise; a bytearray or another buffer amid
    bytes is taken by its content (the whole-column rules would refuse it as not text)."""
    if array.dtype.kind != "O" or type(array[0]) is not bytes:
        return None
    try:
        joined = b"\n".join(array.tolist()) + b"\n"
    except TypeError:
        return None
    return array.size, joined, np.frombuffer(joined, dtype=np.uint8)


def _tabformer_amounts(array: np.ndarray) -> np.ndarray | None:
    """Amounts written as TabFormer writes them, ``"$-?D+.DD"`` (at most 13 integer digits),
    parsed from one buffer; None for anything else, which the general parse then decides.

    The value is the integer number of cents over 100: both are exact doubles, so the quotient
    is the correctly rounded value of the decimal, which is what parsing the text gives."""
    found = _joined(array)
    if found is None:
        return None
    rows, joined, buffer = found
    ends = np.flatnonzero(buffer == ord("\n"))
    if ends.size != rows:  # a newline inside a value
        return None
    starts = np.concatenate(([0], ends[:-1] + 1))
    negative = buffer[np.minimum(starts + 1, ends)] == ord("-")
    length = ends - starts - negative
    if not ((length >= 5) & (length <= 17)).all():
        return None
    if not ((buffer[starts] == ord("$")) & (buffer[ends - 3] == ord("."))).all():
        return None
    # Digits everywhere else: the only other bytes are those "$", "." and "-" and the newlines,
    # at distinct places since a value has at least one integer digit.
    if np.count_nonzero(buffer - np.uint8(ord("0")) > 9) != 3 * rows + np.count_nonzero(negative):
        return None
    amounts = np.fromstring(joined.translate(None, b"$.-"), dtype=np.int64, sep="\n") / 100
    np.negative(amounts, out=amounts, where=negative)  # "-0.00" is -0.0, as parsing gives
    return amounts


# Each of "HH:MM"'s bytes minus "0" lies within these (a byte below "0" wraps round, past 9).
_HHMM_LOW = np.array([0, 0, ord(":") - ord("0"), 0, 0], dtype=np.uint8)
_HHMM_HIGH = np.array([2, 9, ord(":") - ord("0"), 5, 9], dtype=np.uint8)


def _hhmm(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Hour and minute of ``(rows, 5)`` bytes that all read "HH:MM", else None."""
    digits = matrix - np.uint8(ord("0"))
    if not ((digits >= _HHMM_LOW) & (digits <= _HHMM_HIGH)).all():
        return None
    hour = digits[:, 0] * np.int16(10) + digits[:, 1]
    return (hour, digits[:, 3] * np.int16(10) + digits[:, 4]) if (hour < 24).all() else None


def _hour_minute(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # "HH:MM" read straight from the bytes: no string splitting at all.
    joined = _joined(array)
    if joined is not None:
        rows, _, buffer = joined
        # 6 bytes a row, of which _hhmm reads 5: it refuses a newline in any of them, so the
        # newlines (one a value at least) are all in the sixth, and every value is 5 bytes long
        if buffer.size == 6 * rows and (parsed := _hhmm(buffer.reshape(rows, 6)[:, :5])) is not None:
            return parsed
    text = _as_bytes(array, "Time")
    if text.dtype.itemsize == 5:
        parsed = _hhmm(np.ascontiguousarray(text).view(np.uint8).reshape(-1, 5))
        if parsed is not None:
            return parsed
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


# --------------------------------------------------------------------------- spellings met so far
# A category value is looked up in a dictionary of raw spellings: at first the classes and the
# spellings that canonicalise to them, then also each value the rules have judged, so that a
# value is canonicalised once and not on every request that carries it. The dictionary learns
# at most this many values beyond its first ones, then starts over from those: a bound on its
# memory, not a policy worth tuning (real traffic repeats its merchants, cities and zips).
_LEARNED_LIMIT = 1 << 16


class _Spellings:
    """Raw spelling -> answer: ``base`` fixed at load, ``seen`` that and what was learned since.
    Dictionary reads and updates are atomic under the GIL: transforms on several threads at once
    at worst judge a value twice."""

    def __init__(self, base: dict[bytes, Any]) -> None:
        self.base = base
        self.seen = dict(base)

    def learn(self, learned: Mapping[bytes, Any]) -> None:
        if len(self.seen) + len(learned) > len(self.base) + _LEARNED_LIMIT:
            self.seen = dict(self.base)
        self.seen.update(learned)


class _ColumnLookup(_Spellings):
    """Maps the raw values of one label-encoded column to *outcomes*: the code and, for the
    columns the location rules read, a flag (Merchant City: the value is ``ONLINE``; Merchant
    State: a US state or ``ONLINE``). Outcome ``code`` has the flag of the class itself and
    ``code + width`` the other one: an unseen ``"WY"`` has the unknown code yet is a US state.

    The first spellings are each reachable class, plus the spellings that canonicalise to it, so
    the usual request needs no string processing at all: missing-value spellings map to the
    unknown code, and for integer-code columns ``b"X.0"`` maps to the code of ``b"X"``, the way
    TabFormer writes zips. A class is reachable when it is its own canonical form (encoders
    loaded from elsewhere may hold classes our rules can never produce). Values not there are
    canonicalised and looked up again; those still unknown get the unknown code.
    """

    def __init__(self, classes: np.ndarray, column: str, unknown_code: int, unknown: bytes,
                 flag_texts: tuple[bytes, ...]) -> None:
        self.column = column
        self.integer = column in _INTEGER_CODE_COLUMNS
        self.unknown_code = unknown_code
        self.unknown = unknown
        class_bytes = _str.encode(classes, "utf-8") if classes.size else np.array([], dtype="S1")
        class_codes = np.arange(class_bytes.size, dtype=np.int64)
        reachable = _canonical_bytes(class_bytes, column, unknown) == class_bytes
        keys = [_MISSING, class_bytes[reachable]]
        codes = [np.full(_MISSING.size, unknown_code, dtype=np.int64), class_codes[reachable]]
        if self.integer:
            integers = reachable & _str.isdigit(_str.lstrip(class_bytes, b"-"))
            keys.append(_str.add(class_bytes[integers], b".0"))
            codes.append(class_codes[integers])
        self.keys, first = np.unique(np.concatenate(keys), return_index=True)  # missing spellings win
        self.codes = np.concatenate(codes)[first]
        self.flag_texts = np.array(sorted(flag_texts), dtype="S")
        self.flag_set = frozenset(flag_texts)
        self.width = max(class_bytes.size, unknown_code + 1)
        self.class_flags = np.zeros(self.width, dtype=bool)
        if flag_texts:
            self.class_flags[:class_bytes.size] = _in_sorted(self.flag_texts, class_bytes)
        self.outcome_codes = np.tile(np.arange(self.width, dtype=np.int64), 2)
        self.outcome_flags = np.concatenate([self.class_flags, ~self.class_flags])
        # a spelling of a class has that class's flag: its outcome is its code
        super().__init__(dict(zip(self.keys.tolist(), self.codes.tolist(), strict=True)))

    def _search(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        position = np.searchsorted(self.keys, values).clip(max=len(self.keys) - 1)
        return self.codes[position], self.keys[position] == values

    def ids(self, array: np.ndarray) -> np.ndarray:
        """Each value's outcome; raises :class:`FeatureInputError` for what the rules refuse."""
        if array.dtype.kind == "O" and array.size and type(array[0]) is bytes:  # learned: bytes only
            found = self._ids_seen(array)
            if found is not None:
                return found
        return self._ids_by_rules(array)

    def _ids_seen(self, array: np.ndarray) -> np.ndarray | None:
        """An object column's outcomes from the spellings seen, the new ones judged by the rules
        once each (and learned); None when a new one is not bytes or the rules refuse one, so that
        the whole column goes through the rules and the error is the one it always was."""
        values = array.tolist()
        try:
            ids = np.fromiter(map(self.seen.get, values, repeat(-1)), dtype=np.intp, count=len(values))
        except TypeError:  # an unhashable value
            return None
        missed = np.flatnonzero(ids < 0)
        if missed.size:
            new = array[missed]
            distinct = list(dict.fromkeys(new.tolist()))
            if set(map(type, distinct)) != {bytes}:
                return None
            try:
                judged = self._ids_by_rules(np.array(distinct, dtype=object))
            except FeatureInputError:
                return None
            learned = dict(zip(distinct, judged.tolist(), strict=True))
            ids[missed] = np.fromiter(map(learned.__getitem__, new.tolist()), dtype=np.intp, count=new.size)
            self.learn(learned)
        return ids

    def _ids_by_rules(self, array: np.ndarray) -> np.ndarray:
        values = _as_bytes(array, self.column)
        codes, hit = self._search(values)
        if hit.all():
            return codes
        miss = ~hit
        raw = values[miss]
        # Most misses are values the encoders never saw, already in canonical form: their
        # canonical form is themselves, not in the table, so unknown. Only the others need the
        # string functions (slow per call on numpy's side), and a check of their UTF-8.
        rest = ~_already_canonical(raw, integer=self.integer)
        canonical = raw.astype(f"S{max(raw.dtype.itemsize, len(self.unknown))}")
        found_codes = np.full(raw.size, self.unknown_code, dtype=np.int64)
        if rest.any():
            canonical[rest] = _canonical_bytes(raw[rest], self.column, self.unknown)
            searched, found = self._search(canonical)
            found_codes = np.where(found & rest, searched, self.unknown_code)
        if self.flag_set:  # "X.0" spellings are for integer columns, which have no flags
            found_codes += self.width * (_in_sorted(self.flag_texts, canonical) != self.class_flags[found_codes])
        codes[miss] = found_codes
        return codes


class _ErrorFlags(_Spellings):
    """Errors? -> 0.0 for a missing value, else 1.0, looked up like the categories."""

    def __init__(self) -> None:
        super().__init__(dict.fromkeys(_MISSING.tolist(), 0.0))

    def of_list(self, values: list[Any]) -> list[float] | None:
        """The flags, or None when a new value is not bytes or holds a NUL (numpy's S arrays cut
        trailing NULs: the column path decides those)."""
        try:
            flags = list(map(self.seen.get, values))
        except TypeError:  # an unhashable value
            return None
        if None in flags:
            learned = {}
            for row, flag in enumerate(flags):
                if flag is None:
                    value = values[row]
                    if type(value) is not bytes or b"\x00" in value:
                        return None
                    flags[row] = learned[value] = 0.0 if value.strip(_WHITESPACE) in _MISSING_SET else 1.0
            self.learn(learned)
        return flags

    def of_objects(self, array: np.ndarray) -> np.ndarray | None:
        """The flags of an object column, looking one by one only at its values other than b""
        (TabFormer leaves Errors? empty on nearly every row)."""
        try:
            present = np.flatnonzero(array != b"")
        except (TypeError, ValueError):  # a value whose comparison is not a truth value
            return None
        flags = np.zeros(array.size)
        found = self.of_list(array[present].tolist()) if present.size else []
        if found is None:
            return None
        flags[present] = found
        return flags


# The location rules read these three columns together (see _Locations); the others alone.
_LOCATION_COLUMNS = ("Merchant City", "Merchant State", "Zip")
_UNLOCATED = tuple(column for column in ENCODED_COLUMNS if column not in _LOCATION_COLUMNS)
_CODE_BITS = 20  # three codes packed in an int64


class _Locations(_Spellings):
    """(Merchant City, Merchant State, Zip) values -> their three codes after the location rules,
    packed in one integer, learned like the spellings: the rules read the three together, and one
    look-up of the three costs less than three look-ups of one (a location recurs far more often
    than its three values apart). For large object columns; the row path reads columns alone."""

    def __init__(self, encoder: FeatureEncoder) -> None:
        super().__init__({})
        self.encoder = encoder
        self.usable = all(encoder._lookup[column].width < 1 << _CODE_BITS for column in _LOCATION_COLUMNS)

    def codes(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The three columns' codes, or None where the columns must be read alone: not object
        arrays, or a value the rules refuse (the error is then the one reading them alone gives)."""
        columns = [arrays[column] for column in _LOCATION_COLUMNS]
        if not self.usable or set(map(_KIND, columns)) != {"O"} or type(columns[0][0]) is not bytes:
            return None  # (learned: bytes only)
        values = [column.tolist() for column in columns]
        try:
            packed = np.fromiter(map(self.seen.get, zip(*values, strict=True), repeat(-1)), dtype=np.int64,
                                 count=len(values[0]))
        except TypeError:  # an unhashable value
            return None
        missed = np.flatnonzero(packed < 0)
        if missed.size:
            try:
                ids = {column: self.encoder._lookup[column].ids(array[missed])
                       for column, array in zip(_LOCATION_COLUMNS, columns, strict=True)}
            except FeatureInputError:
                return None
            found = self.encoder._locate(ids)
            city, state, zip_code = (found[column].astype(np.int64) for column in _LOCATION_COLUMNS)
            packed[missed] = (city << 2 * _CODE_BITS) | (state << _CODE_BITS) | zip_code
            new = [column[missed].tolist() for column in columns]
            learned = dict(zip(zip(*new, strict=True), packed[missed].tolist(), strict=True))
            if set(map(type, chain.from_iterable(learned))) == {bytes}:  # like the spellings: bytes only
                self.learn(learned)
        mask = (1 << _CODE_BITS) - 1
        return {"Merchant City": packed >> 2 * _CODE_BITS, "Merchant State": (packed >> _CODE_BITS) & mask,
                "Zip": packed & mask}


# --------------------------------------------------------------------------- the estimator

# The canonical texts that raise the location rules' flags, per column (see _ColumnLookup).
_FLAG_TEXTS = {"Merchant City": (b"ONLINE",), "Merchant State": tuple(_US_OR_ONLINE.tolist())}


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
            column: _ColumnLookup(values, column, self.unknown_codes[column], marker, _FLAG_TEXTS.get(column, ()))
            for column, values in self.classes.items()
        }
        self._rule_codes = {
            (column, value): self._lookup[column].base.get(value, self.unknown_codes[column])
            for column, value in (("Merchant State", b"ONLINE"), ("Zip", b"ONLINE"), ("Zip", b"FOREIGN"))
        }
        self._errors = _ErrorFlags()
        self._locations = _Locations(self)
        self._rows = _RowPath(self)

    def _forget(self) -> None:
        """Back to the spellings known at load, as if no value had been judged yet."""
        for spellings in (*self._lookup.values(), self._errors, self._locations):
            spellings.seen = dict(spellings.base)

    def transform(self, data: Any) -> np.ndarray:
        """The float32 feature matrix in :data:`FEATURE_NAMES` order.

        Small batches go through Python lists and dictionaries (numpy's per-call cost dominates
        there; a Triton request of one row, value by value); larger ones, and any batch with a
        value the list path does not take as plain, go through the whole-column path. All give
        the same features; only the column path raises.
        """
        if type(data) is dict:  # a Triton request, the served case: read without gather_columns
            out = self._rows.transform_request(data)
            if out is not None:
                return out
        arrays = gather_columns(data, RAW_INPUT_COLUMNS)
        if len(arrays["User"]) <= _ROW_PATH_MAX_ROWS:
            out = self._rows.transform(arrays)
            if out is not None:
                return out
        return self._transform_columns(arrays)

    def _transform_columns(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        out = np.empty((len(arrays["User"]), len(FEATURE_NAMES)), dtype=np.float32)
        numbers = [arrays[column] for column in _NUMERIC_COLUMNS]
        if set(map(_KIND, numbers)) == {"f"} and np.isfinite(block := np.stack(numbers, axis=1)).all():
            out[:, :len(_NUMERIC_COLUMNS)] = block  # Triton's FP32 tensors, in one go (first in both)
        else:
            for column in _NUMERIC_COLUMNS:
                out[:, _FEATURE_INDEX[column]] = _numeric(arrays[column], column)
        out[:, _FEATURE_INDEX["Amount"]] = _numeric(arrays["Amount"], "Amount", currency=True)
        out[:, _FEATURE_INDEX["Hour"]], out[:, _FEATURE_INDEX["Minute"]] = _hour_minute(arrays["Time"])
        errors = arrays["Errors?"]
        flags = self._errors.of_objects(errors) if errors.dtype.kind == "O" else None
        out[:, _FEATURE_INDEX["Errors?"]] = ~_is_missing(_as_bytes(errors, "Errors?")) if flags is None else flags
        for column, values in self._category_codes(arrays).items():
            out[:, _FEATURE_INDEX[column]] = values
        return out

    def _category_codes(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The six codes, the location rules applied. Raises for the first column, in
        ENCODED_COLUMNS order, whose values the rules refuse."""
        located = self._locations.codes(arrays)
        if located is not None:
            try:
                return {**located, **{column: self._lookup[column].ids(arrays[column]) for column in _UNLOCATED}}
            except FeatureInputError:
                pass  # below, column by column in their order: the error is the first column's
        return self._locate({column: self._lookup[column].ids(arrays[column]) for column in ENCODED_COLUMNS})

    def _locate(self, ids: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outcomes -> codes, the location rules applied (the columns with no flags keep theirs)."""
        city, state = self._lookup["Merchant City"], self._lookup["Merchant State"]
        online = city.outcome_flags[ids["Merchant City"]]
        domestic = state.outcome_flags[ids["Merchant State"]]
        codes = {**ids, "Merchant City": city.outcome_codes[ids["Merchant City"]]}
        codes["Merchant State"] = state.outcome_codes[ids["Merchant State"]]
        if online.any():
            domestic |= online
            codes["Merchant State"] = np.where(online, self._rule_codes["Merchant State", b"ONLINE"],
                                               codes["Merchant State"])
            codes["Zip"] = np.where(online, self._rule_codes["Zip", b"ONLINE"], codes["Zip"])
        if not domestic.all():
            codes["Zip"] = np.where(domestic, codes["Zip"], self._rule_codes["Zip", b"FOREIGN"])
        return codes


# --------------------------------------------------------------------------- small batches, as lists
# At a few rows numpy's fixed cost per call is the whole cost, and Python lists with dictionary
# look-ups are several times faster; per row they cost more, and past about 200 rows (measured:
# bench/bench_preprocessing.py) the whole-column path wins. The list path takes only plain
# values — the bytes or str Triton and DataFrames hand over, integer or float numbers, "HH:MM"
# times, amounts like "$-64.00" — and answers None for anything else, so that the column path,
# with its exact rules and error messages, decides every unusual row.
_ROW_PATH_MAX_ROWS = 160
# Whole columns are checked with one regular expression over their values joined by newlines;
# no value can hold a newline, so the pieces are the values. 300 digits cannot overflow a double.
_PLAIN_AMOUNTS = re.compile(rb"(?:\$?-?[0-9]{1,300}(?:\.[0-9]*)?\n)*")
_PLAIN_TIMES = re.compile(rb"(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]\n)*")
_TWO_ZEROS = 11 * ord("0")  # subtracted from 10 * tens + units of two ASCII digits
# an integer code already in canonical form (with TabFormer's ".0"): the rules leave it as it is
_CANONICAL_INTEGER = re.compile(rb"(?:-?[1-9][0-9]*|0)(?:\.0)?")
_MISSING_SET = frozenset(_MISSING.tolist())
# The numeric columns come first in RAW_INPUT_COLUMNS and in FEATURE_NAMES (a test checks).
_TEXT_COLUMNS = RAW_INPUT_COLUMNS[len(_NUMERIC_COLUMNS):]
_SHAPE, _KIND = attrgetter("shape"), attrgetter("dtype.kind")
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
        if set(map(type, values)) == {bytes}:  # Triton's BYTES tensors (a NUL is looked at later)
            return values
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


def _judge(lookup: _ColumnLookup, value: Any) -> int | None:
    """The outcome of one value not seen before, by the rules as the column path applies them;
    None where only the column path may judge it (not bytes, a NUL, not UTF-8)."""
    if type(value) is not bytes or b"\x00" in value:
        return None
    # the common new value, never seen and already canonical: its own canonical form, which the
    # classes lack, so unknown — no string processing at all
    if (_CANONICAL_INTEGER.fullmatch(value) if lookup.integer
            else value.isascii() and value and value.strip(_WHITESPACE) == value):
        canonical, code = value.removesuffix(b".0") if lookup.integer else value, lookup.unknown_code
    else:
        text = value.strip(_WHITESPACE)
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            return None
        canonical = _canonical_integer_one(text) if lookup.integer else text
        canonical = lookup.unknown if text in _MISSING_SET else canonical
        code = lookup.base.get(canonical, lookup.unknown_code)
    return code + lookup.width * ((canonical in lookup.flag_set) != bool(lookup.class_flags[code]))


def _fill(lookup: _ColumnLookup, values: list[Any], ids: list[int | None]) -> list[int] | None:
    """``ids`` (from ``lookup.seen``) with the values not seen yet judged and learned; None when
    one is not plain."""
    if None not in ids:
        return ids  # type: ignore[return-value]
    learned: dict[bytes, int] = {}
    for row, found in enumerate(ids):
        if found is None:
            value = values[row]
            found = learned.get(value)
            if found is None:
                found = _judge(lookup, value)
                if found is None:
                    return None
                learned[value] = found
            ids[row] = found
    lookup.learn(learned)
    return ids  # type: ignore[return-value]


class _RowPath:
    """:meth:`FeatureEncoder.transform` for a small batch of plain rows, as Python lists."""

    def __init__(self, encoder: FeatureEncoder) -> None:
        # each encoded column's lookup, and where its values are among the text columns
        self.encoded = [(encoder._lookup[column], _TEXT_COLUMNS.index(column)) for column in ENCODED_COLUMNS]
        self.errors = encoder._errors
        city, state = encoder._lookup["Merchant City"], encoder._lookup["Merchant State"]
        self.city_codes, self.city_online = city.outcome_codes.tolist(), city.outcome_flags.tolist()
        self.state_codes, self.state_domestic = state.outcome_codes.tolist(), state.outcome_flags.tolist()
        self.state_online = encoder._rule_codes["Merchant State", b"ONLINE"]
        self.zip_online = encoder._rule_codes["Zip", b"ONLINE"]
        self.zip_foreign = encoder._rule_codes["Zip", b"FOREIGN"]

    def transform_request(self, data: dict[str, Any]) -> np.ndarray | None:
        """A Triton request, ``[batch, 1]`` arrays: read straight into lists, with none of
        gather_columns' checks for other inputs (numpy's cost per call is most of the cost at
        these sizes); None when the request is not that."""
        try:
            arrays = [data[name] for name in RAW_INPUT_COLUMNS]
            rows = len(arrays[0])
            if (not 0 < rows <= _ROW_PATH_MAX_ROWS or set(map(_SHAPE, arrays)) != {(rows, 1)}
                    or set(map(_KIND, arrays[:len(_NUMERIC_COLUMNS)])) != {"f"}):
                return None
            if rows == 1:
                return self._one([array.item() for array in arrays])
            return self._features([array.ravel().tolist() for array in arrays])
        except (KeyError, TypeError, AttributeError):  # not arrays
            return None

    def transform(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Gathered columns of any kind; None when a value is not plain."""
        numbers = [arrays[name] for name in _NUMERIC_COLUMNS]
        if any(column.dtype.kind not in "iuf" for column in numbers):
            return None
        texts = [_plain_column(arrays[name]) for name in _TEXT_COLUMNS]
        if None in texts:
            return None
        # numbers as the column path converts them
        return self._features([column.astype(np.float64).tolist() for column in numbers] + texts)  # type: ignore[operator]

    def _features(self, columns: list[list[Any]]) -> np.ndarray | None:
        """The features from the columns' values in RAW_INPUT_COLUMNS order (the numbers Python
        floats), or None."""
        numbers, texts = columns[:len(_NUMERIC_COLUMNS)], columns[len(_NUMERIC_COLUMNS):]
        if not math.isfinite(sum(map(sum, numbers))):  # a sum of finite values may overflow: then
            return None  # the column path decides
        times, amounts, errors = texts[0], texts[1], texts[-1]
        if set(map(type, times + amounts)) != {bytes}:
            return None
        time_text, amount_text = b"\n".join(times) + b"\n", b"\n".join(amounts) + b"\n"
        if _PLAIN_TIMES.fullmatch(time_text) is None or _PLAIN_AMOUNTS.fullmatch(amount_text) is None:
            return None
        flags = self.errors.of_list(errors)
        ids = [list(map(lookup.seen.get, texts[at])) for lookup, at in self.encoded]
        if None in chain.from_iterable(ids):  # new values: the rules judge them
            for column, (lookup, at) in enumerate(self.encoded):
                if None in ids[column]:
                    ids[column] = _fill(lookup, texts[at], ids[column])  # type: ignore[assignment]
        if flags is None or None in ids:
            return None
        zip_codes, mcc_codes, name_codes, chip_codes, city_ids, state_ids = ids  # ENCODED_COLUMNS
        online = list(map(self.city_online.__getitem__, city_ids))  # type: ignore[arg-type]
        domestic = list(map(self.state_domestic.__getitem__, state_ids))  # type: ignore[arg-type]
        city_codes = list(map(self.city_codes.__getitem__, city_ids))  # type: ignore[arg-type]
        state_codes = list(map(self.state_codes.__getitem__, state_ids))  # type: ignore[arg-type]
        if True in online:
            state_codes = [self.state_online if on else code for on, code in zip(online, state_codes, strict=True)]
            zip_codes = [self.zip_online if on else code for on, code in zip(online, zip_codes, strict=True)]
            domestic = [on or inland for on, inland in zip(online, domestic, strict=True)]
        if False in domestic:
            zip_codes = [code if inland else self.zip_foreign for inland, code in zip(domestic, zip_codes, strict=True)]
        # In FEATURE_NAMES order. Python floats are doubles, so float32 rounds them as the column
        # path rounds its float64 values.
        out = np.array([
            *numbers, list(map(float, amount_text.replace(b"$", b"").split())), chip_codes, name_codes,
            city_codes, state_codes, zip_codes, mcc_codes, flags,
            [text[0] * 10 + text[1] - _TWO_ZEROS for text in times],
            [text[3] * 10 + text[4] - _TWO_ZEROS for text in times],
        ], dtype=np.float32).T
        return out if len(times) == 1 else np.ascontiguousarray(out)  # one row: contiguous already

    def _one(self, row: list[Any]) -> np.ndarray | None:
        """:meth:`_features` for a request of one row, the usual served request, value by value:
        at one row, making a list per column costs more than the rules."""
        user, card, year, month, day, time, amount = row[:7]
        if (not math.isfinite(user + card + year + month + day) or type(time) is not bytes
                or type(amount) is not bytes or _PLAIN_TIMES.fullmatch(time + b"\n") is None
                or _PLAIN_AMOUNTS.fullmatch(amount + b"\n") is None):
            return None
        texts = row[len(_NUMERIC_COLUMNS):]
        flag = self.errors.seen.get(texts[-1])
        ids = [lookup.seen.get(texts[at]) for lookup, at in self.encoded]
        if flag is None or None in ids:  # new values: judged as lists of one
            flags = self.errors.of_list(texts[-1:])
            found = [_fill(lookup, [texts[at]], [code]) for (lookup, at), code in zip(self.encoded, ids, strict=True)]
            if flags is None or None in found:
                return None
            flag, ids = flags[0], [codes[0] for codes in found]  # type: ignore[index]
        zip_code, mcc, name, chip, city, state = ids  # ENCODED_COLUMNS
        online, domestic = self.city_online[city], self.state_domestic[state]  # type: ignore[index]
        state = self.state_online if online else self.state_codes[state]  # type: ignore[index]
        zip_code = self.zip_online if online else zip_code if domestic else self.zip_foreign
        return np.array([[user, card, year, month, day, float(amount.replace(b"$", b"")), chip, name,
                          self.city_codes[city], state, zip_code, mcc, flag,  # type: ignore[index]
                          time[0] * 10 + time[1] - _TWO_ZEROS, time[3] * 10 + time[4] - _TWO_ZEROS]], dtype=np.float32)


def check_numeric_columns(arrays: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`FeatureInputError` for what :meth:`FeatureEncoder.transform` would refuse
    in the numeric columns (so a bad training frame fails before any fitting)."""
    for column in _NUMERIC_COLUMNS:
        _numeric(arrays[column], column)
    _numeric(arrays["Amount"], "Amount", currency=True)
    _hour_minute(arrays["Time"])
