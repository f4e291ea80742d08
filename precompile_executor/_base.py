"""The public layer every backend shares: :class:`BaseExecutor` and the :class:`Backend` it drives.

CPython keeps the contract once in ``concurrent/futures/_base.py`` and pebble keeps the pool's
lifecycle once in ``BasePool``; here :class:`BaseExecutor` holds, for every backend (the local
``PrecompileExecutor``, ``DaskPrecompileExecutor``, and any next one): ``submit``, ``map`` with
``chunksize`` and ``buffersize``, the ``options()`` views, ``batch()``, ``shutdown``,
``interrupt``, the context manager, the "after shutdown" message, the serialization-failure
message, and the registry behind :func:`kill_running_futures` (what :func:`wait_for_all` kills on
Ctrl-C).

A backend is two small pieces:

* a :class:`Backend`: the state an executor shares with its views (its queue, its tasks in flight,
  its counters), with the requests below;
* a subclass of :class:`BaseExecutor` whose constructor validates its own settings, builds the
  backend and calls ``BaseExecutor.__init__(self, backend, TaskOptions(...))``, and which
  implements :meth:`BaseExecutor._send`: send one task (a call, or a chunk of calls) and return
  its future. Optional: :meth:`BaseExecutor._prepare_map` (work done once per ``map``),
  :meth:`BaseExecutor._check_path`, :meth:`BaseExecutor._check_memory_limit` (a backend that
  enforces limits), :meth:`BaseExecutor._check_resources` (a backend that routes by resources),
  and ``CHUNKS = False`` for a backend that sends each call of a ``map`` as its own task
  whatever ``chunksize`` says. The cluster backends share one such subclass,
  :class:`._cluster_executor.ClusterExecutor`.

A subclass keeps no attribute of its own: what it needs is in its backend (shared with its views)
or in the view's :class:`TaskOptions`, so a view is built by :meth:`BaseExecutor.__init__` alone.

Who owns what: an executor and its views share the backend; a view's outstanding futures are in
its ``_mine`` set, added under its ``_mine_lock`` and discarded by a done-callback that takes no
lock (a backend may cancel a future while holding its own lock: ``_mine_lock`` is always taken
before the backend's lock, never after).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import itertools
import logging
import math
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from concurrent.futures import Executor, Future
from concurrent.futures import wait as futures_wait
from typing import Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar

from ._errors import AFTER_SHUTDOWN, SerializationError
from ._stdlib import own_callback
from ._validate import (
    check_buffersize,
    check_chunksize,
    check_cost,
    check_flag,
    check_path,
    check_priority,
    check_timeout,
    short_repr,
)
from ._worker import Call as Call  # one call of a task: (fn, args, kwargs)

log = logging.getLogger("precompile_executor")

T = TypeVar("T")
E = TypeVar("E")
Path = Literal["spawn", "fork", "auto"]

KILL_WAIT_S = 10.0
"""How long :func:`kill_running_futures` waits for the killed tasks' futures to fail: a kill is
a signal to a process group, the future fails once the group is gone (well under a second)."""


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """The per-task settings of an executor or a view (``options()``), validated.

    Attributes:
        timeout: seconds from the task's start on a worker, or ``None``.
        path: ``"spawn"``, ``"fork"`` or ``"auto"`` (a backend may allow fewer).
        priority: higher starts first among queued tasks.
        with_output: results come back as ``TaskResult`` with the captured output.
        cost: a hint, the seconds a call is expected to take, or ``None``.
        memory_limit: bytes the task's process group may hold, or ``None`` (a backend that
            enforces it takes it in its own ``options()``; docs/design.md, "Memory limits").
        resources: amounts a node must have to take the task, sorted (hashable); ``()`` for
            any node (a backend that routes by resources takes them: the Ray backend).
    """

    timeout: float | None = None
    path: Path = "spawn"
    priority: float = 0.0
    with_output: bool = False
    cost: float | None = None
    memory_limit: int | None = None
    resources: tuple[tuple[str, float], ...] = ()


class Backend(Protocol):
    """What :class:`BaseExecutor` asks of the state an executor shares with its views.

    Every method is called with no lock held and may block only where it says so.
    """

    def hold(self) -> None:
        """A ``batch()`` block begins: dispatch nothing until it ends (blocks may nest)."""

    def release(self) -> None:
        """A ``batch()`` block ends: dispatch what waits, best first."""

    def begin_shutdown(self, *, cancel_futures: bool = False) -> None:
        """Take no new tasks; cancel the unstarted ones if asked. Does not wait."""

    def join(self) -> None:
        """Block until every task is resolved and nothing of the executor is left running."""

    def interrupt(self) -> None:
        """Cancel every unstarted task and kill the running ones (what Ctrl-C does)."""

    def kill(self, futures: AbstractSet[Future[Any]]) -> list[Future[Any]]:
        """Kill the tasks running any of ``futures``; return the futures it killed."""


B = TypeVar("B", bound=Backend)

_backends: weakref.WeakSet[Backend] = weakref.WeakSet()
"""Every live executor's backend in this process, for :func:`kill_running_futures`."""
_backends_lock = threading.Lock()


