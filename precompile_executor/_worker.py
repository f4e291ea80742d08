"""Worker-side code: runs inside a loky worker (the serve loop) or a forked child (one task).

Nothing here imports the parent-side executor. A worker talks to the parent over one
``multiprocessing.connection`` socket with the messages of :mod:`._wire`: ``Hello`` once,
then for each ``Run`` a ``Started`` (before anything of the task is unpickled or run, so a task
whose worker dies before that point is known never to have started) and a ``Done``.

The task's stdout and stderr are captured at the file-descriptor level into a file whose path
the parent chose, so the parent can read it even after the worker was killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import pickle
import re
import resource
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Client, Connection
from typing import Any, NoReturn

import cloudpickle

from . import _stdlib
from ._errors import ErrorRecord, record_from_exception
from ._wire import (
    JOIN_LIMIT,
    Done,
    FrameReader,
    Hello,
    Outcome,
    Run,
    Started,
    decode,
    encode,
    write_frame,
    write_frames,
)

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
"""One call of a task: ``(fn, args, kwargs)`` (the one definition: every module imports it)."""

CAPTURE_LIMIT_BYTES = 1 << 20
"""Keep at most the last 1 MiB of a task's output: compiler logs can be huge."""


class OutputCapture:
    """Points fd 1 and fd 2 of this process at one file, emptied before each task.

    A task that writes nothing costs one ``fstat`` (:meth:`take`): the file is emptied only when
    something was written, before the next task starts (:meth:`begin`). Output written between
    two tasks — by a thread a task left running — goes to the next task's output.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self.empty = False  # known to be empty: begin() need not truncate it
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os.dup2(self.fd, 1)
        os.dup2(self.fd, 2)
        # Python-level writes go to fd 1 and 2 too, even where the parent had replaced
        # sys.stdout (pytest's capture, a notebook's stream) before a fork.
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
        # A segfault or abort writes the Python stack into the capture file, next to the output.
        # disable() first: enable() on an already-enabled faulthandler (inherited through a fork)
        # only changes its file and does not put its signal handlers back, so a library in the
        # parent that took SIGSEGV over would leave this process without a dump
        # (tests/test_faults.py, test_a_segfault_dump_survives_a_parent_that_took_sigsegv_over).
        faulthandler.disable()
        faulthandler.enable(file=2, all_threads=True)

    def reset(self) -> None:
        """Empty the file: what follows belongs to the next task."""
        os.ftruncate(self.fd, 0)
        self.empty = True

    def begin(self) -> None:
        """Before a task: empty the file unless it is known to be empty already."""
        if not self.empty:
            self.reset()

    def read(self) -> str:
        """Return what the current task wrote, flushing Python's own buffers first."""
        self.flush()
        self.empty = False
        return read_capture_file(self.fd)

    def take(self, wanted: bool) -> str | None:
        """After a task: its output if ``wanted`` (``""`` when it wrote nothing), else ``None``;
        the file stays known-empty when nothing was written, so the next :meth:`begin` is free."""
        self.flush()
        if os.fstat(self.fd).st_size == 0:
            return "" if wanted else None
        self.empty = False
        return read_capture_file(self.fd) if wanted else None

    @staticmethod
    def flush() -> None:
        """Write out Python's own buffers of ``sys.stdout`` and ``sys.stderr``."""
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                try:
                    stream.flush()
                except (OSError, ValueError):  # closed or broken by the task
                    pass


def read_capture_file(fd_or_path: int | str) -> str:
    """Read a capture file (by fd or path), keeping its last :data:`CAPTURE_LIMIT_BYTES`."""
    if isinstance(fd_or_path, str):
        try:
            fd = os.open(fd_or_path, os.O_RDONLY)
        except OSError:
            return ""
        try:
            return read_capture_file(fd)
        finally:
            os.close(fd)
    size = os.fstat(fd_or_path).st_size
    if size == 0:
        return ""
    start = max(0, size - CAPTURE_LIMIT_BYTES)
    data = os.pread(fd_or_path, size - start, start)
    text = data.decode("utf-8", errors="replace")
    if start:
        text = f"[... {start} earlier bytes cut ...]\n{text}"
    return text


STICKY_CUDA_ERROR = re.compile(
    r"illegal memory access|misaligned address|unspecified launch failure|illegal instruction"
    # not a bare "device-side assert": torch appends a hint naming it to every CUDA error
    r"|device-side assert triggered|cudaErrorIllegalAddress|cudaErrorLaunchFailure"
    r"|CUDA_ERROR_ILLEGAL_ADDRESS"
    r"|cudaErrorMisalignedAddress|CUDA_ERROR_MISALIGNED_ADDRESS|CUDA_ERROR_LAUNCH_FAILED",
    re.IGNORECASE,
)
"""CUDA errors after which the process's CUDA context stays broken ("sticky" errors)."""


