"""The message channel between the server and a Python model's own process.

Messages are tuples ``(op, ...)`` of plain values, pickled and framed with an 8-byte length over a
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
_READ_BYTES = 1 << 16  # a batch's message (metadata only: its tensors are in shared memory) fits in one read
_KEPT_BYTES = 1 << 22  # a read buffer grown past this goes back to _READ_BYTES once it is empty


class Channel:
    """One end of the socket pair; ``send`` may be called from any thread, ``recv`` from one.

    A message is sent with one ``sendall`` and read, header and body together, by one ``recv``
    where it fits."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._closed = False
        self._buffer = bytearray(_READ_BYTES)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0  # what has been read and not yet handed out: _buffer[_start:_end]

    def send(self, message: tuple[Any, ...]) -> None:
        """Send one message; raises ``OSError`` when the other side is gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._sock.sendall(_HEADER.pack(len(data)) + data)

    def recv(self) -> tuple[Any, ...] | None:
        """The next message, or None when the other side closed (or died)."""
        if not self._fill(_HEADER.size):
            return None
        (length,) = _HEADER.unpack_from(self._buffer, self._start)
        if not self._fill(_HEADER.size + length):
            return None
        body = self._view[self._start + _HEADER.size:self._start + _HEADER.size + length]
        try:
            return pickle.loads(body)
        finally:
            body.release()
            self._start += _HEADER.size + length
            if self._start == self._end:
                self._start = self._end = 0
                if len(self._buffer) > _KEPT_BYTES:  # a large message (a BLS call's tensors) came and went
                    self._view.release()
                    self._buffer = bytearray(_READ_BYTES)
                    self._view = memoryview(self._buffer)

    def _fill(self, count: int) -> bool:
        """Read until ``count`` bytes are buffered; False when the other side is gone."""
        if self._end - self._start >= count:
            return True
        if self._start + count > len(self._buffer):  # make room: move what is left to the front, or grow
            pending = self._end - self._start
            if count > len(self._buffer):
                self._view.release()
                grown = bytearray(max(count, 2 * len(self._buffer)))
                grown[:pending] = self._buffer[self._start:self._end]
                self._buffer, self._view = grown, memoryview(grown)
            else:
                self._buffer[:pending] = self._buffer[self._start:self._end]
            self._start, self._end = 0, pending
        while self._end - self._start < count:
            try:
                read = self._sock.recv_into(self._view[self._end:])
            except OSError:
                return False
            if not read:
                return False
            self._end += read
        return True

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
