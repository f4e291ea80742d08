"""The monitor thread: one per process, it waits on the hub's listening socket, every worker
socket, a wake pipe and the process sentinel of each worker still starting, and hands what it
reads to the hub (:class:`Handler`): messages, ends of file, deaths before hello, and the timers
when one is due.

Guarantees:

* It is the only thread that closes worker sockets while it runs (:meth:`Monitor.close_conn`
  queues a close for it from other threads; the socket's send lock keeps a send and a close
  apart), so it never reads a socket whose fd was freed and reused under it.
* One persistent ``poll`` set, synchronised with the live sockets each round and registered by
  fd number. Not epoll: epoll watches open file descriptions, and a forked child holding a copy
  of a socket the parent closed would keep firing events under an fd number that may belong to
  a new socket by then.
* A readable socket is read with one ``read`` for everything already in it (a quick task's
  ``Started`` and ``Done`` arrive together), split into ``multiprocessing.connection`` frames
  here; only a frame cut by the read is completed with blocking reads, as ``recv_bytes`` would.
  (``Connection.poll()`` after each message would build a new selector each time.)
* What the handlers leave for later (:meth:`Monitor.later`: the settles of a round's results)
  runs at the end of the round, once the next wait is prepared and just before it: the caller
  woken by a settled future then finds the interpreter lock free at once (the monitor is
  waiting), rather than after the monitor's next round of bookkeeping.
* An error inside one round is logged and the loop goes on: the monitor never dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

from ._held_io import read_now, recv_now, recv_soon, write_now
from ._messages import Message, decode
from ._state import WorkerHandle

log = logging.getLogger("precompile_executor")

READ_CHUNK_BYTES = 1 << 16
"""What one read takes from a readable socket: many small messages at once; a larger frame is
completed with reads of exactly what it still lacks."""

FRAME_CHUNK_BYTES = 1 << 20
"""The most one held read takes of a frame being completed (a compile's files: up to a few MiB)."""

FRAME_WAIT_MS = 2
"""How long a held read waits for more of a frame being completed. Its sender is writing it as
the reader drains the socket, so the bytes come within microseconds; a sender that stalls
longer (descheduled on a loaded machine) is waited for with the GIL released."""

LONGEST_WAIT_S = 3600.0
"""The longest the monitor waits in one round: a task's deadline or an idle worker's expiry
years away would overflow the poll's timeout (epoll takes an int of milliseconds, ~24.8 days);
it wakes, finds nothing due, and waits again (``test_contract.py``,
``test_a_timeout_of_years_runs_its_task_and_the_monitor_keeps_its_round``)."""

_SIZE = struct.Struct("!i")  # multiprocessing.connection's frame header
_BIG_SIZE = struct.Struct("!Q")  # after a size of -1: frames over 2 GiB


class Handler(Protocol):
    """What the monitor asks of the hub."""

    lock: threading.RLock

    def watch_list(self) -> dict[Any, int | None]:
        """Worker sockets (fd looked up on registration) and starting workers' sentinels
        (lock held)."""
        ...

    def next_timer(self) -> float | None:
        """Seconds until the next deadline or expiry (lock held)."""
        ...

    def check_timers(self) -> None: ...

    def dispatch(self, conn: Connection, message: Message) -> None: ...

    def eof(self, conn: Connection) -> None: ...

    def died_starting(self, worker: WorkerHandle) -> None: ...


class Monitor:
    """The monitor thread, its listening socket and wake pipe, the sockets not yet known."""

    def __init__(self, address: str, handler: Handler) -> None:
        self._handler = handler
        self._lock = handler.lock
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address)
        self.listener.listen(256)
        self.listener.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.unknown: list[Connection] = []  # accepted, no hello yet (lock held)
        self._to_close: list[tuple[Connection, threading.Lock]] = []  # (lock held)
        self._stopping = False
        self._later: list[tuple[Callable[..., None], tuple[Any, ...]]] = []  # its own thread's
        self._thread = threading.Thread(target=self._run, name="precompile-monitor", daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        """Whether the caller is the monitor thread."""
        return threading.get_ident() == self._thread.ident

    def later(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at the end of this round, just before the next wait (the monitor
        thread only: see :meth:`on_thread`)."""
        self._later.append((fn, args))

    def _run_later(self) -> None:
        while self._later:
            batch, self._later = self._later, []
            for fn, args in batch:
                try:
                    fn(*args)
                except BaseException:  # noqa: BLE001 - the monitor must never die
                    log.exception("precompile_executor monitor: unexpected error (continuing)")

    def private_fds(self) -> list[int]:
        """Descriptors a forked child must close at once."""
        return [self.listener.fileno(), self._wake_r, self._wake_w]

    def wake(self) -> None:
        """Make the monitor recompute its deadlines and the sockets it waits on."""
        if write_now(self._wake_w, b"x") is None:  # full (a wake is pending), or no libc
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"x")

    def close_conn(self, conn: Connection, send_lock: threading.Lock) -> None:
        """Close a worker socket now on the monitor's own thread (or once it stopped), else
        queue it for the monitor: closing one it may be polling would free the fd number for
        reuse under its feet."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            with send_lock, contextlib.suppress(OSError):
                conn.close()
            return
        with self._lock:
            self._to_close.append((conn, send_lock))
        self.wake()

    def stop(self) -> None:
        """End the thread, then close what it left: sockets never known, queued closes, the
        listener."""
        self._stopping = True
        self.wake()
        self._thread.join(timeout=5.0)  # no reads in flight from here on
        with self._lock:
            unknown, self.unknown = self.unknown, []
            to_close, self._to_close = self._to_close, []
        for conn, send_lock in to_close:
            with send_lock, contextlib.suppress(OSError):
                conn.close()
        for conn in unknown:
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(OSError):
            self.listener.close()

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        selector = selectors.PollSelector()
        selector.register(self.listener.fileno(), selectors.EVENT_READ, "listener")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        watched: dict[Any, int] = {}  # a worker socket, or a starting worker (its sentinel)
        while not self._stopping:
            try:
                self._round(selector, watched)
            except BaseException:  # noqa: BLE001 - the monitor must never die: log and go on
                log.exception("precompile_executor monitor: unexpected error (continuing)")
                time.sleep(0.01)
        self._run_later()  # nothing left behind when it stops
        for fd in watched.values():
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(fd)
        selector.close()

    def _round(self, selector: selectors.BaseSelector, watched: dict[Any, int]) -> None:
        handler = self._handler
        with self._lock:
            live = handler.watch_list()
            if self.unknown:
                live.update(dict.fromkeys(self.unknown))
            to_close, self._to_close = self._to_close, []
            timeout = handler.next_timer()
        if timeout is not None:  # a deadline years away: wake sooner and look again
            timeout = min(timeout, LONGEST_WAIT_S)
        due = None if timeout is None else time.monotonic() + timeout
        if live.keys() != watched.keys():  # most rounds: the same sockets as the last one
            self._resync(selector, watched, live)
        for conn, send_lock in to_close:  # unregistered by now (no longer live): safe to close
            with send_lock, contextlib.suppress(OSError):
                conn.close()
        self._run_later()  # the last thing before the wait (see the module doc)
        for key, _ in selector.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "wake":
                if read_now(self._wake_r, 4096) is None:
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.read(self._wake_r, 4096)
            elif isinstance(key.data, WorkerHandle):
                handler.died_starting(key.data)
            else:
                self._readable(key.data, key.fd)
        # Nothing falls due before ``due`` (what is set meanwhile is timed next round).
        if due is not None and time.monotonic() >= due:
            handler.check_timers()

    @staticmethod
    def _resync(
        selector: selectors.BaseSelector, watched: dict[Any, int], live: dict[Any, int | None]
    ) -> None:
        """Make the poll set (``watched``) what ``live`` says."""
        for key in [k for k in watched if k not in live]:
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(watched[key])
            del watched[key]
        for key, fd in live.items():
            if key in watched:
                continue
            try:
                fd = key.fileno() if fd is None else fd
                selector.register(fd, selectors.EVENT_READ, key)
            except (KeyError, ValueError, OSError):
                continue  # closed meanwhile: its end is handled elsewhere
            watched[key] = fd

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, OSError):
                return
            sock.setblocking(True)
            with self._lock:
                self.unknown.append(Connection(sock.detach()))

    def _readable(self, conn: Connection, fd: int) -> None:
        try:
            frames, ended = read_frames(fd)
        except OSError:  # a closed socket: the end
            frames, ended = [], True
        for frame in frames:
            try:
                message = decode(frame)
            except ValueError:  # a garbled stream: the end (what came before it counts)
                ended = True
                break
            self._handler.dispatch(conn, message)
            if conn.closed:
                return  # a handler closed it (a worker stopped while it started)
        if ended:
            self._handler.eof(conn)


def read_frames(fd: int) -> tuple[list[bytes], bool]:
    """The ``multiprocessing.connection`` frames readable on ``fd`` now — one read, and blocking
    reads only to complete a frame that read cut — and whether the stream ended (at end of
    file, or inside a frame: the frames before it are whole)."""
    data = recv_now(fd, READ_CHUNK_BYTES)  # readable: the GIL kept (_held_io.py says why)
    if data is None:
        data = os.read(fd, READ_CHUNK_BYTES)  # not a socket, or an error: this call reports it
    frames: list[bytes] = []
    pos = 0
    try:
        while pos < len(data):
            if len(data) - pos < _SIZE.size:
                data += _read_exactly(fd, _SIZE.size - (len(data) - pos))
            (size,) = _SIZE.unpack_from(data, pos)
            pos += _SIZE.size
            if size == -1:
                if len(data) - pos < _BIG_SIZE.size:
                    data += _read_exactly(fd, _BIG_SIZE.size - (len(data) - pos))
                (size,) = _BIG_SIZE.unpack_from(data, pos)
                pos += _BIG_SIZE.size
            end = pos + size
            if end > len(data):
                frames.append(data[pos:] + _read_exactly(fd, end - len(data)))
                return frames, False
            frames.append(data[pos:end])
            pos = end
    except (EOFError, OSError):
        return frames, True
    return frames, not data


def _read_exactly(fd: int, n: int) -> bytes:
    """The next ``n`` bytes of a frame ``fd``'s sender is writing: held reads while its bytes
    come within ``FRAME_WAIT_MS``, then the ordinary (releasing) read."""
    chunks = []
    while n > 0:
        chunk = recv_soon(fd, min(n, FRAME_CHUNK_BYTES), FRAME_WAIT_MS)
        if chunk is None:
            chunk = os.read(fd, min(n, 1 << 24))
        if not chunk:
            raise EOFError("the stream ended inside a message")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