class DroppedExecutors:
    """Executors dropped without ``shutdown()``: each is shut down (``begin_shutdown()``: no
    new tasks, what was submitted still runs) off the thread that collected it.

    The garbage collector runs a finalizer on whatever thread happens to allocate: one holding
    a hub's lock mid-update (an ``RLock``: the finalizer would re-enter it), or a thread that
    the lock's holder is starting and waiting for — a deadlock
    (``tests/test_contract.py::test_a_dropped_executor_is_shut_down_off_the_thread_that_collects_it``).
    So the finalizer only puts the backend on a ``queue.SimpleQueue``, whose ``put`` is
    reentrant (documented safe in ``__del__`` methods and weakref callbacks). A daemon thread,
    started with an executor and never from a finalizer, shuts each one down; a new executor
    first shuts down those still waiting (and waits for the one in hand), so the workers of an
    executor dropped just before are back in the pool for it, as they were when the finalizer
    did it itself.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Backend] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._in_hand = threading.Lock()  # held while a backend taken off the queue shuts down

    def drop(self, backend: Backend) -> None:
        """The finalizer's part: hand ``backend`` on; no lock, no wait."""
        self._queue.put(backend)

    def settle(self) -> None:
        """Shut down every executor dropped so far (an executor is being built: no lock held),
        and start the thread that shuts down later ones."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="precompile-dropped-executors", daemon=True
                )
                self._thread.start()
        with self._in_hand:
            while True:
                try:
                    backend = self._queue.get_nowait()
                except queue.Empty:
                    return
                _shut_down_dropped(backend)

    def _serve(self) -> None:
        while True:
            backend = self._queue.get()
            with self._in_hand:
                _shut_down_dropped(backend)
            del backend  # hold no backend while waiting for the next


def _shut_down_dropped(backend: Backend) -> None:
    try:
        backend.begin_shutdown()
    except Exception:  # noqa: BLE001 - a finalizer's work: nobody to raise to
        log.warning("shutting down a dropped executor failed", exc_info=True)


_dropped = DroppedExecutors()


def _forget_dropped_in_child() -> None:
    global _dropped
    _dropped = DroppedExecutors()  # the thread is not copied by fork


os.register_at_fork(after_in_child=_forget_dropped_in_child)


def _drop(backend: Backend) -> None:
    _dropped.drop(backend)


class BaseExecutor(Executor, Generic[B]):
    """The ``concurrent.futures.Executor`` layer shared by every backend (see the module
    docstring for what a backend supplies)."""

    CHUNKS: ClassVar[bool] = True
    """Whether ``map(chunksize=n)`` sends n calls as one task (``False``: one task per call)."""

    def __init__(self, backend: B, options: TaskOptions, parent: Self | None = None) -> None:
        """Set up the shared layer; a subclass's constructor calls this once it has built
        ``backend``, and :meth:`options` calls it (alone) to build a view."""
        self._backend = backend
        self._options = options
        self._parent = parent  # a view keeps its executor (and that one's finalizer) alive
        self._closed = False  # a view's own shutdown
        self._mine: set[Future[Any]] = set()  # a view's futures not yet done
        self._mine_lock = threading.Lock()
        if parent is None:
            _dropped.settle()
            with _backends_lock:
                _backends.add(backend)
            # Dropped without shutdown(): stop taking tasks, let what was submitted run.
            weakref.finalize(self, _drop, backend).atexit = False

    # -- submitting ------------------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Schedule ``fn(*args, **kwargs)``; return a standard ``concurrent.futures.Future``.

        Raises:
            TypeError: ``fn`` is not callable.
            RuntimeError: the executor (or this view of it) was shut down, or the interpreter
                is exiting.
            WorkerStartError: the executor is broken: a worker failed to start (its
                initializer raised, say). A ``concurrent.futures.BrokenExecutor``.
        """
        return self._submit(self._options, [(fn, args, kwargs)], chunked=False, prepared=None)

    def _submit(
        self, opts: TaskOptions, calls: list[Call], *, chunked: bool, prepared: Any
    ) -> Future[Any]:
        fn = calls[0][0]
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__} {short_repr(fn)}")
        if self._parent is None:
            future = self._send(opts, calls, chunked=chunked, prepared=prepared)
        else:
            with self._mine_lock:  # a view: its shutdown() must see every future it accepted
                if self._closed:
                    raise RuntimeError(AFTER_SHUTDOWN)
                future = self._send(opts, calls, chunked=chunked, prepared=prepared)
                self._mine.add(future)
            future.add_done_callback(self._forget)
        handoff.track(future)
        return future

    @own_callback
    def _forget(self, future: Future[Any]) -> None:
        """A view's future is done: its ``shutdown()`` no longer waits for it (no lock)."""
        self._mine.discard(future)

    def _check_view_open(self) -> None:
        """Raise if this view was shut down (the backend checks the executor itself)."""
        if self._closed:
            raise RuntimeError(AFTER_SHUTDOWN)

    def _send(
        self, opts: TaskOptions, calls: list[Call], *, chunked: bool, prepared: Any
    ) -> Future[Any]:
        """The backend's part: queue one task of ``calls`` (one call unless ``chunked``) with
        ``opts`` and return its future. Raises ``RuntimeError`` once the executor is shut
        down; a call that cannot be sent fails its future only (see :func:`failed_future`).
        ``prepared`` is what :meth:`_prepare_map` returned for this ``map`` (else ``None``)."""
        raise NotImplementedError

    def _prepare_map(self, fn: Callable[..., Any], opts: TaskOptions) -> Any:
        """Work done once per ``map`` rather than per task (e.g. pickling ``fn``)."""
        return None

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """Like :meth:`concurrent.futures.Executor.map`: results lazily, in input order.

        The whole input is queued before anything starts (as in :meth:`batch`), so the tasks
        start by priority and predicted cost; results still come back in input order.
        ``timeout`` counts from this call; a task's exception is raised when its position is
        reached; ``chunksize`` sends that many calls to a worker in one message (each call still
        gets its own result or exception; the per-task timeout covers the chunk), where the
        backend chunks. ``buffersize`` (Python 3.14's, on any Python): submit only that many
        tasks (chunks) ahead, and one more before each result is waited for, so the input may be
        endless; the ordering then applies within the first window. Closing the iterator
        cancels what was submitted ahead, as the stdlib's does.
        """
        opts = self._options
        chunksize = check_chunksize(chunksize)
        buffersize = check_buffersize(buffersize)
        end = None if timeout is None else time.monotonic() + timeout
        arg_tuples = zip(*iterables, strict=False)
        chunked = chunksize > 1 and self.CHUNKS
        groups: Iterator[list[Call]]
        if not chunked:
            groups = ([(fn, a, {})] for a in arg_tuples)
        else:
            groups = iter(
                lambda: [(fn, a, {}) for a in itertools.islice(arg_tuples, chunksize)], []
            )
        prepared = self._prepare_map(fn, opts) if callable(fn) else None

        def submit(executor: BaseExecutor[B], calls: list[Call]) -> Future[Any]:
            return executor._submit(opts, calls, chunked=chunked, prepared=prepared)

        # Held like batch(): the first tasks would otherwise start in input order before the
        # longer ones behind them are even queued.
        with self.batch():
            futures = collections.deque(
                submit(self, calls) for calls in itertools.islice(groups, buffersize)
            )
        refill = None if buffersize is None else submit_ahead(self, groups, submit)
        return results_in_order(futures, end, chunked=chunked, refill=refill)

    # -- views and batches -----------------------------------------------------------------------

    def _check_path(self, value: object) -> Path:
        """Validate ``options(path=...)``; a backend that cannot fork narrows it."""
        return check_path(value)

    def _check_memory_limit(self, value: object) -> int | None:
        """Validate ``options(memory_limit=...)``; a backend that enforces limits overrides it."""
        if value is None:
            return None
        raise TypeError(
            f"{type(self).__name__} does not enforce memory_limit (PrecompileExecutor does); "
            "pass None or leave it out"
        )

    def _check_resources(self, value: object) -> tuple[tuple[str, float], ...]:
        """Validate ``options(resources=...)``; a backend that routes by resources overrides it."""
        if value is None:
            return ()
        raise TypeError(
            f"{type(self).__name__} does not route tasks by resources (RayPrecompileExecutor "
            "does); pass None or leave it out"
        )

    def options(
        self,
        *,
        timeout: float | None | object = ...,
        path: Path | object = ...,
        priority: float | object = ...,
        with_output: bool | object = ...,
        cost: float | None | object = ...,
        memory_limit: int | None | object = ...,
        resources: Mapping[str, float] | None | object = ...,
    ) -> Self:
        """Return a view of this executor with other per-task settings; it shares the pool.

        The view's ``shutdown()`` closes the view only (its own tasks); the executor it came
        from goes on. Shutting down that executor closes every view of it.

        Args:
            timeout: per-task timeout in seconds (``None``: none), counted from the task's start.
            path: ``"spawn"``, ``"fork"`` or ``"auto"`` (where the backend can fork).
            priority: higher starts first among queued tasks, whatever their predicted cost;
                ties start the longest predicted first, then in submission order.
            with_output: results come back as :class:`TaskResult` with the captured output.
            cost: a hint: the seconds a call is expected to take (any consistent scale). Among
                equal priorities the longest starts first; a backend that learns durations uses
                it as the prior until it has observed the same call. ``None``: no hint.
            memory_limit: bytes the task's process group may hold (``None``: no limit), where
                the backend enforces it (``PrecompileExecutor``: see its constructor).
            resources: the task goes only to nodes whose resources cover these amounts
                (``{"GPU": 1}``: a GPU node; a filter, nothing is reserved), where the backend
                routes by resources (``RayPrecompileExecutor``); ``None``: any node.
        """
        changes: dict[str, Any] = {}
        if timeout is not ...:
            changes["timeout"] = check_timeout(timeout, "timeout")
        if path is not ...:
            changes["path"] = self._check_path(path)
        if priority is not ...:
            changes["priority"] = check_priority(priority)
        if with_output is not ...:
            changes["with_output"] = check_flag(with_output, "with_output")
        if cost is not ...:
            changes["cost"] = check_cost(cost)
        if memory_limit is not ...:
            changes["memory_limit"] = self._check_memory_limit(memory_limit)
        if resources is not ...:
            changes["resources"] = self._check_resources(resources)
        view = object.__new__(type(self))
        BaseExecutor.__init__(
            view, self._backend, dataclasses.replace(self._options, **changes), self._base()
        )
        return view

    def _base(self) -> Self:
        """The executor this object is, or is a view of."""
        return self._parent or self

    @contextlib.contextmanager
    def batch(self) -> Iterator[Self]:
        """Queue everything submitted inside the block; start it only when the block exits.

        Without it, the first tasks start at once in submission order, so
        ``options(priority=...)`` can only order the rest. Inside it, priority orders the whole
        batch: e.g. the largest configs first, so the longest compile does not start last.
        """
        self._backend.hold()
        try:
            yield self
        finally:
            self._backend.release()

    # -- shutting down ---------------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; what is queued still runs unless ``cancel_futures``.

        On a view from :meth:`options`, this closes the view only and concerns its own tasks.

        Args:
            wait: block until every queued and running task has finished.
            cancel_futures: cancel the tasks that have not started.
        """
        if self._parent is None:
            self._backend.begin_shutdown(cancel_futures=cancel_futures)
            if wait:
                self._backend.join()
            return
        with self._mine_lock:
            self._closed = True
            mine = list(self._mine)
        if cancel_futures:
            for future in mine:
                future.cancel()  # False for a started one: it runs to its end
        if wait:
            futures_wait(mine)

    def interrupt(self) -> None:
        """Cancel queued tasks and kill running ones now (what Ctrl-C in a batch does)."""
        self._backend.interrupt()

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Literal[False]:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupt()
        self.shutdown(wait=True)
        return False


def failed_future(error: BaseException) -> Future[Any]:
    """A future already failed with ``error``: a task that could not even be sent."""
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()
    future.set_exception(error)
    return future


def serialization_error(what: str, where: str, advice: str, cause: BaseException) -> Exception:
    """The one message for a call that would not pickle: what, to go where, what to do."""
    error = SerializationError(f"could not serialize {what} {where}. {advice}")
    error.__cause__ = cause
    return error


def kill_running_futures(futures: Iterable[Future[Any]]) -> None:
    """Kill the workers running any of ``futures`` (process group, SIGKILL) and wait for them.

    Used on Ctrl-C and errors in :func:`wait_for_all`: nothing keeps running or printing. Works
    for the futures of every executor of this process, whatever its backend.
    """
    wanted = set(futures)
    with _backends_lock:
        backends = list(_backends)
    killed = [f for backend in backends for f in backend.kill(wanted)]
    deadline = time.monotonic() + KILL_WAIT_S
    for future in killed:
        try:
            future.exception(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - TimeoutError/CancelledError: nothing more to do
            pass


def _result_or_cancel(future: Future[Any], end: float | None) -> Any:
    try:
        return future.result() if end is None else future.result(end - time.monotonic())
    finally:
        future.cancel()
        del future


def submit_ahead(
    executor: E, items: Iterator[Any], submit: Callable[[E, Any], Future[Any]]
) -> Callable[[], Future[Any] | None]:
    """``map``'s ``buffersize`` refill: a callable that submits the next of ``items`` with
    ``submit(executor, item)``, or returns ``None`` once the items run out or the executor is
    gone (held weakly: the results iterator must not keep it alive)."""
    me = weakref.ref(executor)

    def submit_next() -> Future[Any] | None:
        executor = me()
        item = next(items, None) if executor is not None else None
        if executor is None or item is None:
            return None
        return submit(executor, item)

    return submit_next


def results_in_order(
    futures: collections.deque[Future[Any]],
    end: float | None,
    *,
    chunked: bool,
    refill: Callable[[], Future[Any] | None] | None = None,
) -> Iterator[Any]:
    """``map``'s results, in input order."""
    # Like the stdlib's: pop each future as it is consumed and never keep a yielded value in a
    # local across the yield, so the caller alone decides how long a result lives. With
    # ``refill`` (map's buffersize), one more task is submitted before each wait, as 3.14 does.
    try:
        while futures:
            if refill is not None and (more := refill()) is not None:
                futures.append(more)
                del more
            if not chunked:
                yield _result_or_cancel(futures.popleft(), end)
                continue
            chunk = _result_or_cancel(futures.popleft(), end)
            chunk.reverse()
            while chunk:
                if not chunk[-1][0]:
                    raise chunk.pop()[1]
                yield chunk.pop()[1]
    finally:
        for future in futures:
            future.cancel()


