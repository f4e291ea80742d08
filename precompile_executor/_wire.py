"""The wire between the parent and its workers: the messages, the frame, and the I/O that keeps
the GIL.

* **Messages**: small named types, one :func:`encode` and one :func:`decode`.
* **The frame**: ``multiprocessing.connection``'s (a 4-byte size, :data:`FRAME_SIZE`, then the
  body), so either side may also use a ``Connection``; written by :func:`write_frame` (and
  :func:`send_frame`, the caller's, keeping the GIL when the socket takes it at once) and read
  by the one :class:`FrameReader` (the worker's blocking reads ahead; the monitor's
  :func:`read_frames`, which completes only a frame its read cut).
* **Held I/O**: the system calls that cannot block, made keeping the GIL (:func:`send_now`,
  :func:`recv_now`, :func:`recv_soon`, :func:`read_now`, :func:`write_now`).

Parent → worker: :class:`Run`, :class:`Stop`. Worker → parent: :class:`Hello` once, then per
task :class:`Started` (before the task's code runs, so the parent knows a task that never
started from one that did) and :class:`Done`. A forked child sends only :class:`Done`.
Parent → template: :class:`ForkWorker`, :class:`Stop`; template → parent: :class:`Hello`, then
:class:`Forked` or :class:`ForkRefused` per request and :class:`Exited` per worker it reaps.

Both sides import this module; it imports nothing of the library but the error record.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Union

from ._errors import ErrorRecord

Outcome = tuple[bool, Any]
"""One call's outcome: ``(True, cloudpickled value)`` or ``(False, ErrorRecord)``."""


class Run(NamedTuple):
    """Run one task: ``blob`` pickles ``(cloudpickled fn, cloudpickled [(args, kwargs), ...])``.
    ``lone``: nothing of its executor was queued when it was sent (its caller may be waiting for
    its result before it submits more: the worker polls for the next ``Run`` a moment after a
    short one, :data:`._worker.LINGER_S`)."""

    task_id: int
    n_calls: int
    want_output: bool
    blob: bytes
    lone: bool = False


class Stop(NamedTuple):
    """Leave the serve loop and exit cleanly."""


class Hello(NamedTuple):
    """A new worker is up: ``failure`` is the initializer's error, or ``None``."""

    token: str
    pid: int
    failure: ErrorRecord | None


class Started(NamedTuple):
    """The worker took task ``task_id`` and is about to run it."""

    task_id: int


class Done(NamedTuple):
    """Task ``task_id`` finished; ``retire``: this process's CUDA context is broken;
    ``recycle``: it ran its ``max_tasks_per_child`` and exits. Either way it is replaced.
    ``plain``: every call succeeded with a small value of a plain type, whose pickle imports
    and runs nothing when loaded, so the parent may decode it on the monitor thread."""

    task_id: int
    outcomes: list[Outcome]
    output: str | None
    retire: bool = False
    recycle: bool = False
    plain: bool = False  # every call returned plain data (see _worker.PLAIN_TYPES)


class ForkWorker(NamedTuple):
    """Parent → template: fork a worker that says hello as ``token`` (pinned to ``device``;
    leaving after ``max_tasks`` tasks unless ``None``)."""

    token: str
    capture_path: str
    device: str | None
    max_tasks: int | None = None


class Forked(NamedTuple):
    """Template → parent: the worker for ``token`` is process ``pid``."""

    token: str
    pid: int


class ForkRefused(NamedTuple):
    """Template → parent: forking now would be unsafe (``reason``); start it another way."""

    token: str
    reason: str


class Exited(NamedTuple):
    """Template → parent: its forked worker ``pid`` ended with ``code`` (negative: signal)."""

    pid: int
    code: int


Message = Union[  # noqa: UP007 - NamedTuples in a runtime alias
    Run, Stop, Hello, Started, Done, ForkWorker, Forked, ForkRefused, Exited
]
_TYPES: dict[str, type[Any]] = {
    t.__name__: t
    for t in (Run, Stop, Hello, Started, Done, ForkWorker, Forked, ForkRefused, Exited)
}