def is_sticky_cuda_error(record: ErrorRecord) -> bool:
    """Whether a task's error leaves this process's CUDA context unusable."""
    return bool(
        STICKY_CUDA_ERROR.search(record.message) or STICKY_CUDA_ERROR.search(record.exc_type)
    )


def worker_device() -> str | None:
    """In a pinned worker, the device it was pinned to (its ``CUDA_VISIBLE_DEVICES``)."""
    return os.environ.get("PRECOMPILE_EXECUTOR_DEVICE")


PLAIN_TYPES = (int, float, bool, str, bytes, type(None))
"""Exact types whose pickle is only data: loading it imports nothing and runs no code."""

PLAIN_RESULT_BYTES = 1 << 16
"""A plain value pickled larger than this is decoded on a settle thread, like any other."""


def run_calls(calls: Sequence[Call], pid: int) -> tuple[list[Outcome], bool]:
    """Run each call; never raises. Values are cloudpickled here, so a result that cannot be
    pickled fails its own call only. Also says whether every call returned a small value of
    one of :data:`PLAIN_TYPES` (``Done.plain``)."""
    outcomes: list[Outcome] = []
    plain = True
    for fn, args, kwargs in calls:
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a task fails the task only
            outcomes.append((False, _record(exc, pid)))
            plain = False
            continue
        try:
            if type(value) in PLAIN_TYPES:  # the same bytes as cloudpickle's, made faster
                payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
                plain = plain and len(payload) <= PLAIN_RESULT_BYTES
            else:
                payload = cloudpickle.dumps(value)
                plain = False
        except BaseException as exc:  # noqa: BLE001
            outcomes.append((False, _result_record(value, exc, pid)))
            plain = False
            continue
        outcomes.append((True, payload))
    return outcomes, plain


def _record(exc: BaseException, pid: int) -> ErrorRecord:
    return record_from_exception(exc, traceback.format_exc(), "", pid)


def _result_record(value: Any, exc: BaseException, pid: int) -> ErrorRecord:
    message = (
        f"the task's result of type {type(value).__qualname__} could not be pickled to send it "
        f"back: {type(exc).__name__}: {exc}. Return plain data (bytes, numbers, dicts) instead."
    )
    return ErrorRecord(
        exc_type="ResultSerializationError",
        exc_module="precompile_executor._errors",
        exc_qualname="ResultSerializationError",
        args=(message,),
        message=message,
        traceback=traceback.format_exc(),
        worker_pid=pid,
    )


def with_output(outcomes: list[Outcome], output: str) -> list[Outcome]:
    """Attach the task's captured output to each error record."""
    fixed: list[Outcome] = []
    for ok, payload in outcomes:
        if not ok and isinstance(payload, ErrorRecord) and not payload.captured_output:
            payload = ErrorRecord(**{**payload.__dict__, "captured_output": output})
        fixed.append((ok, payload))
    return fixed


FUNCTION_CACHE_SIZE = 16
"""Unpickled task functions a worker keeps, keyed by their pickled bytes (:func:`load_function`)."""

FUNCTION_CACHE_BYTES = 1 << 16
"""Only functions pickled in at most this many bytes are kept: a closure over a large object
is not held alive in the worker, and its unpickling costs its data anyway."""

_functions: dict[bytes, Callable[..., Any]] = {}


def load_function(fn_blob: bytes) -> Callable[..., Any]:
    """The task function pickled in ``fn_blob``, unpickled once per worker for its bytes.

    A function pickled by reference (a module's function) is an import lookup either way. One
    pickled by value (defined in ``__main__``, a lambda, a closure) is unpickled once, and later
    tasks with the same bytes call the same function object — as the stdlib pool's workers reuse
    a module's function: state it keeps on itself or in its globals stays between tasks on one
    worker. Changed in the caller (its code, defaults or captured values), it pickles to other
    bytes and is loaded afresh. docs/design.md, "Per-task overhead".
    """
    fn = _functions.get(fn_blob)
    if fn is None:
        fn = cloudpickle.loads(fn_blob)
        if len(fn_blob) <= FUNCTION_CACHE_BYTES:
            if len(_functions) >= FUNCTION_CACHE_SIZE:
                del _functions[next(iter(_functions))]  # the oldest
            _functions[fn_blob] = fn
    return fn


