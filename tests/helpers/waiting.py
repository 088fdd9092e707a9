"""Waiting in the server's tests for what happens on the server's own threads: for the event
itself, never a fixed pause (a loaded machine makes any pause too short)."""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT_S = 60.0  # the longest any wait may take: it only keeps a broken server from hanging the suite


def wait_until(condition: Callable[[], object], what: str, *, timeout_s: float = WAIT_S,
               pause: Callable[[float], None] = time.sleep, every_s: float = 0.01) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` after ``timeout_s``. ``pause``: how
    to wait between tries (``gevent.sleep`` where the waiter must let gevent's loop run)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout_s:g} s waiting for {what}"
        pause(every_s)