def encode(message: Message) -> bytes:
    """Bytes for ``Connection.send_bytes``: the type's name and its fields, plain pickle."""
    return pickle.dumps((type(message).__name__, tuple(message)), protocol=pickle.HIGHEST_PROTOCOL)


FRAME_SIZE = struct.Struct("!i")
"""``multiprocessing.connection``'s frame header: the body's size."""

FRAME_BIG_SIZE = struct.Struct("!Q")
"""After a size of -1: the size of a body over 2 GiB."""

JOIN_LIMIT = 16384  # as multiprocessing.connection: a larger body is not copied to join it


def write_frame(fd: int, data: bytes) -> None:
    """Write ``data`` as one ``multiprocessing.connection`` frame to the blocking socket ``fd``:
    the bytes ``Connection.send_bytes`` writes, in one ``write`` for a small message and with
    none of its Python-level layers (a warm task's send is on the monitor's path). Raises
    ``OSError`` as ``send_bytes`` does (a closed or broken socket)."""
    n = len(data)
    big = n > 0x7FFFFFFF
    header = FRAME_SIZE.pack(-1) + FRAME_BIG_SIZE.pack(n) if big else FRAME_SIZE.pack(n)
    if n <= JOIN_LIMIT:
        _write_all(fd, header + data)
    else:
        _write_all(fd, header)
        _write_all(fd, data)


def send_frame(fd: int, data: bytes) -> None:
    """:func:`write_frame` for the caller's side (the hub): a frame the socket's buffer takes at
    once is sent keeping the GIL (:func:`send_now`: a thread of the caller busy in C
    code would otherwise hold it as long as it likes before this thread got it back); the rest,
    if any, is written as :func:`write_frame` does."""
    n = len(data)
    if n > JOIN_LIMIT:
        write_frame(fd, data)
        return
    frame = FRAME_SIZE.pack(n) + data
    sent = send_now(fd, frame) or 0
    if sent < len(frame):
        _write_all(fd, memoryview(frame)[sent:])


def send_frames(fd: int, bodies: list[bytes]) -> None:
    """:func:`send_frame` of each of ``bodies``, in order: small ones in one write (a worker
    reads them in one read, and is woken once)."""
    if len(bodies) == 1 or any(len(body) > JOIN_LIMIT for body in bodies):
        for body in bodies:
            send_frame(fd, body)
        return
    data = _joined(bodies)
    sent = send_now(fd, data) or 0
    if sent < len(data):
        _write_all(fd, memoryview(data)[sent:])


def write_frames(fd: int, bodies: list[bytes]) -> None:
    """:func:`write_frame` of each of ``bodies``, in order: small ones in one write."""
    if len(bodies) == 1 or any(len(body) > JOIN_LIMIT for body in bodies):
        for body in bodies:
            write_frame(fd, body)
        return
    _write_all(fd, _joined(bodies))


def _joined(bodies: list[bytes]) -> bytes:
    pack = FRAME_SIZE.pack
    return b"".join([part for body in bodies for part in (pack(len(body)), body)])


def _write_all(fd: int, data: bytes | memoryview) -> None:
    written = os.write(fd, data)
    if written == len(data):
        return
    view = memoryview(data)
    while written < len(view):
        written += os.write(fd, view[written:])


def decode(data: bytes) -> Message:
    """The message in ``data``; raises ``ValueError`` for anything that is not one of ours."""
    try:
        name, fields = pickle.loads(data)
        message: Message = _TYPES[name](*fields)
    except Exception as exc:  # noqa: BLE001 - garbled or foreign bytes
        raise ValueError(f"not a precompile_executor message: {exc}") from exc
    return message