# ----------------------------------------------------------------------------------------------
# The GIL's hand-off while tasks are in flight: the process's switch interval, lowered.
#
# Every result of a task reaches its future through a thread of the caller: the monitor thread
# reads the worker's socket (the local executor), a dask client's IO loop and callback threads
# fetch it (the dask backend). Such a thread sleeps in ``select``/``epoll`` without the GIL and
# needs it back to go on; while another thread of the program runs Python — an autotuner
# generating the next config's code, benchmarking in a Python loop, Inductor lowering a graph —
# CPython hands the GIL over only after ``sys.getswitchinterval()`` (5 ms by default) has passed,
# at each step. A message that takes one step costs 5 ms; dask's round trip takes dozens of steps.
#
# So from the moment a task of any executor of this library is in flight until the last such task
# is done, the interval is at most :data:`BUSY_SWITCH_INTERVAL_S`; then it is put back as it was,
# unless the program set its own meanwhile (then its own stays). It changes nothing while no other
# thread waits for the GIL, and nothing for code that holds the GIL in one C call (those threads
# are served by the held reads of :mod:`._wire`). Why and measured: docs/design.md, "A busy
# caller: the GIL's hand-off"; switched off with ``set_busy_switch_interval(None)``. Test:
# tests/test_handoff.py.
#
# Work started inside :func:`in_background` (a warm-up, a readiness probe) is not counted: an
# integration whose caller compiles by itself until the workers answer (Inductor) has nobody
# waiting for that work, and the caller's own work is what the process waits for.

