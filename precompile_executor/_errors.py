"""Errors a task can end with, and the proxies that carry a worker's exception to the caller.

A worker never pickles an exception object: it writes a plain :class:`ErrorRecord` (strings,
numbers and tuples of them). The parent rebuilds the exception from that record with
:func:`proxy_from_record`, so no exception can break the pool — not one whose ``__init__`` needs
other arguments, not one holding a lock, not one whose class exists only in the worker.

``concurrent.futures.BrokenExecutor`` keeps the stdlib's and loky's meaning: the executor can run
no more tasks, rebuild it. Only :class:`WorkerStartError` is one (a worker could not start: the
initializer raised). A task that failed alone — :class:`WorkerCrashedError`, its dask subclass
``NodeLostError``, :class:`TaskTimeoutError` — is a :class:`RemoteError` and the executor goes on.
See docs/design.md, "Errors"; tested by ``tests/test_contract.py``
(``test_only_an_unusable_executor_raises_broken_executor``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import BrokenExecutor
from typing import Any, ClassVar, Literal

Classification = Literal["raise", "warn", "debug"]
"""What a batch does with a failure: raise it, log a warning, or log at debug level."""

_PLAIN_TYPES = (str, int, float, bool, bytes, type(None))


@dataclasses.dataclass(frozen=True)
class ErrorRecord:
    """A plain description of an exception raised in a worker: safe to pickle both ways.

    Attributes:
        exc_type: the class name, e.g. ``"ValueError"``.
        exc_module: the module that defines the class, e.g. ``"builtins"``.
        exc_qualname: the qualified name inside that module (``"Outer.Error"``,
            ``"task.<locals>.Error"``).
        args: the exception's ``args``, each plain value kept, anything else as its ``repr``.
        message: ``str(exception)`` as the worker saw it.
        traceback: the remote traceback, formatted.
        captured_output: what the task wrote to fd 1 and fd 2 until it failed.
        worker_pid: the process that ran the task.
    """

    exc_type: str
    exc_module: str
    exc_qualname: str
    args: tuple[Any, ...]
    message: str
    traceback: str
    captured_output: str = ""
    worker_pid: int = 0


def plain_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Return ``args`` with every value that is not plain data replaced by its ``repr``."""
    return tuple(_plain(a) for a in args)


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN_TYPES):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN_TYPES) for v in value):
        return type(value)(value) if type(value) in (tuple, list) else tuple(value)
    try:
        return repr(value)
    except Exception:  # a broken __repr__ must not break the record
        return f"<unrepresentable {type(value).__name__}>"


class RemoteError(Exception):
    """Base of every exception that a task raised in a worker process.

    A proxy is built in the parent from the worker's :class:`ErrorRecord`. Where the original class
    can be imported in the parent, the proxy is an instance of it too, so ``except ValueError``
    keeps working; its ``str()`` is the worker's message and its ``__cause__`` shows the remote
    traceback.

    Attributes:
        exc_type: the original class name.
        exc_module: the module of the original class.
        remote_traceback: the traceback formatted in the worker.
        captured_output: what the task wrote to stdout and stderr (fd level).
        classification: ``"raise"``, ``"warn"`` or ``"debug"``, set by the executor's ``classify``.
        worker_pid: the process that ran the task.
    """

    exc_type: str = ""
    exc_module: str = ""
    remote_traceback: str = ""
    captured_output: str = ""
    classification: Classification = "raise"
    worker_pid: int = 0
    _message: str | None = None
    _init_args: tuple[Any, ...] | None = None  # an error made here: pickled by these (_made_here)

    def __str__(self) -> str:
        if self._message is not None:
            return self._message
        return super().__str__()

    def __reduce__(self) -> Any:
        if self._init_args is not None:
            return (type(self), self._init_args)
        return (_rebuild_proxy, (self._record(),))

    def _made_here(self, init_args: tuple[Any, ...], worker_pid: int, captured_output: str) -> None:
        """Fill in an error the executor raises itself for a task (a timeout, a crash, a memory
        kill) rather than rebuilds from a worker's record: the fields a record would carry, and
        the constructor arguments it pickles by (a node pool's error crosses to the caller)."""
        self._init_args = init_args
        self.worker_pid = worker_pid
        self.captured_output = captured_output
        self.exc_type = type(self).__name__
        self.exc_module = type(self).__module__

    def _record(self) -> ErrorRecord:
        return ErrorRecord(
            exc_type=self.exc_type or type(self).__name__,
            exc_module=self.exc_module or type(self).__module__,
            exc_qualname=getattr(self, "_qualname", type(self).__qualname__),
            args=plain_args(tuple(self.args)),
            message=str(self),
            traceback=self.remote_traceback,
            captured_output=self.captured_output,
            worker_pid=self.worker_pid,
        )


