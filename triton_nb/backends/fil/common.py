"""What every part of the FIL backend shares: its logger, a log-once helper, and the exception
that stops a build or a calibration in progress.

The logger is named after the package (``triton_nb.backends.fil``), not after this module, so
that one logging setting covers every module of the backend. This module imports nothing else
of the package; all the others may import it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("triton_nb.backends.fil")

_logged_once: set[str] = set()
_logged_lock = threading.Lock()


def log_once(key: str, level: int, message: str, *args: Any) -> None:
    with _logged_lock:
        if key in _logged_once:
            return
        _logged_once.add(key)
    log.log(level, message, *args)


class Cancelled(Exception):
    """Raised inside a build or a calibration once :meth:`FilBackend.finalize` has asked it to stop."""
