"""Triton's system shared-memory extension: named regions of POSIX shared memory that clients
register, and that inference requests read their inputs from and write their outputs into.

A client creates a POSIX shared-memory object (``tritonclient.utils.shared_memory``: the file
``/dev/shm/<key>``), writes its input tensors there, and registers a window of it —
``(name, key, offset, byte_size)`` — with the server. A request then names the region, an offset
inside the window and a byte size per input (``shared_memory_region``, ``shared_memory_offset``,
``shared_memory_byte_size`` in the tensor's parameters) instead of sending the data; a requested
output with the same parameters is written into its region and answered with its metadata only.

What follows Triton (``src/shared_memory_manager.cc``): the error texts, the bounds rules
(offsets in a request are relative to the registered window), unregistering a name that is not
registered succeeding quietly, and a region in use by requests being unmapped only once they are
done (Triton since 2.52; 2.51 refused such an unregister). What differs: a registered offset need
not be a multiple of the page size (Triton's ``mmap`` refuses one), and a key that cannot be
opened is a client error (400 / INVALID_ARGUMENT) where Triton answers 500 / INTERNAL. CUDA
shared memory is answered as a Triton built without GPU support answers it (nothing is ever
registered; registering fails and says why).

Thread-safety: one lock guards the registry; requests hold a :class:`SharedMemoryLease`, which
keeps the regions it uses mapped until it is released, so an unregister never unmaps memory a
request is still copying from or into.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.server.frontends.protocol import array_from_buffer, array_to_buffer
from triton_nb.tensors import DATATYPES

__all__ = [
    "SHM_PARAMETERS",
    "AlreadyExistsError",
    "SharedMemoryLease",
    "SharedMemoryRegistry",
    "TensorRegion",
    "registry_of",
]

# The tensor parameters that place a tensor in shared memory; neither the server nor the model
# acts on them otherwise, so the front ends keep them out of the request's parameters.
SHM_PARAMETERS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")

# Where Linux keeps POSIX shared-memory objects (what shm_open opens).
_SHM_DIR = Path("/dev/shm")


class AlreadyExistsError(InvalidArgumentError):
    """A region name that is registered already: 400 over HTTP, ALREADY_EXISTS over gRPC (Triton's codes)."""

    grpc_code = "ALREADY_EXISTS"


@dataclass(frozen=True)
class TensorRegion:
    """Where one tensor of a request lives: a window of a registered region."""

    region: str
    offset_bytes: int
    byte_size: int


class _Region:
    """One registered window of a shared-memory object, mapped into this process."""

    __slots__ = ("_fd", "_map", "_start", "byte_size", "key", "name", "offset", "retired", "users")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, start: int,
                 fd: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._map = mapping
        self._start = start  # where the registered window begins in the mapping (page alignment)
        self._fd = fd  # kept to see the object shrink (see check_size)
        self.users = 0  # leases holding it; guarded by the registry's lock
        self.retired = False  # unregistered while in use: unmapped when the last lease lets go

    def read(self, offset: int, size: int) -> bytes:
        begin = self._start + offset
        return self._map[begin:begin + size]

    def write(self, offset: int, data: bytes) -> None:
        begin = self._start + offset
        self._map[begin:begin + len(data)] = data

    def check_size(self) -> None:
        """Refuse a window the object no longer covers: touching mapped pages past the end of a
        shared-memory object that its owner truncated kills this process with SIGBUS."""
        size_bytes = os.fstat(self._fd).st_size
        if size_bytes < self.offset + self.byte_size:
            raise InvalidArgumentError(
                f"shared memory region '{self.name}': its object '{self.key}' shrank to {size_bytes} bytes, "
                f"short of the registered offset {self.offset} + byte size {self.byte_size}")

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


def _open_key(key: str) -> int:
    """The file descriptor of the POSIX shared-memory object ``key`` (``shm_open``'s naming: one
    leading slash, no other). Only objects under /dev/shm can be reached: a key is never a path."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidArgumentError(f"Unable to open shared memory region: '{key}'")
    try:
        return os.open(_SHM_DIR / name, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        raise InvalidArgumentError(f"Unable to open shared memory region: '{key}'") from None


class SharedMemoryRegistry:
    """The regions one server knows, by name (Triton's ``SharedMemoryManager``, system memory)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, _Region] = {}

    # ------------------------------------------------------------------ the extension's calls
    def register(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """Map ``byte_size`` bytes of the shared-memory object ``key`` from ``offset`` as ``name``."""
        for what, value in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(
                    f"failed to register shared memory region '{name}': {what} must be a whole number >= 0, "
                    f"got {value!r}")
        if not isinstance(key, str):
            raise InvalidArgumentError(f"failed to register shared memory region '{name}': key must be a string")
        with self._lock:
            if name in self._regions:
                raise AlreadyExistsError(f"shared memory region '{name}' already in manager")
            fd = _open_key(key)
            try:  # the descriptor stays open with the region (see _Region.check_size)
                size_bytes = os.fstat(fd).st_size
                # an empty window cannot be mapped (Triton's mmap fails on it too)
                if byte_size == 0 or offset + byte_size > size_bytes:
                    raise InvalidArgumentError(f"failed to register shared memory region '{name}': invalid args")
                start = offset % mmap.ALLOCATIONGRANULARITY  # mmap's offset must be page-aligned
                try:
                    mapping = mmap.mmap(fd, byte_size + start, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                        offset=offset - start)
                except (OSError, ValueError) as exc:
                    raise InvalidArgumentError(
                        f"failed to register shared memory region '{name}': unable to map '{key}': {exc}") from None
            except BaseException:
                os.close(fd)
                raise
            self._regions[name] = _Region(name, key, offset, byte_size, mapping, start, fd)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """Triton's status JSON of one region (``name``) or of all (``""``)."""
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is None:
                    raise NotFoundError(f"Unable to find system shared memory region: '{name}'")
                regions = [region]
            else:
                regions = list(self._regions.values())
            return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]

    def unregister(self, name: str = "") -> None:
        """Forget one region (``name``) or all (``""``); a name not registered is no error, as in Triton."""
        with self._lock:
            names = [name] if name else list(self._regions)
            for each in names:
                region = self._regions.pop(each, None)
                if region is None:
                    continue
                if region.users:
                    region.retired = True  # the last lease unmaps it
                else:
                    region.close()

    def close(self) -> None:
        """Unregister every region (the server stops); one a request still holds (a front end that
        did not stop in time) is unmapped when that request lets go."""
        self.unregister()

    # CUDA shared memory: as Triton built without GPU support answers it.
    @staticmethod
    def cuda_status(name: str = "") -> list[dict[str, Any]]:
        if name:
            raise NotFoundError(f"Unable to find cuda shared memory region: '{name}'")
        return []

    @staticmethod
    def cuda_register(name: str) -> None:
        if not name:
            raise InvalidArgumentError("'region name' is necessary to register cuda shared memory region")
        raise InvalidArgumentError(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")

    @staticmethod
    def cuda_unregister(name: str = "") -> None:
        """Nothing is ever registered, so there is nothing to forget (success, as in Triton)."""

    # ------------------------------------------------------------------ requests
    def lease(self) -> SharedMemoryLease:
        return SharedMemoryLease(self)

    def _acquire(self, place: TensorRegion) -> _Region:
        name, offset, size = place.region, place.offset_bytes, place.byte_size
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise NotFoundError(f"Unable to find shared memory region: '{name}'")
            if offset < 0 or offset >= region.byte_size:
                raise InvalidArgumentError(f"Invalid offset for shared memory region: '{name}'")
            # a size of 0 is refused as Triton 2.51 refuses it (its end check underflows)
            if size <= 0 or offset + size > region.byte_size:
                raise InvalidArgumentError(f"Invalid offset + byte size for shared memory region: '{name}'")
            region.check_size()
            region.users += 1
            return region

    def _release(self, region: _Region) -> None:
        with self._lock:
            region.users -= 1
            if region.users == 0 and region.retired:
                region.close()


@dataclass
class SharedMemoryLease:
    """The regions one request reads and writes, held mapped from decoding to its last response."""

    registry: SharedMemoryRegistry
    outputs: dict[str, tuple[TensorRegion, _Region]] = field(default_factory=dict)
    _held: list[_Region] = field(default_factory=list)
    _released: bool = False

    def _acquire(self, place: TensorRegion) -> _Region:
        region = self.registry._acquire(place)
        self._held.append(region)
        return region

    def read_input(self, model: str, tensor: str, datatype: Any, shape: tuple[int, ...],
                   place: TensorRegion) -> np.ndarray:
        """The input's tensor, copied out of its region: the client may reuse the region as soon as
        the response arrives, while a batch or the response cache could still hold the array, so
        the model never sees a view of memory another process writes."""
        region = self._acquire(place)
        dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
        if dtype is not None and dtype.kind != "O":
            count = 1
            for dim in shape:
                count *= dim
            expected = count * dtype.itemsize
            if place.byte_size != expected:
                raise InvalidArgumentError(f"input byte size mismatch for input '{tensor}' for model '{model}'. "
                                           f"Expected {expected}, got {place.byte_size}")
        return array_from_buffer(model, tensor, datatype, shape, region.read(place.offset_bytes, place.byte_size))

    def bind_output(self, output: str, place: TensorRegion) -> None:
        """Check the output's region now, as Triton does before running the model."""
        self.outputs[output] = (place, self._acquire(place))

    def write_output(self, output: str, array: np.ndarray) -> None:
        """Write an output's raw bytes (BYTES length-prefixed) at the start of its window."""
        place, region = self.outputs[output]
        data = array_to_buffer(array)
        if len(data) > place.byte_size:
            raise InvalidArgumentError(
                f"shared memory size specified with the request for output '{output}' ({place.byte_size} bytes) "
                f"should be at least {len(data)} bytes to hold the results")
        region.write(place.offset_bytes, data)

    def release(self) -> None:
        """Let go of every region (idempotent)."""
        if self._released:
            return
        self._released = True
        for region in self._held:
            self.registry._release(region)
        self._held.clear()


_FALLBACK: weakref.WeakKeyDictionary[Any, SharedMemoryRegistry] = weakref.WeakKeyDictionary()
_FALLBACK_LOCK = threading.Lock()


def registry_of(server: Any) -> SharedMemoryRegistry:
    """The registry of a server: its ``shared_memory`` attribute, or for a service without one
    (a test double), one kept per service object, so that its HTTP and gRPC front ends share it."""
    registry = getattr(server, "shared_memory", None)
    if isinstance(registry, SharedMemoryRegistry):
        return registry
    with _FALLBACK_LOCK:
        registry = _FALLBACK.get(server)
        if registry is None:
            registry = _FALLBACK[server] = SharedMemoryRegistry()
        return registry