class _RemoteTraceback(Exception):
    """Holds the worker's traceback text so the parent's printed traceback shows it."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


class TaskTimeoutError(RemoteError, TimeoutError):
    """The task ran past its timeout; its worker and the worker's process group were killed.

    Attributes:
        elapsed_s: seconds from the task's start on a worker to the kill.
        timeout_s: the timeout that applied.
    """

    def __init__(
        self, timeout_s: float, elapsed_s: float, worker_pid: int, captured_output: str = ""
    ) -> None:
        super().__init__(
            f"task ran for {elapsed_s:.2f}s, past its timeout of {timeout_s:g}s; worker pid "
            f"{worker_pid} and its process group were killed. Raise the timeout with "
            "executor.options(timeout=...) if the task is slow rather than stuck."
        )
        self.timeout_s = timeout_s
        self.elapsed_s = elapsed_s
        self._made_here(
            (timeout_s, elapsed_s, worker_pid, captured_output), worker_pid, captured_output
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


class TaskMemoryError(RemoteError, MemoryError):
    """The task's process group held more memory than its ``memory_limit``; the group was killed.

    Only this task fails; its worker is replaced. What is measured: the resident memory of the
    worker and every process under it, less the pages the worker shared with other processes
    (its warm template, libraries) when the task started — close to what the group's death gives
    back (docs/design.md, "Memory limits").

    Attributes:
        limit_bytes: the limit that applied.
        peak_bytes: the most the group was seen holding (the sample that passed the limit).
        worker_pid: the worker that ran the task.
        captured_output: what the task wrote until it was killed.
    """

    def __init__(
        self, limit_bytes: int, peak_bytes: int, worker_pid: int, captured_output: str = ""
    ) -> None:
        super().__init__(
            f"task's process group held {_mib(peak_bytes)}, past its memory_limit of "
            f"{_mib(limit_bytes)} ({limit_bytes} bytes); worker pid {worker_pid} and its process "
            "group were killed. Raise the limit with executor.options(memory_limit=...) if the "
            "task needs more, or find what it allocates (its output is attached)."
        )
        self.limit_bytes = limit_bytes
        self.peak_bytes = peak_bytes
        self._made_here(
            (limit_bytes, peak_bytes, worker_pid, captured_output), worker_pid, captured_output
        )


class WorkerCrashedError(RemoteError):
    """The worker running the task died (segfault, abort, ``os._exit``, SIGKILL, OOM killer).

    Only this task fails; the worker is replaced and every other task goes on. Not a
    ``BrokenExecutor``: the executor is fine, nothing needs rebuilding.

    Attributes:
        exitcode: the exit status (negative: killed by that signal), or ``None`` if unknown.
        signal_name: e.g. ``"SIGSEGV"`` when a signal killed it, else ``None``.
    """

    def __init__(
        self, worker_pid: int, exitcode: int | None, captured_output: str = "", detail: str = ""
    ) -> None:
        self.exitcode = exitcode
        self.signal_name = signal_name(exitcode)
        how = (
            f"killed by {self.signal_name}"
            if self.signal_name
            else (f"exited with code {exitcode}" if exitcode is not None else "died")
        )
        hint = " (SIGKILL often means the OOM killer: lower max_workers)" if exitcode == -9 else ""
        msg = f"worker pid {worker_pid} {how} while running the task{hint}"
        if detail:
            msg = f"{msg}; {detail}"
        super().__init__(msg)
        self._made_here(
            (worker_pid, exitcode, captured_output, detail), worker_pid, captured_output
        )
        self._detail = detail


class ClusterNodeLost(WorkerCrashedError):
    """The base of each cluster backend's ``NodeLostError``: the node that held the task was
    lost; only the tasks it held fail (docs/design.md, "Errors"). A subclass says how the node
    was lost (:attr:`LOST`) and where to look (:attr:`LOG`).

    Attributes:
        node: the node's name in its backend (a dask worker's address, a Ray node id).
    """

    LOST: ClassVar[str]
    """What happened to the node, ``{node}`` its name: ``"dask worker {node} left the cluster"``."""
    LOG: ClassVar[str]
    """The node's log that tells why, and the usual causes: ``"log (an OOM kill, …)"``."""

    def __init__(self, node: str, detail: str = "") -> None:
        msg = (
            f"{self.LOST.format(node=node)} while it held the task; the task is not re-run (it "
            "may be the cause). The other tasks go on on the remaining nodes; check that node's "
            f"{self.LOG}"
        )
        super().__init__(0, None, detail=detail)
        self._message = f"{msg}; {detail}" if detail else msg
        self.args = (self._message,)
        self.node = node
        self._init_args = (node, detail)


