"""What the HTTP and gRPC relays share: the process that terminates a protocol, and the framed
socket pair between it and the server.

Each relay (:mod:`triton_nb.server.frontends.http.relay`, :mod:`triton_nb.server.frontends.grpc.relay`)
runs as a script in a process of its own, so that a protocol's per-request machinery runs on
another core than the models' interpreter. It reaches the server through one socket pair; every
frame on it is a header ``<IIB`` (payload length, request id, kind) and the payload. What the
kinds mean is each relay's own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar

from triton_nb._sockets import SCRIPT_BOOTSTRAP, recv_exactly
from triton_nb.errors import UnavailableError

__all__ = ["HEADER", "FramedLink", "RelayProcess"]

log = logging.getLogger(__name__)

HEADER = struct.Struct("<IIB")

LinkT = TypeVar("LinkT", bound="FramedLink")


class FramedLink(asyncio.Protocol):
    """The server's end of a relay's socket pair.

    Frames are read on the front ends' event loop and handed to :meth:`frame_received`. Writes go
    through a blocking duplicate of the socket under a lock, so that the model thread that finishes a
    request writes its answer itself: no hop back to the loop, whose thread would have to win the GIL
    once more per request.
    """

    #: the protocol's name, for the log
    protocol = "relay"

    def __init__(self, link: socket.socket, together: Callable[[], AbstractContextManager[None]]) -> None:
        self._together = together
        self._writer = link.dup()
        self._writer.setblocking(True)
        self._write_lock = threading.Lock()
        self._buffer = bytearray()
        self.closed: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.closed = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)
        with self._write_lock:
            self._writer.close()

    def send(self, kind: int, request_id: int, payload: bytes = b"") -> None:
        """Write one frame; safe from any thread."""
        data = HEADER.pack(len(payload), request_id, kind) + payload
        with self._write_lock:
            try:
                self._writer.sendall(data)
            except OSError:  # the relay has gone: its clients see the connection drop
                log.debug("%s relay gone; answer to request %d dropped", self.protocol, request_id)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset = 0
        # The requests of one read arrived together (the relay wrote them while the server was busy):
        # the server takes them as one burst (see InferenceService.infer_together).
        frames = []
        while len(buffer) - offset >= HEADER.size:
            size, request_id, kind = HEADER.unpack_from(buffer, offset)
            end = offset + HEADER.size + size
            if len(buffer) < end:
                break
            frames.append((kind, request_id, bytes(buffer[offset + HEADER.size:end])))
            offset = end
        del buffer[:offset]
        if frames:
            with self._together():
                self.frames_received(frames)

    def frames_received(self, frames: list[tuple[int, int, bytes]]) -> None:
        """The ``(kind, request id, payload)`` frames of one read, in order: one by one to
        :meth:`frame_received`, unless a link takes them together."""
        for kind, request_id, payload in frames:
            self.frame_received(kind, request_id, payload)

    def frame_received(self, kind: int, request_id: int, payload: bytes) -> None:
        raise NotImplementedError


class RelayProcess:
    """A relay's process, started on its end of a new socket pair; :meth:`first_frame` reads what it
    says once it serves (or why it cannot), :meth:`connect` serves the link on the running loop."""

    def __init__(self, script: str, arguments: Sequence[str], *, protocol: str,
                 pass_fds: Sequence[int] = ()) -> None:
        self.protocol = protocol
        ours, theirs = socket.socketpair()
        # Run as a file, without its folder on sys.path (no module beside it may shadow a real
        # package) and without importing the package (fast start, no models).
        command = [sys.executable, "-c", SCRIPT_BOOTSTRAP, script, "--fd", str(theirs.fileno()), *arguments]
        try:
            self.process = subprocess.Popen(command, pass_fds=[theirs.fileno(), *pass_fds], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._socket = ours

    def first_frame(self, timeout_s: float) -> tuple[int, bytes]:
        """``(kind, payload)`` of the relay's first frame; the process is ended when none comes."""
        self._socket.settimeout(timeout_s)
        try:
            size, _, kind = HEADER.unpack(recv_exactly(self._socket, HEADER.size))
            return kind, recv_exactly(self._socket, size)
        except (OSError, EOFError) as exc:
            self.kill()
            raise UnavailableError(f"the {self.protocol} front end did not start: "
                                   f"{exc or 'the relay process exited'}") from None
        finally:
            self._socket.settimeout(None)

    async def connect(self, factory: Callable[[socket.socket], LinkT]) -> LinkT:
        """Serve the link ``factory(socket)`` makes on the running loop (the front ends')."""
        self._socket.setblocking(False)
        _, link = await asyncio.get_running_loop().connect_accepted_socket(lambda: factory(self._socket),
                                                                           sock=self._socket)
        return link

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for the process to end; True when it did."""
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._socket.close()
