"""Category values as UTF-8 bytes: missing spellings, canonical forms and the location rules.

Category values are handled as UTF-8 byte strings (numpy ``S`` arrays): Triton delivers BYTES
tensors that way, so the serving path never decodes, and UTF-8 preserves code-point order, so
byte-sorted classes are in the same order as the sorted strings the encoders store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .columns import _INTEGER_CODE_COLUMNS, ENCODED_COLUMNS, UNKNOWN, US_STATE_CODES, FeatureInputError, gather_columns

# numpy >= 2 has fast string ufuncs in numpy.strings. Triton's Python backend (24.x and the
# stub in nvidia-pytriton) is built against numpy 1.x and corrupts tensors under numpy 2, so a
# Triton image has numpy 1.x, where numpy.char offers the same functions.
_str = getattr(np, "strings", None) or np.char


def _partition(values: np.ndarray, separator: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts = _str.partition(values, separator)
    if isinstance(parts, tuple):  # numpy.strings
        return parts
    return parts[..., 0], parts[..., 1], parts[..., 2]  # numpy.char stacks the parts


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
_MISSING_SET = frozenset(_MISSING.tolist())
_US_OR_ONLINE = np.array(sorted(code.encode() for code in US_STATE_CODES | {"ONLINE"}), dtype="S")
_WHITESPACE = b" \t\n\r\x0b\x0c"


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
