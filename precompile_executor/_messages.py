"""The wire messages between the parent and a worker: small named types, one encode/decode.

Parent → worker: :class:`Run`, :class:`Stop`. Worker → parent: :class:`Hello` once, then per
task :class:`Started` (before the task's code runs, so the parent knows a task that never
started from one that did) and :class:`Done`. A forked child sends only :class:`Done`.
Parent → template: :class:`ForkWorker`, :class:`Stop`; template → parent: :class:`Hello`, then
:class:`Forked` or :class:`ForkRefused` per request and :class:`Exited` per worker it reaps.

Both sides import this module; it imports nothing of the library but the error record.
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any, NamedTuple, Union

from ._errors import ErrorRecord
from ._held_io import send_now

Outcome = tuple[bool, Any]
"""One call's outcome: ``(True, cloudpickled value)`` or ``(False, ErrorRecord)``."""


class Run(NamedTuple):
    """Run one task: ``blob`` pickles ``(cloudpickled fn, cloudpickled [(args, kwargs), ...])``."""

    task_id: int
    n_calls: int
    want_output: bool
    blob: bytes


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

_JOIN_LIMIT = 16384  # as multiprocessing.connection: a larger body is not copied to join it


def write_frame(fd: int, data: bytes) -> None:
    """Write ``data`` as one ``multiprocessing.connection`` frame to the blocking socket ``fd``:
    the bytes ``Connection.send_bytes`` writes, in one ``write`` for a small message and with
    none of its Python-level layers (a warm task's send is on the monitor's path). Raises
    ``OSError`` as ``send_bytes`` does (a closed or broken socket)."""
    n = len(data)
    big = n > 0x7FFFFFFF
    header = FRAME_SIZE.pack(-1) + FRAME_BIG_SIZE.pack(n) if big else FRAME_SIZE.pack(n)
    if n <= _JOIN_LIMIT:
        _write_all(fd, header + data)
    else:
        _write_all(fd, header)
        _write_all(fd, data)


def send_frame(fd: int, data: bytes) -> None:
    """:func:`write_frame` for the caller's side (the hub): a frame the socket's buffer takes at
    once is sent keeping the GIL (:func:`._held_io.send_now`: a thread of the caller busy in C
    code would otherwise hold it as long as it likes before this thread got it back); the rest,
    if any, is written as :func:`write_frame` does."""
    n = len(data)
    if n > _JOIN_LIMIT:
        write_frame(fd, data)
        return
    frame = FRAME_SIZE.pack(n) + data
    sent = send_now(fd, frame) or 0
    if sent < len(frame):
        _write_all(fd, memoryview(frame)[sent:])


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
