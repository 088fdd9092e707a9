"""The numeric columns: numbers, TabFormer amounts (``"$-64.00"``) and ``"HH:MM"`` times."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .columns import _NUMERIC_COLUMNS, FeatureInputError
from .text import _as_bytes, _is_missing, _partition, _str


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


def check_numeric_columns(arrays: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`FeatureInputError` for what :meth:`FeatureEncoder.transform` would refuse
    in the numeric columns (so a bad training frame fails before any fitting)."""
    for column in _NUMERIC_COLUMNS:
        _numeric(arrays[column], column)
    _numeric(arrays["Amount"], "Amount", currency=True)
    _hour_minute(arrays["Time"])