BUSY_SWITCH_INTERVAL_S = 0.001
"""The switch interval while tasks are in flight (Python's default: 0.005 s)."""

_background: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "precompile_executor_background", default=False
)
"""Set by :func:`in_background`: this context's tasks and warm-ups are not counted."""


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Within the block, on this thread (this context), tasks submitted and ``warm_up()`` calls
    do not lower the switch interval.

    For work nobody waits on while the caller works: an integration's background warm-up, or a
    readiness probe whose answer the caller polls without waiting, because until it comes the
    caller does the work itself (the Inductor integration: docs/inductor.md, "Readiness"). A
    faster start there would only take the GIL from the caller, whose work is the critical path.
    Whoever waits for workers to start (Helion's autotune, an explicit ``warm_up()``) keeps the
    lower interval: that start is its critical path.
    """
    token = _background.set(True)
    try:
        yield
    finally:
        _background.reset(token)


class Handoff:
    """Counts the tasks in flight in this process, over every executor; lowers the switch
    interval from the first to the last (see the comment above)."""

    def __init__(self, interval: float | None) -> None:
        self._lock = threading.Lock()  # taken alone, never while calling out
        self._interval = interval
        self._in_flight = 0
        self._saved: float | None = None  # the interval to put back; None: ours not in force
        self._ours = 0.0  # what sys reported after we set it
        self._generation = 0  # a forked child's count starts anew: its parent's futures
        self._callback: functools.partial[None] | None = None  # _done for this generation

    def in_flight(self) -> int:
        """Tasks submitted whose futures are not done yet, and ``holding()`` blocks open."""
        return self._in_flight

    def configure(self, interval: float | None) -> None:
        with self._lock:
            self._interval = interval
            if self._in_flight:
                self._restore()
                self._lower()

    def track(self, future: Future[Any]) -> None:
        """Count ``future`` in flight until it is done (a done-callback of the library's own);
        not inside :func:`in_background`."""
        if _background.get():
            return
        generation = self._begin()
        callback = self._callback
        if callback is None or callback.args[0] != generation:
            # One callback per generation, shared by every future: a partial per task was
            # three more objects for the garbage collector to trace while the task is queued
            # (docs/design.md, "Per-task overhead").
            callback = self._callback = functools.partial(self._done, generation)
        future.add_done_callback(callback)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Count one more in flight for the block: workers starting (``warm_up()``) send their
        hellos to the monitor while the caller may be busy; not inside :func:`in_background`."""
        if _background.get():
            yield
            return
        generation = self._begin()
        try:
            yield
        finally:
            self._done(generation, None)

    def _begin(self) -> int:
        """Count one more in flight; return the generation its end must match."""
        with self._lock:
            self._in_flight += 1
            if self._in_flight == 1:
                self._lower()
            return self._generation

    @own_callback
    def _done(self, generation: int, future: Future[Any] | None) -> None:
        with self._lock:
            if generation != self._generation:
                return  # counted by the parent this process was forked from
            self._in_flight -= 1
            if self._in_flight == 0:
                self._restore()

    def _lower(self) -> None:
        current = sys.getswitchinterval()
        if self._interval is not None and current > self._interval:
            sys.setswitchinterval(self._interval)
            self._saved, self._ours = current, sys.getswitchinterval()

    def forget_in_child(self) -> None:
        """A forked child inherits the count of its parent's tasks, which it never sees end,
        and maybe the lock held: it starts from zero at the program's own interval."""
        self._lock = threading.Lock()
        self._in_flight = 0
        self._generation += 1
        self._restore()

    def _restore(self) -> None:
        if self._saved is not None and sys.getswitchinterval() == self._ours:
            sys.setswitchinterval(self._saved)
        self._saved = None


handoff = Handoff(BUSY_SWITCH_INTERVAL_S)
"""The process's one count (the interval is process-wide)."""
os.register_at_fork(after_in_child=handoff.forget_in_child)


def set_busy_switch_interval(seconds: float | None) -> None:
    """Set the process's switch interval while tasks of this library are in flight
    (``sys.setswitchinterval``; default :data:`BUSY_SWITCH_INTERVAL_S`, 1 ms), or with ``None``
    leave the interval alone. A thread that waits for the GIL — the one that brings each task's
    result back — gets it this soon from a thread busy in Python. The interval is never raised,
    and is put back when the last task in flight is done (unless the program set its own
    meanwhile).

    Raises:
        TypeError, ValueError: ``seconds`` is not a positive finite number of seconds or None.
    """
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(
                f"seconds must be a number of seconds or None, got {type(seconds).__name__}"
            )
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"seconds must be a positive finite number of seconds, got {seconds}")
    handoff.configure(None if seconds is None else float(seconds))