def execute(
    blob: bytes, n_calls: int, want_output: bool, capture: OutputCapture
) -> tuple[list[Outcome], str | None, bool]:
    """Run one task message's calls with its output captured; return the ``done`` fields
    (outcomes, output, plain)."""
    pid = os.getpid()
    capture.begin()
    try:
        fn_blob, args_blob = pickle.loads(blob)
        fn = load_function(fn_blob)
        calls = [(fn, args, kwargs) for args, kwargs in cloudpickle.loads(args_blob)]
    except BaseException as exc:  # noqa: BLE001 - e.g. a module missing in the worker
        outcomes: list[Outcome] = [(False, _record(exc, pid))] * n_calls
        plain = False
    else:
        outcomes, plain = run_calls(calls, pid)
    for ok, _ in outcomes:
        if not ok:
            output = capture.read()
            return with_output(outcomes, output), output, plain
    return outcomes, capture.take(want_output), plain


def become_group_leader() -> None:
    """Start a new session so a kill of the group also reaches compiler grandchildren.

    Also turns core dumps off: a crashing compile should fail fast, not write gigabytes first.
    """
    try:
        os.setsid()
    except OSError:
        pass  # already a group leader
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@dataclasses.dataclass(frozen=True)
class Startup:
    """What the parent gives a process it starts: a spawn worker (:func:`serve`) or a warm
    template (:func:`._fork_server.serve_template`).

    Attributes:
        address: the parent's Unix socket.
        token: identifies this process to the parent.
        capture_path: where its fd 1 and fd 2 go.
        init_blob: cloudpickled ``(initializer, initargs)``, or ``None`` (a worker forked from a
            template: the template ran it already).
        max_tasks: a worker leaves after this many tasks (``max_tasks_per_child``); ``None``:
            never. A template runs no task (its forked workers get theirs with each request).
    """

    address: str
    token: str
    capture_path: str
    init_blob: bytes | None
    max_tasks: int | None = None


def serve(start: Startup) -> None:
    """A spawn worker's life: connect, run the initializer, then serve tasks until told to stop.

    Runs in a fresh interpreter started by loky, or in a child forked from a warm template
    (:mod:`._fork_server`, ``init_blob`` ``None``: the template ran it already).
    """
    drop_inherited_trackers()
    become_group_leader()
    conn, capture, ok = connect_and_initialize(start, open_cuda=True)
    if ok:
        serve_tasks(conn, capture, start.max_tasks)
    conn.close()


def serve_interpreter(start: Startup) -> NoReturn:
    """A worker started as a fresh interpreter (loky's target): :func:`serve`, then
    :func:`end_interpreter`. A worker forked from a template ends in ``_fork_server``."""
    serve(start)
    end_interpreter()


def end_interpreter() -> NoReturn:
    """End a process loky started — a template, or a worker started as an interpreter — the
    quick way: run its ``atexit`` hooks (an initializer's, a task's, multiprocessing's) as a
    normal exit would, flush stdio, then ``os._exit(0)``.

    What this skips is the interpreter's teardown, which frees every module one by one: 0.96 s
    with torch and Inductor imported (the dev box, against 0.04 s for the hooks and
    ``os._exit``), and the caller's own exit waits for each process it stops (docs/design.md,
    "Process lifecycle"; ``tests/test_interleavings.py``,
    ``test_a_process_the_pool_stops_runs_its_exit_hooks_and_skips_the_teardown``). Also
    skipped, as in a process ``multiprocessing`` forks: joining non-daemon threads a task left
    running, which could keep the process past its stop. A worker forked from a template ends
    with ``os._exit`` alone, as those do: the hooks it holds are its template's.
    """
    try:
        _stdlib.run_exit_hooks()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)


def drop_inherited_trackers() -> None:
    """Close the caller's resource-tracker pipes that loky hands every process it starts.

    loky passes each child the write end of the caller's ``multiprocessing`` resource tracker
    (and of its own), so the child's semaphores and shared memory register there. A warm worker
    lives for minutes after its executor is gone; holding that pipe, it keeps the tracker from
    seeing end of file, and a caller that stops its tracker (``resource_tracker._stop()``, as
    CPython's test harness does) blocks until the worker's idle timeout
    (``tests/test_limits.py::test_warm_workers_do_not_hold_the_callers_resource_tracker``). A
    task that needs a tracker gets its own, started on first use and ended with the worker.
    """
    trackers: list[Any] = [_stdlib.resource_tracker()]
    loky_tracker = sys.modules.get("loky.backend.resource_tracker")
    if loky_tracker is not None:
        trackers.append(loky_tracker._resource_tracker)  # loky's: a subclass of the stdlib's
    for tracker in trackers:
        _stdlib.drop_tracker_pipe(tracker)