# ----------------------------------------------------------------------------------------------
# System calls that cannot block, made without giving up the interpreter lock.
#
# CPython releases the GIL around every ``os.read``, ``os.write`` and socket call, so that a call
# that blocks lets other threads run. For a call that cannot block — a read of a socket that
# ``poll`` said is readable, a write into a socket buffer with room, both with ``MSG_DONTWAIT`` —
# the release buys nothing, and it has a price whenever another thread of the caller is waiting
# for the lock: that thread takes it at once and keeps it until it next gives it up. A caller
# busy in C code (Triton's compiler in the caller, ``sorted()`` of a big list, Inductor's C
# passes) keeps it for tens of milliseconds, so each release by the monitor thread costs that
# long; a task's round trip made three of them (its ``Done`` read, the next ``Run`` written,
# the poll). Measured by ``benchmarks/gil_probe.py`` (docs/benchmarks.md).
#
# The functions here call the C library through :class:`ctypes.PyDLL`, which keeps the GIL
# across the call, and only in a form that returns at once (``MSG_DONTWAIT``; a pipe that a
# zero-timeout ``poll`` says has room; a non-blocking pipe) — or, for the rest of a frame another
# process is writing now, within a wait of a few milliseconds at most (:func:`recv_soon`).
# Whatever they cannot do now they leave to the caller's usual, releasing path: ``None`` means
# "not now", never "done". Without a C library to load, every function answers ``None`` and the
# ordinary calls do all the work.
# docs/design.md, "System calls that keep the GIL".


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

# Plain ints: an or of the socket module's MsgFlag members goes through enum.Flag (~2 µs a send).
_DONTWAIT = int(getattr(socket, "MSG_DONTWAIT", 0))
_NOSIGNAL = int(getattr(socket, "MSG_NOSIGNAL", 0))  # a closed peer is EPIPE, not SIGPIPE
_SEND_FLAGS = _DONTWAIT | _NOSIGNAL
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
    sent = _libc.send(fd, data, len(data), _SEND_FLAGS)
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


READ_CHUNK_BYTES = 1 << 16
"""What one read takes from a readable socket: many small messages at once; a larger frame is
completed with reads of what it still lacks."""

FRAME_CHUNK_BYTES = 1 << 20
"""The most one held read takes of a frame being completed (a compile's files: up to a few MiB)."""

FRAME_WAIT_MS = 2
"""How long a held read waits for more of a frame being completed. Its sender is writing it as
the reader drains the socket, so the bytes come within microseconds; a sender that stalls
longer (descheduled on a loaded machine) is waited for with the GIL released."""