class SerializationError(TypeError):
    """``fn`` or one of its arguments could not be serialized for a spawned worker."""


class ResultSerializationError(RemoteError, TypeError):
    """The task's result could not be pickled in the worker or unpickled in the parent."""


class WorkerStartError(BrokenExecutor):
    """A worker could not be started (for example, the ``initializer`` raised).

    A ``concurrent.futures.BrokenExecutor``, as in the stdlib pools: the executor is broken, its
    queued tasks fail with this error and every later ``submit()`` raises it. Build a new
    executor once the cause is fixed.
    """


AFTER_SHUTDOWN = "cannot schedule new futures after shutdown"
"""``submit()`` on a shut-down executor or view: the stdlib pools' ``RuntimeError`` message."""


def unpickle_error(exc: BaseException) -> ResultSerializationError:
    """The error of a task whose value came back but would not unpickle in the caller (every
    backend: the value crossed the wire fine, the caller lacks what it needs to rebuild it)."""
    return ResultSerializationError(
        f"the task's result could not be unpickled in the parent: {type(exc).__name__}: {exc}. "
        "Return plain data, or make its class importable in the caller."
    )


class CudaInForkError(RuntimeError):
    """A task on the fork path tried to initialize CUDA in the forked child."""


def signal_name(exitcode: int | None) -> str | None:
    """Return ``"SIGSEGV"`` for an exit code of ``-11``, ``None`` for a normal exit code."""
    import signal

    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


_proxy_classes: dict[tuple[str, str], type[RemoteError]] = {}
_proxy_lock = threading.Lock()


def _find_class(module: str, qualname: str) -> type[BaseException] | None:
    if "<locals>" in qualname:
        return None
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except Exception:
            return None
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return obj
    return None


def _proxy_class(module: str, qualname: str, name: str) -> type[RemoteError]:
    key = (module, qualname)
    with _proxy_lock:
        cls = _proxy_classes.get(key)
        if cls is not None:
            return cls
        original = _find_class(module, qualname)
        bases: tuple[type, ...] = (RemoteError,)
        if original is not None and issubclass(original, RemoteError):
            bases = (original,)
        elif original is not None and original not in (Exception, BaseException):
            # Not only Exception subclasses: a task's SystemExit or KeyboardInterrupt comes back
            # as one, as from the stdlib pools (``except SystemExit`` keeps working).
            bases = (RemoteError, original)
        try:
            cls = type(name, bases, {"__module__": module, "__qualname__": qualname})
        except TypeError:
            # Incompatible layouts (a C class that forbids subclassing, say): keep the name only.
            cls = type(name, (RemoteError,), {"__module__": module, "__qualname__": qualname})
        _proxy_classes[key] = cls
        return cls


