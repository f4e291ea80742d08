"""The system calls the hub makes keeping the GIL (docs/design.md, "System calls that keep the
GIL"): each does at once what it can and answers ``None`` for what it cannot, never blocking."""

from __future__ import annotations

import ctypes
import os
import socket

import pytest

from precompile_executor import _wire

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not _wire.AVAILABLE, reason="no C library to call"),
]


def test_a_socket_read_returns_what_is_there_nothing_when_empty_and_b_at_its_end() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert _wire.recv_now(ours.fileno(), 64) is None  # empty: not now, and no wait
        theirs.sendall(b"hello")
        assert _wire.recv_now(ours.fileno(), 64) == b"hello"
        theirs.sendall(b"0123456789")
        assert _wire.recv_now(ours.fileno(), 4) == b"0123"  # at most what was asked
        assert _wire.recv_now(ours.fileno(), 64) == b"456789"
        theirs.shutdown(socket.SHUT_WR)
        assert _wire.recv_now(ours.fileno(), 64) == b""


def test_a_send_takes_what_fits_and_never_waits_for_a_full_socket() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert _wire.send_now(ours.fileno(), b"frame") == 5
        assert theirs.recv(64) == b"frame"
        chunk = b"x" * (1 << 20)
        sent = 0
        while (n := _wire.send_now(ours.fileno(), chunk)) is not None:
            sent += n
        assert sent > 0  # it filled the buffer, then said "not now" instead of blocking
        got = 0
        theirs.setblocking(False)
        while got < sent:
            try:
                got += len(theirs.recv(1 << 20))
            except BlockingIOError:
                break
        assert got == sent


def test_a_send_to_a_closed_peer_is_refused_without_a_signal() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    with ours:
        assert _wire.send_now(ours.fileno(), b"frame") is None  # EPIPE, not SIGPIPE
        with pytest.raises(OSError):
            ours.send(b"frame")  # the ordinary call reports it


def test_a_pipe_write_goes_out_while_there_is_room_and_waits_for_nothing() -> None:
    read_end, write_end = os.pipe()  # blocking, as the guardian's stdin
    try:
        assert _wire.write_now(write_end, b"+123\n") == 5
        assert os.read(read_end, 64) == b"+123\n"
        line = b"y" * 512
        written = 0
        while (n := _wire.write_now(write_end, line)) is not None:
            assert n == len(line)  # whole or not at all
            written += n
        assert written >= 4096  # the pipe filled up; the full pipe answered None at once
        assert _wire.write_now(write_end, b"z" * (1 << 16)) is None  # over PIPE_BUF
        os.set_blocking(read_end, False)
        drained = 0
        while True:
            try:
                drained += len(os.read(read_end, 1 << 16))
            except BlockingIOError:
                break
        assert drained == written
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_non_blocking_pipe_read_answers_none_when_empty() -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        assert _wire.read_now(read_end, 64) is None
        os.write(write_end, b"xx")
        assert _wire.read_now(read_end, 64) == b"xx"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_every_held_call_is_made_without_releasing_the_gil() -> None:
    # ctypes releases the GIL around a foreign call unless the function comes from a PyDLL,
    # whose functions carry FUNCFLAG_PYTHONAPI (https://docs.python.org/3/library/ctypes.html,
    # "PyDLL"): that flag is what makes these calls cheap under a busy caller.
    libc = _wire._libc
    assert libc is not None
    for fn in (libc.send, libc.recv, libc.read, libc.write, libc.poll):
        assert fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, fn


def test_a_socket_read_soon_takes_what_comes_within_its_wait_and_gives_up_after_it() -> None:
    import subprocess
    import sys

    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert _wire.recv_soon(ours.fileno(), 64, 1) is None  # nothing came within 1 ms
        # Bytes another process sends while it waits are taken: a worker writing the rest of a
        # frame. (Not a thread of this process: the wait keeps the GIL such a thread needs.)
        fd = theirs.fileno()
        code = f"import os, time; time.sleep(0.05); os.write({fd}, b'rest of a frame')"
        sender = subprocess.Popen([sys.executable, "-c", code], pass_fds=[fd])
        try:
            got = _wire.recv_soon(ours.fileno(), 64, 20_000)
        finally:
            sender.wait(20)
        assert got == b"rest of a frame"
        theirs.shutdown(socket.SHUT_WR)
        assert _wire.recv_soon(ours.fileno(), 64, 1000) == b""  # the end, at once


def test_a_frame_reader_awaits_bytes_briefly_and_keeps_them_for_its_next_frame() -> None:
    """A worker after a lone short task polls for the next ``Run`` a moment instead of sleeping
    in a read (docs/design.md, "Per-task overhead"): what comes is kept for ``next()``, nothing
    coming ends the wait, and the stream's end is left for ``next()`` to report."""
    import threading

    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = _wire.FrameReader(ours.fileno())
        assert reader.await_bytes(0.001) is False  # nothing came: no wait past its time
        body = _wire.encode(_wire.Run(7, 1, False, b"blob"))
        frame = _wire.FRAME_SIZE.pack(len(body)) + body
        sender = threading.Timer(0.05, theirs.sendall, (frame,))
        sender.start()
        try:
            assert reader.await_bytes(20.0) is True
        finally:
            sender.join(20)
        assert reader.has_frame()
        assert _wire.decode(reader.next()) == _wire.Run(7, 1, False, b"blob")
        theirs.shutdown(socket.SHUT_WR)
        assert reader.await_bytes(20.0) is True  # the end counts as something that came
        with pytest.raises(EOFError):
            reader.next()
