"""System calls that cannot block, made without giving up the interpreter lock.

CPython releases the GIL around every ``os.read``, ``os.write`` and socket call, so that a call
that blocks lets other threads run. For a call that cannot block — a read of a socket that
``poll`` said is readable, a write into a socket buffer with room, both with ``MSG_DONTWAIT`` —
the release buys nothing, and it has a price whenever another thread of the caller is waiting
for the lock: that thread takes it at once and keeps it until it next gives it up. A caller
busy in C code (Triton's compiler in the caller, ``sorted()`` of a big list, Inductor's C
passes) keeps it for tens of milliseconds, so each release by the monitor thread costs that
long; a task's round trip made three of them (its ``Done`` read, the next ``Run`` written,
the poll). Measured by ``benchmarks/gil_probe.py`` (docs/benchmarks.md).

The functions here call the C library through :class:`ctypes.PyDLL`, which keeps the GIL
across the call, and only in a form that returns at once (``MSG_DONTWAIT``; a pipe that a
zero-timeout ``poll`` says has room; a non-blocking pipe) — or, for the rest of a frame another
process is writing now, within a wait of a few milliseconds at most (:func:`recv_soon`).
Whatever they cannot do now they leave to the caller's usual, releasing path: ``None`` means
"not now", never "done". Without a C library to load, every function answers ``None`` and the
ordinary calls do all the work.
docs/design.md, "System calls that keep the GIL".
"""

from __future__ import annotations

import ctypes
import select
import socket
import threading


def _load() -> ctypes.PyDLL | None:
    """The C library, its functions declared, called keeping the GIL; ``None`` if unloadable."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
        libc.recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        libc.write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        libc.poll.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int]
    except (OSError, AttributeError):  # no C library to call (not a POSIX build)
        return None
    for fn in (libc.send, libc.recv, libc.read, libc.write):
        fn.restype = ctypes.c_ssize_t
    libc.poll.restype = ctypes.c_int
    return libc


_libc = _load()

_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)  # a closed peer is EPIPE, not SIGPIPE
if not _DONTWAIT:
    _libc = None  # no flag to make a socket call return at once
AVAILABLE = _libc is not None
"""Whether the held calls are made (else every function here answers ``None``)."""


_buffers = threading.local()


def _buffer(size: int) -> ctypes.Array[ctypes.c_char]:
    """This thread's read buffer, at least ``size`` bytes (kept: a 64 KiB buffer made and
    zeroed for every read cost more than the read)."""
    buffer: ctypes.Array[ctypes.c_char] | None = getattr(_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _buffers.buffer = ctypes.create_string_buffer(size)
    return buffer


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


def send_now(fd: int, data: bytes) -> int | None:
    """Send what of ``data`` the socket ``fd`` takes now; the bytes sent, or ``None`` when it
    took nothing (full, interrupted, or an error: the caller's ordinary write reports it)."""
    if _libc is None:
        return None
    sent = _libc.send(fd, data, len(data), _DONTWAIT | _NOSIGNAL)
    return sent if sent > 0 else None


def recv_now(fd: int, size: int) -> bytes | None:
    """Up to ``size`` bytes the socket ``fd`` holds now (``b""``: its end); ``None`` when it
    holds nothing yet or is not a socket (the caller reads it the ordinary way)."""
    if _libc is None:
        return None
    buffer = _buffer(size)
    got = _libc.recv(fd, buffer, size, _DONTWAIT)
    if got < 0:
        return None
    return ctypes.string_at(buffer, got)  # copies what came, not the whole buffer


def recv_soon(fd: int, size: int, wait_ms: int) -> bytes | None:
    """Up to ``size`` bytes of the socket ``fd``, waiting at most ``wait_ms`` for the first of
    them with the GIL kept (``b""``: its end); ``None`` when none came in that time, or on an
    error (the caller's ordinary read waits or reports it). For the rest of a frame whose sender
    is writing it now: it comes within microseconds, and each wait with the GIL released costs
    a busy caller's thread a switch interval (docs/design.md, "System calls that keep the
    GIL")."""
    if _libc is None:
        return None
    slot = _PollFd(fd, select.POLLIN, 0)
    if _libc.poll(ctypes.byref(slot), 1, wait_ms) != 1:
        return None
    return recv_now(fd, size)


def read_now(fd: int, size: int) -> bytes | None:
    """Up to ``size`` bytes from the non-blocking pipe ``fd``; ``None`` when it holds nothing."""
    if _libc is None:
        return None
    buffer = _buffer(size)
    got = _libc.read(fd, buffer, size)
    if got < 0:
        return None
    return ctypes.string_at(buffer, got)


def write_now(fd: int, data: bytes) -> int | None:
    """Write ``data`` (at most ``PIPE_BUF`` bytes: a pipe takes them whole or not at all) to
    the pipe ``fd`` if it has room now — a ``poll`` that does not wait says so, so the write
    cannot block even on a blocking pipe; the bytes written, or ``None``: nothing written."""
    if _libc is None or len(data) > select.PIPE_BUF:
        return None
    slot = _PollFd(fd, select.POLLOUT, 0)
    if _libc.poll(ctypes.byref(slot), 1, 0) != 1 or slot.revents != select.POLLOUT:
        return None  # full, closed or in error: the ordinary write waits or reports it
    written = _libc.write(fd, data, len(data))
    return written if written > 0 else None
