"""The message channel between the server and a Python model's own process.

Messages are tuples ``(op, ...)`` of plain values, pickled and framed with a 4-byte length over a
Unix socket pair; tensors of the execute path do not travel here but in shared memory
(:mod:`triton_nb.backends._tensor_arena`). Standard library only: the model's process may run an
interpreter of its own.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import struct
import threading
from typing import Any

__all__ = ["Channel", "error_from_wire", "error_to_wire"]

_HEADER = struct.Struct("<Q")


class Channel:
    """One end of the socket pair; ``send`` may be called from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._closed = False

    def send(self, message: tuple[Any, ...]) -> None:
        """Send one message; raises ``OSError`` when the other side is gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._sock.sendall(_HEADER.pack(len(data)) + data)

    def recv(self) -> tuple[Any, ...] | None:
        """The next message, or None when the other side closed (or died)."""
        header = self._read(_HEADER.size)
        if header is None:
            return None
        (length,) = _HEADER.unpack(header)
        data = self._read(length)
        return None if data is None else pickle.loads(data)

    def _read(self, count: int) -> bytes | None:
        chunks = []
        while count:
            try:
                chunk = self._sock.recv(min(count, 1 << 20))
            except OSError:
                return None
            if not chunk:
                return None
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()


def error_to_wire(error: BaseException | None) -> tuple[str, str] | None:
    """An error as (class name, message): any exception crosses, even one that does not pickle."""
    return None if error is None else (type(error).__name__, str(error))


def error_from_wire(wire: tuple[str, str] | None) -> BaseException | None:
    """The error again, as the ``triton_nb.errors`` class of that name (else an InternalError)."""
    if wire is None:
        return None
    from triton_nb import errors

    name, message = wire
    kind = getattr(errors, name, None)
    if not (isinstance(kind, type) and issubclass(kind, errors.TritonNBError)) or kind is errors.MissingDependencyError:
        kind = errors.InternalError
    return kind(message)
