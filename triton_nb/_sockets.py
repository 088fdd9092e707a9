"""Writing to a socket without giving the GIL away, when the socket takes the bytes at once.

Every ``socket.send``/``sendall`` lets the GIL go for the system call, even when the call cannot
block. In the server that costs the writer a wait to get the GIL back: the front ends' event loop
thread is busy with the other requests and keeps the GIL until it blocks or the interpreter takes
it away (``sys.getswitchinterval()``, 5 ms). A model thread that writes its answers (to the gRPC
relay, per request) or a batch (to a model's own process) pays that wait on every write.

:func:`send_all` first offers the bytes to libc's ``send`` through :class:`ctypes.PyDLL`, which
keeps the GIL for the call, with ``MSG_DONTWAIT``: a Unix socket whose reader keeps up takes a
message of a few kilobytes at once, in microseconds. Whatever it does not take (the reader is
behind, the buffer is full) goes through ``sendall``, which waits as usual, the GIL released.
Where that libc call cannot be had, everything goes through ``sendall``.

Only the standard library is used: the module also runs in a Python model's own process.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["send_all"]


def _libc_send() -> Any:
    try:
        import ctypes

        function = ctypes.PyDLL(None).send  # PyDLL: the GIL is held across the call
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int)
    function.restype = ctypes.c_ssize_t
    return function


_DONT_WAIT = getattr(socket, "MSG_DONTWAIT", 0)
# a reader that has gone must raise here (EPIPE from the fallback's sendall), not send SIGPIPE
_FLAGS = _DONT_WAIT | getattr(socket, "MSG_NOSIGNAL", 0)
_LIBC_SEND = _libc_send() if _DONT_WAIT else None


def send_all(sock: socket.socket, data: bytes) -> None:
    """Send all of ``data`` on ``sock`` (any blocking mode); raises ``OSError`` as ``sendall`` does."""
    sent = 0
    if _LIBC_SEND is not None and type(data) is bytes:
        sent = max(_LIBC_SEND(sock.fileno(), data, len(data), _FLAGS), 0)  # -1: would block, or an error
        if sent == len(data):
            return
    sock.sendall(memoryview(data)[sent:] if sent else data)
