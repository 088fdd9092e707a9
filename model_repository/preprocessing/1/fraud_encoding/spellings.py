"""The spellings met so far: raw value -> outcome tables that learn each value the rules judge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .columns import _INTEGER_CODE_COLUMNS, FeatureInputError
from .text import _MISSING, _MISSING_SET, _WHITESPACE, _already_canonical, _as_bytes, _canonical_bytes, _in_sorted, _str

# A category value is looked up in a dictionary of raw spellings: at first the classes and the
# spellings that canonicalise to them, then also each value the rules have judged, so that a
# value is canonicalised once and not on every request that carries it. The dictionary learns
# at most this many values beyond its first ones, then starts over from those: a bound on its
# memory, not a policy worth tuning (real traffic repeats its merchants, cities and zips).
_LEARNED_LIMIT = 1 << 16


class _Seen(dict):
    """A spellings table whose ``[]`` answers -1 for a value it lacks: ``map(table.__getitem__,
    values)`` then runs in C from end to end (``map(table.get, values, repeat(-1))`` costs a
    tenth more, in the passes that are most of a large batch's time)."""

    def __missing__(self, key: Any) -> int:
        return -1


class _Spellings:
    """Raw spelling -> answer: ``base`` fixed at load, ``seen`` that and what was learned since.
    Dictionary reads and updates are atomic under the GIL: transforms on several threads at once
    at worst judge a value twice."""

    def __init__(self, base: dict[bytes, Any]) -> None:
        self.base = base
        self.seen = _Seen(base)

    def learn(self, learned: Mapping[bytes, Any]) -> None:
        if len(self.seen) + len(learned) > len(self.base) + _LEARNED_LIMIT:
            self.forget()
        self.seen.update(learned)

    def forget(self) -> None:
        """Back to the first spellings, as if no value had been judged yet."""
        self.seen = _Seen(self.base)


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
            ids = np.fromiter(map(self.seen.__getitem__, values), dtype=np.intp, count=len(values))
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
