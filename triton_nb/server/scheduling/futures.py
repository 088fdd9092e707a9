"""``ResponseFuture``: a ``concurrent.futures.Future`` that costs little until someone waits on it.

Every request the server accepts gets a future, and an ensemble request one more per step: three
per fraud transaction. The standard ``Future`` builds a ``threading.Condition`` (a Python-level
object around an ``RLock``) in its constructor, about a tenth of the server's time per request at
64 in flight. Most of these futures are never waited on: ensemble steps, the load generator and
the asyncio front ends only add callbacks. ``ResponseFuture`` guards its state with a plain
``threading.Lock`` and builds the condition only when ``concurrent.futures.wait`` or
``as_completed`` asks for it. A caller blocking in :meth:`result` or :meth:`exception` does not
need one either: it waits on a lock of its own that the future releases when it is done, the few
steps of ``Condition.wait`` and ``notify_all`` done in place (64 threads each waiting on their
request: +5-7% requests/s, measured side by side).

It *is* a ``Future`` (``asyncio.wrap_future`` and ``concurrent.futures.wait`` accept it) and keeps
the whole contract: callbacks run once, in the thread that resolves it (or at once when added to
a finished future); a second ``set_result`` raises ``InvalidStateError``; ``cancel`` succeeds only
while pending.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

__all__ = ["ResponseFuture"]

log = logging.getLogger(__name__)

_PENDING, _RUNNING, _CANCELLED, _CANCELLED_AND_NOTIFIED, _FINISHED = (
    "PENDING", "RUNNING", "CANCELLED", "CANCELLED_AND_NOTIFIED", "FINISHED")
_DONE = frozenset((_CANCELLED, _CANCELLED_AND_NOTIFIED, _FINISHED))
# Taken only to create a future's condition, never while a future's own lock is wanted after it:
# the order is always (future lock ->) creation lock, so the two cannot deadlock.
_CONDITION_CREATION = threading.Lock()


class ResponseFuture(Future):
    """A ``Future`` whose condition is created on first wait (see the module docstring)."""

    def __init__(self) -> None:  # the base constructor is skipped on purpose: it builds the condition
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None
        self._blocked: list[Any] | None = None  # one held lock per caller blocked in result()
        self._state = _PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []  # concurrent.futures.wait's waiters
        self._done_callbacks: list[Callable[[Future], object]] = []

    # The standard library's wait() and as_completed() take ``_condition`` directly.
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        with _CONDITION_CREATION:
            if self._cond is None:
                self._cond = threading.Condition(self._lock)
            return self._cond

    def _notify(self) -> None:  # under _lock
        if self._cond is not None:
            self._cond.notify_all()
        if self._blocked:
            for waiter in self._blocked:
                waiter.release()
            self._blocked = None

    def __repr__(self) -> str:  # lock-free: it is called from inside the locked methods' errors
        state = self._state
        if state == _FINISHED:
            what = f"raised {type(self._exception).__name__}" if self._exception else \
                f"returned {type(self._result).__name__}"
            return f"<{type(self).__name__} at {id(self):#x} state=finished {what}>"
        return f"<{type(self).__name__} at {id(self):#x} state={state.lower()}>"

    # ------------------------------------------------------------------ state
    def cancel(self) -> bool:
        with self._lock:
            if self._state in (_RUNNING, _FINISHED):
                return False
            if self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED):
                return True
            self._state = _CANCELLED
            self._notify()
        self._invoke_callbacks()
        return True

    def cancelled(self) -> bool:
        return self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED)

    def running(self) -> bool:
        return self._state == _RUNNING

    def done(self) -> bool:
        return self._state in _DONE

    def set_running_or_notify_cancel(self) -> bool:
        with self._lock:
            if self._state == _CANCELLED:
                self._state = _CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if self._state == _PENDING:
                self._state = _RUNNING
                return True
            raise InvalidStateError(f"future in unexpected state: {self._state}")

    def set_result(self, result: Any) -> None:
        with self._lock:
            if self._state in _DONE:
                raise InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._state = _FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
            self._notify()
        self._invoke_callbacks()

    def set_exception(self, exception: BaseException | None) -> None:
        with self._lock:
            if self._state in _DONE:
                raise InvalidStateError(f"{self._state}: {self!r}")
            self._exception = exception
            self._state = _FINISHED
            for waiter in self._waiters:
                waiter.add_exception(self)
            self._notify()
        self._invoke_callbacks()

    # ------------------------------------------------------------------ waiting
    def _wait(self, timeout: float | None) -> None:  # under _lock; returns done or raises the timeout
        if self._state in _DONE:
            return
        waiter = threading.Lock()
        waiter.acquire()
        if self._blocked is None:
            self._blocked = []
        self._blocked.append(waiter)
        self._lock.release()
        try:  # _notify releases it; -1 is the lock's own "no timeout"
            woken = waiter.acquire(True, -1 if timeout is None else max(0.0, timeout))
        finally:
            self._lock.acquire()
        if not woken and self._blocked is not None and waiter in self._blocked:
            self._blocked.remove(waiter)  # timed out: _notify must not release it later
        if self._state not in _DONE:
            raise FutureTimeoutError()

    def result(self, timeout: float | None = None) -> Any:
        with self._lock:
            self._wait(timeout)
            if self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED):
                raise CancelledError()
            if self._exception is not None:
                raise self._exception
            return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        with self._lock:
            self._wait(timeout)
            if self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED):
                raise CancelledError()
            return self._exception

    # ------------------------------------------------------------------ callbacks
    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        with self._lock:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            log.exception("exception calling callback for %r", self)

    def _invoke_callbacks(self) -> None:
        callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("exception calling callback for %r", self)
