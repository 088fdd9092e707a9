"""Triton's logging settings over Python logging: ``--log-verbose``, ``--log-info``,
``--log-warning``, ``--log-error``, ``--log-format`` and ``--log-file``, and the logging extension
(``GET|POST /v2/logging``) that reads and changes them while the server runs.

The settings act on the ``triton_nb`` loggers: the lowest severity enabled becomes their level (so
nothing below it is even formatted), and the handlers the server owns — the log file, and
``triton-nb serve``'s console — also drop the severities switched off above it and write
tritonserver's line format. In process without a log file, the records go on to the notebook's
own logging, which formats them its way.

Standard library only: ``triton-nb serve`` sets up its console before the server is imported.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from triton_nb.errors import InvalidArgumentError

if TYPE_CHECKING:
    from triton_nb.server.settings import ServerSettings

__all__ = ["LogSettings", "TritonLogFormatter"]

_ROOT = "triton_nb"
_FORMATS = ("default", "ISO8601")


class TritonLogFormatter(logging.Formatter):
    """tritonserver's line: ``I1207 02:08:08.123456 1234 core.py:150] message`` (``default``) or
    ``2026-12-07T02:08:08Z I 1234 core.py:150] message`` (``ISO8601``), as its settings say now."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._settings = settings

    def format(self, record: logging.LogRecord) -> str:
        # Triton writes its verbose lines with I too; CRITICAL is an error to it
        severity = {"DEBUG": "I", "INFO": "I", "WARNING": "W"}.get(record.levelname, "E")
        where = f"{os.getpid()} {os.path.basename(record.pathname)}:{record.lineno}]"
        if self._settings.log_format == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            head = f"{stamp} {severity} {where}"
        else:
            local = time.localtime(record.created)
            micros = int((record.created % 1) * 1_000_000)
            head = f"{severity}{time.strftime('%m%d %H:%M:%S', local)}.{micros:06d} {where}"
        text = f"{head} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


@dataclass
class LogSettings:
    """The logging settings of one server (the JSON of Triton's logging extension), applied to
    the ``triton_nb`` loggers and the handlers the server owns."""

    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"
    log_file: str = ""
    _handlers: list[logging.Handler] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> LogSettings:
        return cls(log_info=settings.log_info, log_warning=settings.log_warning, log_error=settings.log_error,
                   log_verbose_level=settings.log_verbose, log_format=settings.log_format,
                   log_file="" if settings.log_file is None else str(settings.log_file))

    @property
    def is_default(self) -> bool:
        """Whether these are Triton's defaults (in process, the loggers are then left as they are)."""
        return self.to_json() == LogSettings().to_json()

    def to_json(self) -> dict[str, Any]:
        return {"log_file": self.log_file, "log_info": self.log_info, "log_warning": self.log_warning,
                "log_error": self.log_error, "log_verbose_level": self.log_verbose_level,
                "log_format": self.log_format}

    def update(self, changes: Any) -> dict[str, Any]:
        """Apply a logging-extension request's changes (all checked before any is applied)."""
        if not isinstance(changes, dict):
            raise InvalidArgumentError("logging settings must be a JSON object")
        kinds = {"log_info": bool, "log_warning": bool, "log_error": bool, "log_verbose_level": int,
                 "log_format": str, "log_file": str}
        for key, value in changes.items():
            if key not in kinds:
                raise InvalidArgumentError(f"logging setting '{key}' is unknown; known: {', '.join(kinds)}")
            kind = kinds[key]
            if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
                raise InvalidArgumentError(f"logging setting '{key}' must be {kind.__name__}, got {value!r}")
            if key == "log_format" and value not in _FORMATS:
                raise InvalidArgumentError(f"logging setting 'log_format' must be default or ISO8601, got {value!r}")
            if key == "log_file" and value != self.log_file:
                raise InvalidArgumentError("logging setting 'log_file' cannot be changed over the network")
        for key, value in changes.items():
            setattr(self, key, value)
        self.apply()
        return self.to_json()

    def _enabled(self, record: logging.LogRecord) -> bool:
        """The severity switches, exactly, for the handlers the server owns."""
        if record.levelno < logging.INFO:
            return self.log_verbose_level > 0
        if record.levelno < logging.WARNING:
            return self.log_info
        if record.levelno < logging.ERROR:
            return self.log_warning
        return self.log_error

    def apply(self) -> None:
        """Set the ``triton_nb`` loggers' level to the lowest severity switched on."""
        level = (logging.DEBUG if self.log_verbose_level > 0 else logging.INFO if self.log_info
                 else logging.WARNING if self.log_warning else logging.ERROR if self.log_error
                 else logging.CRITICAL + 1)
        logging.getLogger(_ROOT).setLevel(level)

    def add_handler(self, handler: logging.Handler) -> None:
        """Write the ``triton_nb`` loggers' records to ``handler`` in tritonserver's format, with
        these settings' severities; :meth:`close` removes it."""
        handler.setFormatter(TritonLogFormatter(self))
        handler.addFilter(self._enabled)
        logging.getLogger(_ROOT).addHandler(handler)
        self._handlers.append(handler)
        self.apply()

    def open(self) -> None:
        """Apply the settings; with a log file, add a handler appending to it. In process, the
        defaults leave the loggers alone (the notebook's logging configuration decides)."""
        if self.log_file:
            self.add_handler(logging.FileHandler(self.log_file, mode="a", encoding="utf-8", delay=False))
        elif not self.is_default:
            self.apply()

    def close(self) -> None:
        """Remove (and close) the handlers added here."""
        logger = logging.getLogger(_ROOT)
        for handler in self._handlers:
            logger.removeHandler(handler)
            handler.close()
        self._handlers.clear()