def _new_exception(cls: type[RemoteError], args: tuple[Any, ...]) -> RemoteError:
    # Never call the original __init__ (it may need other arguments); the builtin base with the
    # largest layout gives a correctly laid-out instance, and its own __init__ only fills its
    # fields (SystemExit.code, OSError.errno, ...).
    builtin = [
        b
        for b in cls.__mro__
        if b.__module__ == "builtins" and b is not object and not issubclass(b, RemoteError)
    ]
    solid = max(builtin, key=lambda b: b.__basicsize__)
    new: Any = solid.__new__
    try:
        obj = new(cls, *args)
    except Exception:
        obj = new(cls)
    with contextlib.suppress(Exception):
        solid.__init__(obj, *args)
    with contextlib.suppress(Exception):
        obj.args = args
    assert isinstance(obj, RemoteError)
    return obj


def proxy_from_record(record: ErrorRecord) -> RemoteError:
    """Build the exception to raise in the parent for a worker's :class:`ErrorRecord`.

    Args:
        record: the worker's description of the exception.

    Returns:
        A :class:`RemoteError` that is also an instance of the original class where that class
        can be imported here; ``__cause__`` holds the remote traceback.
    """
    cls = _proxy_class(record.exc_module, record.exc_qualname, record.exc_type)
    exc = _new_exception(cls, tuple(record.args))
    exc._message = record.message
    exc.exc_type = record.exc_type
    exc.exc_module = record.exc_module
    exc.remote_traceback = record.traceback
    exc.captured_output = record.captured_output
    exc.worker_pid = record.worker_pid
    exc._qualname = record.exc_qualname  # type: ignore[attr-defined]
    if record.traceback:
        exc.__cause__ = _RemoteTraceback(record.traceback)
    return exc


def _rebuild_proxy(record: ErrorRecord) -> RemoteError:
    return proxy_from_record(record)


def record_from_exception(
    exc: BaseException, traceback_text: str, captured_output: str, pid: int
) -> ErrorRecord:
    """Describe ``exc`` as plain data (worker side). Never raises."""
    cls = type(exc)
    try:
        message = str(exc)
    except Exception:
        message = f"<{cls.__name__} with a failing __str__>"
    try:
        args = plain_args(tuple(exc.args))
    except Exception:
        args = (message,)
    return ErrorRecord(
        exc_type=cls.__name__,
        exc_module=getattr(cls, "__module__", None) or "builtins",
        exc_qualname=getattr(cls, "__qualname__", cls.__name__),
        args=args,
        message=message,
        traceback=traceback_text,
        captured_output=captured_output,
        worker_pid=pid,
    )


__all__ = [
    "AFTER_SHUTDOWN",
    "Classification",
    "CudaInForkError",
    "ErrorRecord",
    "RemoteError",
    "ResultSerializationError",
    "SerializationError",
    "TaskMemoryError",
    "TaskTimeoutError",
    "WorkerCrashedError",
    "WorkerStartError",
    "proxy_from_record",
    "record_from_exception",
    "signal_name",
    "unpickle_error",
]


def classification(
    exc: BaseException,
    hook: Callable[[BaseException], Classification] | None,
    ignore_errors: bool,
    default: Classification = "raise",
) -> Classification:
    """The one classification rule: ``"debug"`` under ``ignore_errors``; else the ``classify``
    hook's verdict (``"raise"`` if it raises or answers something else); ``default`` without
    a hook."""
    if ignore_errors:
        return "debug"
    if hook is None:
        return default
    try:
        verdict = hook(exc)
    except Exception:  # noqa: BLE001 - a broken hook must not lose the task's error
        logging.getLogger("precompile_executor").exception(
            "the classify hook raised; treating the error as 'raise'"
        )
        return "raise"
    return verdict if verdict in ("raise", "warn", "debug") else "raise"
