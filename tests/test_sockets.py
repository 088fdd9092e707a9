"""Socket helpers (``triton_nb._sockets``) and the process channel that reads a message in one go
(``triton_nb.backends._process_channel``): every byte arrives, in order, however it is split."""

from __future__ import annotations

import pickle
import socket
import struct
import threading

import pytest

from triton_nb._sockets import recv_exactly
from triton_nb.backends._process_channel import Channel


def test_recv_exactly_reads_across_partial_reads_and_says_when_the_writer_left():
    ours, theirs = socket.socketpair()
    payload = bytes(range(256)) * (24 * 1024)  # 6 MiB: far over a socket pair's buffer, so several reads
    writer = threading.Thread(target=lambda: (ours.sendall(payload + b"tail"), ours.close()))
    writer.start()
    try:
        assert recv_exactly(theirs, len(payload)) == payload
        assert recv_exactly(theirs, 4) == b"tail"
        writer.join(30)
        with pytest.raises(EOFError):
            recv_exactly(theirs, 1)
    finally:
        theirs.close()


def test_a_channel_to_a_closed_peer_raises_oserror():
    ours, theirs = socket.socketpair()
    channel = Channel(ours)
    theirs.close()
    with pytest.raises(OSError):
        for _ in range(3):  # (the first write may still land in the buffer on some systems)
            channel.send(("x", b"x" * 1024))
    ours.close()


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
