"""Tensors between the server and a Python model's own process, in shared memory.

Each side of a process instance owns one *arena*: a POSIX shared-memory file (``/dev/shm``) that
it alone writes — the server the batch's inputs, the model's process the batch's outputs — and the
other side maps read-only. An arena is reused batch after batch and replaced by a larger one (a new
name) when a batch does not fit, so the steady state costs no system call beyond the copy.
Tensors are laid out one after another, 64-byte aligned; a message (pickled metadata, small) names
the arena and each tensor's ``(name, datatype, shape, offset, nbytes)``. BYTES tensors travel in
Triton's serialized layout: each element a 4-byte little-endian length, then its bytes.

Only the standard library and numpy are used here (and the wire codec's BYTES functions, which
need no more): the model's process may run another interpreter (``EXECUTION_ENV_PATH``) that has
nothing else.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from triton_nb.tensors import deserialize_bytes, serialize_bytes  # the wire's BYTES layout

__all__ = ["ArenaReader", "ArenaWriter", "TensorSpec", "pack_batch", "remove_arenas", "unpack_batch"]

_ALIGN = 64
_SHM_DIR = "/dev/shm"
_MIN_BYTES = 1 << 20  # 1 MiB, Triton's default shm-default-byte-size for the Python backend

#: name, numpy dtype string ("object" for BYTES), shape, offset, nbytes
TensorSpec = tuple[str, str, tuple[int, ...], int, int]


def pack_batch(tensors_per_request: list[dict[str, np.ndarray]]) -> tuple[list[tuple[str, np.ndarray]], list]:
    """The tensors of a batch's requests, laid out for one write: each name's tensors joined
    along the batch dimension when they can be (the dynamic batcher's requests usually can), so
    that a batch of 64 one-row requests is 14 copies, not 896; and the plan that splits them back."""
    first_names = tensors_per_request[0].keys()
    if all(tensors.keys() == first_names for tensors in tensors_per_request):
        names: Any = first_names  # the usual case: every request has the same inputs
        same_names = True
    else:
        names = {}
        for tensors in tensors_per_request:
            names.update(dict.fromkeys(tensors))
        same_names = False
    laid_out: list[tuple[str, np.ndarray]] = []
    plan: list[tuple[str, list[int] | None]] = []
    for name in names:
        # (map with itemgetter: the per-request loop runs in C; it is per name and request)
        arrays = list(map(itemgetter(name), tensors_per_request)) if same_names else [
            tensors.get(name) for tensors in tensors_per_request]
        joined = _join(arrays)
        if joined is not None:
            laid_out.append((f"b:{name}", joined))
            plan.append((name, list(map(len, arrays))))
        else:
            laid_out.extend((f"r{i}:{name}", a) for i, a in enumerate(arrays) if a is not None)
            plan.append((name, None))
    return laid_out, plan


def _join(arrays: list[np.ndarray | None]) -> np.ndarray | None:
    """The arrays joined along the batch dimension, or None when they cannot be (one missing, a
    scalar, different data types or non-batch shapes): numpy checks the shapes, the dtypes are
    checked here, since concatenate would convert them rather than refuse."""
    first = arrays[0]
    if first is None or first.ndim == 0:
        return None
    if len(arrays) == 1:
        return first
    try:
        if len(set(map(_dtype, arrays))) != 1:
            return None
    except AttributeError:  # a request without this tensor (``in`` would compare arrays with None)
        return None
    try:
        return np.concatenate(arrays)  # type: ignore[arg-type]
    except ValueError:  # different non-batch shapes (or a scalar among them)
        return None


_dtype = attrgetter("dtype")


def unpack_batch(read: dict[str, np.ndarray], plan: list, count: int) -> list[dict[str, np.ndarray]]:
    """The per-request tensors :func:`pack_batch` laid out (views of the arrays read)."""
    out: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    for name, rows in plan:
        if rows is None:
            for i in range(count):
                array = read.get(f"r{i}:{name}")
                if array is not None:
                    out[i][name] = array
            continue
        whole = read[f"b:{name}"]
        if count == 1:
            out[0][name] = whole
            continue
        if len(whole) == count:  # one row each, the usual case: the views in one C loop
            for tensors, view in zip(out, whole[:, None], strict=True):
                tensors[name] = view
            continue
        start = 0
        for i, n in enumerate(rows):
            out[i][name] = whole[start:start + n]
            start += n
    return out


class ArenaWriter:
    """The arena one side writes; ``prefix`` makes its file names unique to this side, and
    ``min_bytes`` is its first size (the Python backend's ``shm-default-byte-size``)."""

    def __init__(self, prefix: str, min_bytes: int = _MIN_BYTES) -> None:
        self._prefix = prefix
        self._min_bytes = min_bytes
        self._generation = 0
        self.name = ""
        self.size = 0
        self._map: mmap.mmap | None = None

    def _ensure(self, needed: int) -> None:
        if self._map is not None and needed <= self.size:
            return
        self.close()
        size = max(self._min_bytes, 1 << max(needed - 1, 1).bit_length())  # powers of two: few replacements
        self._generation += 1
        name = f"{self._prefix}_{self._generation}"
        fd = os.open(os.path.join(_SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.name, self.size = name, size

    def write(self, tensors: list[tuple[str, np.ndarray]]) -> list[TensorSpec]:
        """Lay ``tensors`` out in the arena (replacing it by a larger one if needed); their specs."""
        blobs: list[tuple[str, str, tuple[int, ...], Any]] = []
        total = 0
        for name, array in tensors:
            if array.dtype == np.object_ or array.dtype.kind in "SU":
                blob: Any = serialize_bytes(np.asarray(array, dtype=object))
                dtype = "object"
                nbytes = len(blob)
            else:
                blob = np.ascontiguousarray(array)
                dtype = blob.dtype.str
                nbytes = blob.nbytes
            blobs.append((name, dtype, tuple(array.shape), blob))
            total += -(-nbytes // _ALIGN) * _ALIGN
        self._ensure(total)
        assert self._map is not None
        specs: list[TensorSpec] = []
        offset = 0
        view = memoryview(self._map)
        try:
            for name, dtype, shape, blob in blobs:
                data = blob if dtype == "object" else blob.reshape(-1).view(np.uint8)  # raw bytes, any shape
                nbytes = len(data)
                view[offset:offset + nbytes] = data
                specs.append((name, dtype, shape, offset, nbytes))
                offset += -(-nbytes // _ALIGN) * _ALIGN
        finally:
            view.release()
        return specs

    def close(self) -> None:
        """Unmap and remove the current file (the reader keeps its mapping until it replaces it)."""
        if self._map is not None:
            self._map.close()
            self._map = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(_SHM_DIR, self.name))


class ArenaReader:
    """The other side's arena, mapped once per name."""

    def __init__(self) -> None:
        self._name = ""
        self._map: mmap.mmap | None = None

    def read(self, arena: str, specs: list[TensorSpec]) -> dict[str, np.ndarray]:
        """Copies of the tensors ``specs`` names (the arena is rewritten by the next batch)."""
        if arena != self._name:
            self.close()
            fd = os.open(os.path.join(_SHM_DIR, arena), os.O_RDONLY)
            try:
                self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._name = arena
        assert self._map is not None
        out: dict[str, np.ndarray] = {}
        for name, dtype, shape, offset, nbytes in specs:
            if dtype == "object":
                out[name] = deserialize_bytes("", name, self._map[offset:offset + nbytes],
                                              math.prod(shape)).reshape(shape)
            else:
                numpy_type = np.dtype(dtype)
                # copied out: the writer reuses the arena for its next batch
                out[name] = np.frombuffer(self._map, dtype=numpy_type, count=nbytes // numpy_type.itemsize,
                                          offset=offset).reshape(shape).copy()
        return out

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
            self._name = ""


def remove_arenas(prefix: str) -> None:
    """Remove every arena file of ``prefix`` (what a killed process could not remove itself)."""
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix + "_"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(_SHM_DIR, name))
