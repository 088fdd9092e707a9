"""A lock for the per-request path, where several threads that share the GIL take it in turn.

Why not a plain ``threading.Lock``: when thread X is made to give up the GIL while it holds the
lock (the interpreter takes the GIL from a thread every ``sys.getswitchinterval()``, 5 ms) and
thread Y then blocks on the lock, X's release hands the lock to Y, which is asleep and must win
the GIL back before it can run. X, still running, comes back for the lock (the next request),
finds it owned by Y and sleeps in turn; Y runs, releases, hands the lock to X ... From then on,
every acquisition costs two thread switches, for as long as both threads keep coming back: a lock
convoy. Two model instances answering batches at once, each answer sending the next request of a
closed loop (the load generator, a client's callbacks), do exactly that, and measured 2.7 times
fewer requests a second than one instance.

:class:`YieldingLock` never lets a sleeping thread own it: a thread that finds it taken gives the
GIL away (``time.sleep(0)``) so that the holder can finish and release, and tries again. The
uncontended case costs one extra Python call. A holder that keeps the lock for long (it waits on
something inside) is waited for in the ordinary blocking way after a few tries.

Measured again 2026-12-07 (the fraud ensemble's Python twin in process, 2 instances of each step,
alternated runs): the batcher's lock as a plain ``RLock`` served 0.84x / 0.88x the requests a
second at 16 / 64 in flight. Where the interpreter runs without a GIL (free-threaded CPython),
there is no GIL to yield and ``RLock``'s internals are not ours to rely on: :class:`YieldingLock`
then gives the plain lock.

Only the standard library is used.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

__all__ = ["YieldingLock"]

# Tries (each after yielding the GIL) before a contended acquire blocks: a holder that lost the
# GIL inside its section needs one; more means it is waiting on something else.
_YIELDS = 16
# False on a free-threaded interpreter running without its GIL (sys._is_gil_enabled, 3.13+)
_GIL_ENABLED: bool = getattr(sys, "_is_gil_enabled", lambda: True)()


class YieldingLock:
    """A ``threading.Lock`` (or, with ``reentrant``, ``RLock``) that a contended acquire waits
    for by yielding the GIL rather than by queueing on it (see the module docstring). Usable
    with ``with`` and as the lock of a ``threading.Condition``."""

    __slots__ = ("_acquire_restore", "_is_owned", "_lock", "_release_save", "_try", "release")

    def __new__(cls, reentrant: bool = False) -> Any:
        if not _GIL_ENABLED:  # no GIL to yield: the plain lock (see the module docstring)
            return threading.RLock() if reentrant else threading.Lock()
        return super().__new__(cls)

    def __init__(self, reentrant: bool = False) -> None:
        lock: Any = threading.RLock() if reentrant else threading.Lock()
        self._lock = lock
        self._try = lock.acquire
        self.release = lock.release
        if reentrant:  # what a Condition over a reentrant lock needs to wait with it held
            self._is_owned = lock._is_owned
            self._release_save = lock._release_save
            self._acquire_restore = lock._acquire_restore

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._try(False):
            return True
        if not blocking:
            return False
        if timeout < 0:
            for _ in range(_YIELDS):
                time.sleep(0)  # lets the holder (waiting for the GIL, likely) run and release
                if self._try(False):
                    return True
        return self._try(True, timeout)

    def __enter__(self) -> bool:
        if self._try(False):
            return True
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
