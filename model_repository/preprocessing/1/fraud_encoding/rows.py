"""Small batches as Python lists: the same rules as the whole-column path, where numpy's cost
per call would be the whole cost."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from .columns import _NUMERIC_COLUMNS, ENCODED_COLUMNS, RAW_INPUT_COLUMNS
from .spellings import _ColumnLookup, _ErrorFlags
from .text import _MISSING_SET, _WHITESPACE

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
# The numeric columns come first in RAW_INPUT_COLUMNS and in FEATURE_NAMES (a test checks).
_TEXT_COLUMNS = RAW_INPUT_COLUMNS[len(_NUMERIC_COLUMNS):]
_SHAPE, _KIND = attrgetter("shape"), attrgetter("dtype.kind")


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

    def __init__(self, lookup: Mapping[str, _ColumnLookup], errors: _ErrorFlags,
                 rule_codes: Mapping[tuple[str, bytes], int]) -> None:
        """``lookup``, ``errors`` and ``rule_codes``: the encoder's own, shared with its column path."""
        # each encoded column's lookup, and where its values are among the text columns
        self.encoded = [(lookup[column], _TEXT_COLUMNS.index(column)) for column in ENCODED_COLUMNS]
        self.errors = errors
        city, state = lookup["Merchant City"], lookup["Merchant State"]
        self.city_codes, self.city_online = city.outcome_codes.tolist(), city.outcome_flags.tolist()
        self.state_codes, self.state_domestic = state.outcome_codes.tolist(), state.outcome_flags.tolist()
        self.state_online = rule_codes["Merchant State", b"ONLINE"]
        self.zip_online = rule_codes["Zip", b"ONLINE"]
        self.zip_foreign = rule_codes["Zip", b"FOREIGN"]

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
