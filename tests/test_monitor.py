"""The monitor's reader (:func:`precompile_executor._processes.read_frames`) against the real
``multiprocessing.connection`` framing over a real socket pair: bursts, cut frames, the end of
the stream. The monitor thread itself runs in every test that starts a worker."""

from __future__ import annotations

import socket
import threading
from multiprocessing.connection import Connection

import pytest

from precompile_executor._processes import READ_CHUNK_BYTES, read_frames

pytestmark = pytest.mark.timeout(20)


def _pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a.detach()), Connection(b.detach())


def test_a_burst_of_small_messages_is_read_at_once() -> None:
    sender, receiver = _pair()
    with sender, receiver:
        for i in range(5):
            sender.send_bytes(b"m%d" % i)
        frames, ended = read_frames(receiver.fileno())
        assert frames == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert not ended


def test_a_frame_larger_than_one_read_is_completed() -> None:
    sender, receiver = _pair()
    big = bytes(range(256)) * (3 * READ_CHUNK_BYTES // 256 + 7)
    with sender, receiver:
        writer = threading.Thread(target=lambda: (sender.send_bytes(b"a"), sender.send_bytes(big)))
        writer.start()
        frames: list[bytes] = []
        while len(frames) < 2:
            got, ended = read_frames(receiver.fileno())
            assert not ended
            frames += got
        writer.join(timeout=10)
        assert frames == [b"a", big]
        sender.send_bytes(b"after")  # the stream is still in step
        assert read_frames(receiver.fileno()) == ([b"after"], False)


def test_the_end_of_the_stream_after_whole_messages() -> None:
    sender, receiver = _pair()
    with receiver:
        sender.send_bytes(b"started")
        sender.close()
        frames, ended = read_frames(receiver.fileno())
        if not ended:  # the end of file may come with the next read
            assert frames == [b"started"]
            frames, ended = read_frames(receiver.fileno())
            assert frames == []
        assert ended


def test_a_stream_cut_inside_a_message_keeps_the_whole_ones_before_it() -> None:
    a, b = socket.socketpair()
    receiver = Connection(b.detach())
    with receiver:
        whole = (7).to_bytes(4, "big") + b"started"
        cut = (1000).to_bytes(4, "big") + b"only part"
        a.sendall(whole + cut)
        a.close()
        assert read_frames(receiver.fileno()) == ([b"started"], True)