class FrameReader:
    """The one reader of ``multiprocessing.connection`` frames (:data:`FRAME_SIZE`, then the
    body), over a socket's byte stream, in as few reads as it can: a small message's header and
    body come in one (``Connection.recv_bytes`` reads them apart), and bytes read past a frame
    are kept for the next.

    Args:
        fd: the socket.
        fill: ``fill(fd, missing)`` reads at least one byte of the ``missing`` ones a frame
            still lacks, and returns ``b""`` at the end of the stream: the worker's reads ahead
            (:func:`read_ahead`), the caller's exactly what is missing, keeping the GIL while
            the bytes come at once (:func:`read_held`).
    """

    __slots__ = ("data", "fd", "fill", "pos")

    def __init__(self, fd: int, fill: Callable[[int, int], bytes] | None = None) -> None:
        self.fd = fd
        self.fill = fill if fill is not None else read_ahead
        self.data = b""
        self.pos = 0

    def buffered(self) -> bool:
        """Whether bytes already read wait to be taken."""
        return self.pos < len(self.data)

    def has_frame(self) -> bool:
        """Whether a whole frame is already read: :meth:`next` returns it without reading."""
        data, pos = self.data, self.pos
        have = len(data) - pos
        if have < FRAME_SIZE.size:
            return False
        size: int = FRAME_SIZE.unpack_from(data, pos)[0]
        head = FRAME_SIZE.size
        if size == -1:
            head += FRAME_BIG_SIZE.size
            if have < head:
                return False
            size = FRAME_BIG_SIZE.unpack_from(data, pos + FRAME_SIZE.size)[0]
        return have >= head + size

    def whole(self) -> list[bytes]:
        """The frames already read whole, taken in one pass (many small messages come in one
        read); a frame the read cut stays for :meth:`next`."""
        data, pos, end = self.data, self.pos, len(self.data)
        frames: list[bytes] = []
        head, big = FRAME_SIZE.size, FRAME_BIG_SIZE.size
        while end - pos >= head:
            (size,) = FRAME_SIZE.unpack_from(data, pos)
            start = pos + head
            if size == -1:
                if end - start < big:
                    break
                (size,) = FRAME_BIG_SIZE.unpack_from(data, start)
                start += big
            if start + size > end:
                break
            frames.append(data[start : start + size])
            pos = start + size
        self.pos = pos
        return frames

    def await_bytes(self, seconds: float) -> bool:
        """Poll the socket, without sleeping in a read, for up to ``seconds`` until bytes come
        (kept for :meth:`next`) or its end does; the CPU is offered to others between polls
        (``sched_yield``). Whether anything came; ``False`` at once without the C library. A
        read that sleeps costs a wake-up when the bytes come, tens of microseconds on a VM: the
        worker's wait for a caller that submits one task at a time."""
        if _libc is None:
            return False
        end = time.perf_counter() + seconds
        while True:
            got = recv_now(self.fd, READ_CHUNK_BYTES)
            if got is not None:
                if got:  # b"": the end, which next()'s own read reports
                    self.data = self.data[self.pos :] + got
                    self.pos = 0
                return True
            if time.perf_counter() >= end:
                return False
            os.sched_yield()

    def next(self) -> bytes:
        """The next frame; raises ``EOFError`` when the stream ends (inside a frame too)."""
        (size,) = FRAME_SIZE.unpack(self._take(FRAME_SIZE.size))
        if size == -1:
            (size,) = FRAME_BIG_SIZE.unpack(self._take(FRAME_BIG_SIZE.size))
        return self._take(size)

    def _take(self, n: int) -> bytes:
        data, pos = self.data, self.pos
        end = pos + n
        if end <= len(data):
            self.pos = end
            return data if pos == 0 and end == len(data) else data[pos:end]
        chunks = [data[pos:]]
        have = len(data) - pos
        while have < n:
            chunk = self.fill(self.fd, n - have)
            if not chunk:
                raise EOFError("the stream ended inside a message")
            chunks.append(chunk)
            have += len(chunk)
        data = b"".join(chunks)
        self.data, self.pos = data, n
        return data if n == len(data) else data[:n]


def read_ahead(fd: int, missing: int) -> bytes:
    """A blocking read of at least what a frame lacks, more if it is there (the worker's)."""
    return os.read(fd, max(READ_CHUNK_BYTES, min(missing, 1 << 24)))


def read_held(fd: int, missing: int) -> bytes:
    """A read of at most what a frame lacks: held while its bytes come within
    :data:`FRAME_WAIT_MS`, else the ordinary (releasing) read."""
    chunk = recv_soon(fd, min(missing, FRAME_CHUNK_BYTES), FRAME_WAIT_MS)
    if chunk is None:
        chunk = os.read(fd, min(missing, 1 << 24))
    return chunk


def read_frames(fd: int) -> tuple[list[bytes], bool]:
    """The frames readable on the socket ``fd`` now (the monitor's read) — one read, and reads
    only to complete a frame that read cut — and whether the stream ended (at end of file, or
    inside a frame: the frames before it are whole)."""
    data = recv_now(fd, READ_CHUNK_BYTES)  # readable: the GIL kept ("System calls that keep...")
    if data is None:
        data = os.read(fd, READ_CHUNK_BYTES)  # not a socket, or an error: this call reports it
    if not data:
        return [], True
    reader = FrameReader(fd, read_held)
    reader.data = data
    frames = reader.whole()
    if reader.buffered():  # a frame the read cut: its sender is writing the rest now
        try:
            frames.append(reader.next())
        except (EOFError, OSError):
            return frames, True
    return frames, False