def open_cuda_context() -> None:
    """In a worker pinned to a GPU whose initializer imported torch: create the CUDA context now.

    A pinned worker is there to run kernels; creating its context before it says hello moves
    that cost (a fraction of a second each, more when many workers start at once) out of its
    first task and into ``warm_up()``. Never imports torch itself and never fails the start: a
    CUDA that does not work shows in the first GPU task's own error.
    """
    torch = sys.modules.get("torch")
    if torch is None or worker_device() is None:
        return
    with contextlib.suppress(Exception):
        torch.cuda.init()
        torch.empty(1, device="cuda")


def connect_and_initialize(
    start: Startup, *, open_cuda: bool = False
) -> tuple[Connection, OutputCapture, bool]:
    """Connect to the parent, capture fd 1/2, run the initializer and say hello.

    A parent that is gone already makes the connect fail, so the process ends rather than
    outliving it. Returns the socket, the capture, and whether the initializer succeeded.
    With ``open_cuda`` (workers, never a template), :func:`open_cuda_context` runs before hello.
    """
    conn: Connection = Client(start.address, family="AF_UNIX")
    capture = OutputCapture(start.capture_path)
    pid = os.getpid()
    failure: ErrorRecord | None = None
    if start.init_blob is not None:
        capture.reset()
        try:
            initializer, initargs = cloudpickle.loads(start.init_blob)
            initializer(*initargs)
        except BaseException as exc:  # noqa: BLE001
            failure = record_from_exception(exc, traceback.format_exc(), capture.read(), pid)
    if failure is None and open_cuda:
        open_cuda_context()
    conn.send_bytes(encode(Hello(start.token, pid, failure)))
    return conn, capture, failure is None


LINGER_S = 200e-6
"""How long a worker polls for the next ``Run`` after a short lone task (``Run.lone``) before it
sleeps in a read. A caller that submits one task at a time sends the next within this (its
result's way back and its next ``submit()``: ~130 µs on 2 cores), and finds the worker awake
instead of paying its wake-up (~30 µs on a VM): a warm round trip 0.79–0.81× as long on 2 cores
(docs/benchmarks.md, "Per-task overhead"). Not after a task sent with others queued behind
it: a ``map``'s workers are fed ahead, and polling workers would take the CPU its caller and
monitor need."""

LINGER_AFTER_S = 0.01
"""Only after a task shorter than this: after a long one (a compile) the ~200 µs would be spent
for a wake-up that is noise beside the task."""


def serve_tasks(conn: Connection, capture: OutputCapture, max_tasks: int | None = None) -> None:
    """Run each task the parent sends until it says stop or goes away, or (``max_tasks``)
    until this many tasks ran: the last one's ``Done`` says ``recycle``, and the process ends.

    A task's ``Done`` whose next ``Run`` is already read (sent ahead) goes out in one write with
    that task's ``Started``: the parent reads both at once, and nothing waits longer for it."""
    ran = 0
    fd = conn.fileno()
    frames = FrameReader(fd)
    pending: bytes | None = None  # a Done to write with the next task's Started
    try:
        while True:
            try:
                message = decode(frames.next())
            except (EOFError, OSError, ValueError):
                break  # the parent went away or closed us: leave quietly
            if not isinstance(message, Run):
                break
            started = encode(Started(message.task_id))
            if pending is not None:
                write_frames(fd, [pending, started])
                pending = None
            else:
                write_frame(fd, started)
            began = time.monotonic()
            outcomes, output, plain = execute(
                message.blob, message.n_calls, message.want_output, capture
            )
            retire = any(not ok and is_sticky_cuda_error(rec) for ok, rec in outcomes)
            ran += 1
            recycle = not retire and max_tasks is not None and ran >= max_tasks
            done = encode(Done(message.task_id, outcomes, output, retire, recycle, plain))
            if retire or recycle:
                write_frame(fd, done)
                break  # CUDA context unusable, or max_tasks_per_child reached: it is replaced
            if len(done) <= JOIN_LIMIT and frames.has_frame():
                pending = done  # the next Run is here: its Started goes with this
            else:
                write_frame(fd, done)
                if message.lone and time.monotonic() - began < LINGER_AFTER_S:
                    frames.await_bytes(LINGER_S)
        if pending is not None:
            write_frame(fd, pending)
    except (EOFError, OSError):
        pass  # the parent went away: leave quietly
