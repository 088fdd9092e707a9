"""The estimator, :class:`FeatureEncoder`: raw transactions -> features, for fixed encoder classes."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np

from .columns import (
    _FEATURE_INDEX,
    _NUMERIC_COLUMNS,
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    RAW_INPUT_COLUMNS,
    UNKNOWN,
    FeatureInputError,
    gather_columns,
)
from .numeric import _hour_minute, _numeric
from .rows import _KIND, _ROW_PATH_MAX_ROWS, _RowPath
from .spellings import _ColumnLookup, _ErrorFlags, _Spellings
from .text import _US_OR_ONLINE, _as_bytes, _is_missing

# The canonical texts that raise the location rules' flags, per column (see _ColumnLookup).
_FLAG_TEXTS = {"Merchant City": (b"ONLINE",), "Merchant State": tuple(_US_OR_ONLINE.tolist())}

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
            packed = np.fromiter(map(self.seen.__getitem__, zip(*values, strict=True)), dtype=np.int64,
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
        self._rows = _RowPath(self._lookup, self._errors, self._rule_codes)

    def _forget(self) -> None:
        """Back to the spellings known at load, as if no value had been judged yet."""
        for spellings in (*self._lookup.values(), self._errors, self._locations):
            spellings.forget()

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
