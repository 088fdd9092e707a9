"""Treelite's and TL2cgen's C++ log lines, routed into Python logging.

Loading a FIL model and compiling it printed C++ log lines on the console — in a notebook, in
``triton-nb demo`` and in ``triton-nb serve`` — such as ``split.cc:35: Parallel compilation
enabled ...`` and, each time TL2cgen reads a model, ``serializer.cc:202: The model you are loading
originated from a newer Treelite version ...``. Two mechanisms are behind them:

* Treelite and TL2cgen send their log lines to a callback, which their Python packages set at
  import to ``print`` (and warnings to ``warnings.warn``). The callbacks are *per thread* in the
  C++ code, so on any thread but the importing one the lines go straight to stderr.
  :func:`route_native_logs` registers ours on the calling thread: log lines go to the
  ``triton_nb.native.treelite`` / ``triton_nb.native.tl2cgen`` loggers at DEBUG, warnings at WARNING.
* TL2cgen links a Treelite of its own whose log functions it does not export: the version-skew
  note comes from there and reaches file descriptor 2 directly. :func:`native_stderr_to_logging`
  captures descriptor 2 around such a call and logs the library's lines at DEBUG (the version-skew
  note once per process); any other text written to stderr meanwhile is written back, so nothing
  is lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["native_stderr_to_logging", "route_native_logs"]

# "[09:01:02] /path/to/file.cc:202: message" — the start of one C++ log record
_RECORD = re.compile(r"^\[\d{2}:\d{2}:\d{2}\] \S+\.(?:cc|cpp|cxx|h|hpp|cu):\d+: ")
_TIMESTAMP = re.compile(r"^\[\d{2}:\d{2}:\d{2}\]\s*")
# the note Treelite writes on every checkpoint from a newer Treelite; its two lines after the first
# name the versions
_VERSION_SKEW = "Treelite version"

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

# library -> (module holding the loaded C library, its attribute, C prefix of the register calls)
_LIBRARIES = {
    "treelite": ("treelite.core", "_LIB", "Treelite"),
    "tl2cgen": ("tl2cgen.libloader", "_LIB", "TL2cgen"),
}

_seen_lock = threading.Lock()
_seen_once: set[str] = set()
_callbacks: dict[str, tuple[Any, Any]] = {}  # kept alive for the process: C holds bare pointers
_callbacks_lock = threading.Lock()
_thread_state = threading.local()
_stderr_lock = threading.Lock()  # one capture of descriptor 2 at a time


def _logger(library: str) -> logging.Logger:
    return logging.getLogger(f"triton_nb.native.{library}")


def _first_time(text: str) -> bool:
    with _seen_lock:
        if text in _seen_once:
            return False
        _seen_once.add(text)
        return True


def _log_record(logger: logging.Logger, text: str) -> None:
    text = _TIMESTAMP.sub("", text.rstrip())
    if _VERSION_SKEW in text and not _first_time(text):
        return
    logger.debug("%s", text)


def _make_callbacks(library: str) -> tuple[Any, Any]:
    logger = _logger(library)

    def log(message: bytes | None) -> None:
        _log_record(logger, (message or b"").decode("utf-8", errors="replace"))

    def warn(message: bytes | None) -> None:
        logger.warning("%s", _TIMESTAMP.sub("", (message or b"").decode("utf-8", errors="replace").rstrip()))

    return _CALLBACK(log), _CALLBACK(warn)


def _library(library: str) -> Any | None:
    module_name, attribute, _ = _LIBRARIES[library]
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except Exception:  # not installed, or a layout we do not know: nothing to route
        return None


def route_native_logs() -> None:
    """Send Treelite's and TL2cgen's log lines on *this thread* to Python logging (idempotent).

    Call it on each thread, before calls into either library that may log; it imports them if
    they are installed. Cheap after the first call on a thread.
    """
    if getattr(_thread_state, "routed", False):
        return
    _thread_state.routed = True
    for library, (_, _, prefix) in _LIBRARIES.items():
        lib = _library(library)
        if lib is None:
            continue
        with _callbacks_lock:
            if library not in _callbacks:
                _callbacks[library] = _make_callbacks(library)
            log, warn = _callbacks[library]
        # a non-zero return leaves the library's own callback in place: noisy, never broken
        getattr(lib, f"{prefix}RegisterLogCallback")(log)
        getattr(lib, f"{prefix}RegisterWarningCallback")(warn)


def _split(text: str) -> tuple[list[str], str]:
    """The captured text as library records and the rest (to give back to stderr)."""
    records: list[str] = []
    rest: list[str] = []
    for line in text.splitlines(keepends=True):
        if _RECORD.match(line):
            records.append(line)
        elif records and _VERSION_SKEW in line and _VERSION_SKEW in records[-1]:
            records[-1] += line  # the version-skew note's own continuation lines
        else:
            rest.append(line)
    return records, "".join(rest)


@contextlib.contextmanager
def native_stderr_to_logging(library: str) -> Iterator[None]:
    """Capture file descriptor 2 while the block runs; log ``library``'s lines at DEBUG.

    For calls into native code that writes to stderr directly. Other threads' output in that
    window is held back and written to stderr afterwards, in order, instead of being lost.
    """
    logger = _logger(library)
    with _stderr_lock:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no usable descriptor 2: nothing to capture
            yield
            return
        with tempfile.TemporaryFile() as capture:
            try:
                os.dup2(capture.fileno(), 2)
                yield
            finally:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                capture.seek(0)
                records, rest = _split(capture.read().decode("utf-8", errors="replace"))
                for record in records:
                    _log_record(logger, record)
                if rest:
                    with contextlib.suppress(OSError):
                        os.write(2, rest.encode("utf-8"))

