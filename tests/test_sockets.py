"""Socket writes that keep the GIL (``triton_nb._sockets``) and the process channel that reads a
message in one go (``triton_nb.backends._process_channel``): every byte arrives, in order, whatever
the socket takes at once; the GIL stays with the writer when the socket takes the bytes."""

from __future__ import annotations

import pickle
import socket
import struct
import threading

import pytest

from triton_nb._sockets import send_all
from triton_nb.backends._process_channel import Channel


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(min(count, 1 << 16))
        assert chunk, "the writer closed early"
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("blocking", [True, False])
def test_send_all_delivers_more_than_the_socket_takes_at_once_in_order(blocking):
    ours, theirs = socket.socketpair()
    if not blocking:
        ours.settimeout(10.0)  # the socket is non-blocking underneath; sendall still waits, up to the timeout
    payload = bytes(range(256)) * (24 * 1024)  # 6 MiB: far over a socket pair's buffer
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(_read_exactly(theirs, len(payload) + 5)))
    reader.start()
    try:
        send_all(ours, payload)
        send_all(ours, b"tail!")
        reader.join(30)
        assert not reader.is_alive()
        assert received == [payload + b"tail!"]
        send_all(ours, bytearray(b"any buffer"))  # not bytes: the ordinary sendall
        assert _read_exactly(theirs, 10) == b"any buffer"
    finally:
        ours.close()
        theirs.close()


def test_send_all_to_a_closed_peer_raises_oserror():
    ours, theirs = socket.socketpair()
    theirs.close()
    with pytest.raises(OSError):
        for _ in range(3):  # (the first write may still land in the buffer on some systems)
            send_all(ours, b"x" * 1024)
    ours.close()
    with pytest.raises(OSError):
        send_all(ours, b"x")  # a closed socket


class _Recording(socket.socket):
    """A socket that records what goes through the ordinary ``sendall`` (which lets the GIL go)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ordinary: list[int] = []

    def sendall(self, data, *args):
        self.ordinary.append(len(data))
        return super().sendall(data, *args)


def test_send_all_keeps_the_gil_when_the_socket_takes_the_bytes_and_waits_the_ordinary_way_otherwise():
    """Bytes the socket takes at once go through libc's ``send`` called with the GIL held; only the
    rest of a write the socket cannot take at once goes through ``sendall``, which waits with the
    GIL released."""
    ours, theirs = socket.socketpair()
    recording = _Recording(fileno=ours.detach())
    try:
        for _ in range(50):
            send_all(recording, b"a small frame")
        assert recording.ordinary == []
        assert _read_exactly(theirs, 50 * 13) == b"a small frame" * 50
        payload = b"\x07" * (6 << 20)
        reader = threading.Thread(target=lambda: _read_exactly(theirs, len(payload)))
        reader.start()
        send_all(recording, payload)
        reader.join(30)
        assert len(recording.ordinary) == 1 and 0 < recording.ordinary[0] < len(payload)  # the rest only
    finally:
        recording.close()
        theirs.close()


def test_the_channel_reads_messages_whole_however_the_bytes_arrive():
    ours, theirs = socket.socketpair()
    channel = Channel(theirs)
    big = ("execute", b"\x01" * 300_000, list(range(10_000)))  # over the 64 KiB read buffer: it grows
    frames = [pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL) for m in (("a", 1), big, ("b", None), ("c",))]
    framed = [struct.pack("<Q", len(f)) + f for f in frames]
    try:
        ours.sendall(framed[0] + framed[1][:3])  # one message and a split header
        assert channel.recv() == ("a", 1)
        writer = threading.Thread(target=ours.sendall, args=(framed[1][3:] + framed[2] + framed[3],))
        writer.start()
        assert channel.recv() == big
        assert channel.recv() == ("b", None)  # two messages from one read
        assert channel.recv() == ("c",)
        writer.join()
        huge = ("server_call", b"\x02" * (6 << 20))  # grows the buffer past what is kept once it is empty
        frame = pickle.dumps(huge, protocol=pickle.HIGHEST_PROTOCOL)
        writer = threading.Thread(target=ours.sendall, args=(struct.pack("<Q", len(frame)) + frame + framed[0],))
        writer.start()
        assert channel.recv() == huge
        assert channel.recv() == ("a", 1)
        writer.join()
        assert len(channel._buffer) < 1 << 20
        ours.sendall(framed[0][:-1])
        ours.close()  # the other side ends in the middle of a message
        assert channel.recv() is None
    finally:
        channel.close()


def test_a_channel_pair_carries_messages_both_ways():
    a, b = socket.socketpair()
    left, right = Channel(a), Channel(b)
    try:
        for i in range(200):
            left.send(("ping", i, b"z" * (i * 997)))
            assert right.recv() == ("ping", i, b"z" * (i * 997))
            right.send(("pong", i))
            assert left.recv() == ("pong", i)
    finally:
        left.close()
        right.close()
