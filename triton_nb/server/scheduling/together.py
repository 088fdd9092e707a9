"""Running what a group of answers or requests sets off once the whole group is through.

While a batch's responses are handed out, each response's done-callback may set off more work
(an ensemble's next step). :func:`after_batch` lets such a callback ask for that work to run once
the whole batch is answered, so that what one batch readies is submitted together (and may be
carried as one request). :class:`Together` marks the group: the batcher holds it while it answers
a batch, the server while it takes a burst of requests a front end read at once
(``Server.infer_together``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Together", "after_batch"]

log = logging.getLogger(__name__)

# The callbacks to run once the batch this thread is answering is answered (None: not answering).
_answering = threading.local()


def after_batch(callback: Callable[[], None]) -> bool:
    """From a response future's done-callback: run ``callback`` on this thread once every request
    of the batch being answered has its response (once, however often it is asked for), and return
    True; outside the answering of a batch, return False and do nothing. This lets what the
    responses of one batch set off (an ensemble's next steps) be submitted together."""
    waiting = getattr(_answering, "callbacks", None)
    if waiting is None:
        return False
    if callback not in waiting:
        waiting.append(callback)
    return True


class Together:
    """``with Together(what):`` on one thread: what :func:`after_batch` is asked for inside the block
    runs once the block ends (nested blocks keep their own). Held while a batch is answered, and by
    the server while it takes a burst of requests a front end received at once
    (``Server.infer_together``): an ensemble's requests that start together reach its first model
    as one carried request."""

    __slots__ = ("_outer", "_what")

    def __init__(self, what: str) -> None:
        self._what = what
        self._outer: list[Callable[[], None]] | None = None

    def __enter__(self) -> None:
        self._outer = getattr(_answering, "callbacks", None)
        _answering.callbacks = []

    def __exit__(self, *exc_info: object) -> None:
        callbacks, _answering.callbacks = _answering.callbacks, self._outer
        for callback in callbacks:
            try:
                callback()
            except Exception:  # what a response set off must not cost the thread (a worker) its life
                log.exception("%s: a callback after them failed", self._what)
