"""``PrecompileExecutor``: a ``concurrent.futures.Executor`` on warm, reusable worker processes.

This module is the public facade: settings and their validation, ``submit``/``map``, the
``options()`` views, ``batch()``, ``warm_up()``, ``statistics()``, ``timeline()`` and shutting
down. It also attaches each task's :class:`._costs.CostKey` and predicted cost at submit time.
Scheduling lives in :mod:`._core` (one per executor), processes in :mod:`._hub` (one per process).

Data flow::

    submit(fn, *args)                           (caller's thread)
      │  spawn path: cloudpickle (fn, args) now; a failure fails this future only
      │  ("auto": fall back to the fork path); predict its cost (_costs.CostModel)
      ▼
    Core queues ── heaps keyed (-priority, -predicted cost, id), one per path; futures stay
      │            PENDING (cancel() works); map() queues its whole input, then dispatches
      │  pump (under the hub lock): dispatch while tasks in flight < max_workers
      ├── spawn ──► idle worker ── Run ──► loky worker: serve loop ── Started, run, Done
      │              (none idle: take one from the Hub's pool, or start one with loky)
      └── fork ───► os.fork() child: register with the guardian, setsid, run, send Done, _exit
                                  │
    Hub monitor thread ◄──────────┘ one thread waits on every socket:
      Started → the task's clock starts (its deadline counts from here)
      Done    → task closed, its Started→Done time recorded in its cost model; the settle
                pool unpickles the result or rebuilds the exception (a RemoteError proxy) and
                sets the future (then, once nothing is left to do, saves the cost history)
      EOF     → worker dead: a task it never started is queued again; a started one fails
                (WorkerCrashedError, exit code and output read by a job) and is never re-run
      deadline→ a job kills the worker's process group (SIGTERM, grace, SIGKILL) → its EOF →
                TaskTimeoutError

Workers belong to the process-wide :class:`._hub.Hub`, not to one executor: ``shutdown()``
returns idle workers to it, and the next executor with the same initializer reuses them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import pickle
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from typing import Any, Literal, TypeVar

import cloudpickle

from ._core import AFTER_SHUTDOWN, Core, TaskTimeline
from ._costs import COST_ATTRIBUTE, CostKey, CostModel, Estimate, call_features, features_key
from ._costs import function_key as _function_key
from ._costs import shared_model as _shared_model
from ._errors import Classification, SerializationError
from ._hub import current_hub, get_hub
from ._state import StopWorker, Task, TaskState
from ._validate import (
    check_buffersize,
    check_chunksize,
    check_cost,
    check_flag,
    check_max_tasks_per_child,
    check_priority,
    check_timeout,
    describe_unpicklable,
    short_repr,
)
from ._worker import Call

log = logging.getLogger("precompile_executor")

T = TypeVar("T")
E = TypeVar("E")
Path = Literal["spawn", "fork", "auto"]
_PATHS = ("spawn", "fork", "auto")
Start = Literal["template", "interpreter"]
_STARTS = ("template", "interpreter")

DEFAULT_WORKERS_PER_CORE = 1.0
"""``max_workers`` by default: this many workers per usable core (at least one). The evidence
(``benchmarks/s7_ordering.py --contention``, H200 machine, 16 cores, 64 matmul configs,
2026-12-01, docs/benchmarks-h200.md): 8 workers 5.16 s, 12 workers 3.58 s, 16 workers 2.79 s —
compiles on every core slow each other by only 2-7 % (Σ in-worker / Σ sequential), far less than
a core left idle costs, so one worker per core."""

DEFAULT_IDLE_TIMEOUT_S = 600.0
"""Idle workers stay warm this long: an autotuner benchmarks for minutes between compile
batches, and a restart costs an interpreter plus its imports (about 1.5 s with torch)."""


@dataclasses.dataclass(frozen=True)
class ExecutorStatistics:
    """An immutable snapshot of one executor's state, from :meth:`PrecompileExecutor.statistics`.

    Attributes:
        queued: tasks waiting for a worker (their futures are PENDING).
        running: tasks on a worker now.
        completed: tasks that returned a value.
        failed: tasks that raised, timed out or crashed.
        cancelled: tasks cancelled before they started.
        timed_out: failed tasks that ran past their timeout.
        crashed: failed tasks whose worker died.
        workers_alive: worker processes this executor holds (warm spawn workers and live forks).
        worker_restarts: workers replaced after a crash or a timeout kill.
        spawn_tasks: tasks started on the spawn path (warm pool).
        fork_tasks: tasks started on the fork path.
        start: how this executor's spawn workers start: ``"template"`` or ``"interpreter"``
            (``"interpreter"`` also when the template was found unsafe to fork).
        start_note: why workers asked to start from a template start as interpreters (the
            template's refusal: e.g. the threads the initializer left running), else ``None``.
    """

    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int
    timed_out: int
    crashed: int
    workers_alive: int
    worker_restarts: int
    spawn_tasks: int
    fork_tasks: int
    start: str = "template"
    start_note: str | None = None


@dataclasses.dataclass(frozen=True)
class _Options:
    timeout: float | None
    path: Path
    priority: float
    with_output: bool
    cost: float | None = None


def _check_path(value: object) -> Path:
    if value not in _PATHS:
        raise ValueError(f"path must be one of 'spawn', 'fork' or 'auto', got {value!r}")
    return value  # type: ignore[return-value]


def _check_devices(devices: object) -> tuple[str, ...] | None:
    if devices is None:
        return None
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (list, tuple, range)):
        raise TypeError(f"devices must be a list of GPU indices (or UUID strings), got {devices!r}")
    out: list[str] = []
    for d in devices:
        if isinstance(d, bool) or not isinstance(d, (int, str)) or (isinstance(d, int) and d < 0):
            raise ValueError(f"devices must hold GPU indices >= 0 or UUID strings, got {d!r}")
        out.append(str(d))
    if not out:
        raise ValueError("devices must not be empty; pass None for no pinning")
    if len(set(out)) != len(out):
        raise ValueError(f"devices lists a GPU twice: {list(devices)!r}")
    return tuple(out)


def _default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, round(cores * DEFAULT_WORKERS_PER_CORE))


class PrecompileExecutor(Executor):
    """Runs callables on warm, reusable worker processes; a ``concurrent.futures.Executor``.

    Tasks run on the **spawn** path by default: loky-started interpreters that outlive the
    executor, fed with cloudpickle (lambdas and closures work). The **fork** path runs each task
    in a forked child of the caller, for callables that cannot be pickled. Every task exception
    comes back as a :class:`RemoteError` proxy; a task that crashes its worker or passes its
    timeout fails alone.

    Args:
        max_workers: most tasks running at once, both paths together. Default: the CPUs this
            process may use.
        initializer: called once in each spawn worker before its first task (e.g. a function
            that imports torch and triton). Workers are shared only between executors with the
            same initializer and initargs.
        initargs: arguments for ``initializer``.
        timeout: default per-task timeout in seconds, counted from the task's start on a
            worker; ``None`` for none. Override per call with :meth:`options`.
        path: ``"spawn"``, ``"fork"`` or ``"auto"`` (spawn, or fork when ``fn`` or its arguments
            cannot be pickled).
        classify: maps a task's exception to ``"raise"``, ``"warn"`` or ``"debug"``; stored on
            the proxy as ``classification`` and used by :func:`wait_for_all`.
        ignore_errors: classify every failure as ``"debug"``.
        idle_timeout: seconds an idle worker stays alive; ``None`` keeps it until exit.
        spare_workers: keep this many extra started workers idle in the pool, so a worker lost
            to a crash, a timeout kill or a sticky CUDA error is replaced at once instead of
            after an interpreter start plus the initializer (seconds with torch and triton).
            Each spare costs a worker's memory.
        devices: pin spawn workers to these GPUs (``CUDA_VISIBLE_DEVICES`` set before each
            worker starts), spread evenly: ``max_workers=8, devices=[0, 1]`` gives 4 workers per
            GPU. A replacement worker goes to the device with the fewest. A pinned worker whose
            initializer imported torch creates its CUDA context as it starts (before
            ``warm_up()`` returns), not in its first task. ``None``: no pinning.
        start: how spawn workers start. ``"template"`` (default): one fresh interpreter per
            worker kind (initializer, initargs) runs the initializer once — imports, a warm-up
            compile — and forks each worker from that warm state in milliseconds, so a worker
            lost to a crash or a timeout kill is replaced at once. If the initializer leaves
            threads running or initializes CUDA, forking is unsafe: workers then start as
            ``"interpreter"`` and the log says why, once. ``"interpreter"``: each worker is a
            fresh interpreter that runs the initializer itself.
        cost_history: a JSON file where the observed durations of this executor's tasks are
            kept across runs (shared by every executor in the process that names it), so the
            next batch starts its longest tasks first. ``None``: this executor learns in memory
            only. Triton compiles keep their own history beside the Triton cache.
        max_tasks_per_child: as the stdlib's ``ProcessPoolExecutor``: a spawn worker leaves
            after this many tasks and a fresh one replaces it (from the warm template: in
            milliseconds), to bound what a leaking compiler accumulates. ``None``: workers live
            on. Fork-path tasks run in a child each anyway.

    Raises:
        ValueError, TypeError: a setting is out of range or of the wrong type.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        timeout: float | None = None,
        path: Path = "spawn",
        classify: Callable[[BaseException], Classification] | None = None,
        ignore_errors: bool = False,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_S,
        devices: Sequence[int | str] | None = None,
        spare_workers: int = 0,
        start: Start = "template",
        cost_history: str | os.PathLike[str] | None = None,
        max_tasks_per_child: int | None = None,
    ) -> None:
        if max_workers is None:
            max_workers = _default_workers()
        if isinstance(max_workers, bool) or not isinstance(max_workers, int):
            raise TypeError(f"max_workers must be an int >= 1 or None, got {max_workers!r}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable or None, got {initializer!r}")
        if not isinstance(initargs, tuple):
            raise TypeError(f"initargs must be a tuple, got {type(initargs).__name__}")
        if classify is not None and not callable(classify):
            raise TypeError(f"classify must be callable or None, got {classify!r}")
        if isinstance(spare_workers, bool) or not isinstance(spare_workers, int):
            raise TypeError(f"spare_workers must be an int >= 0, got {spare_workers!r}")
        if spare_workers < 0:
            raise ValueError(f"spare_workers must be >= 0, got {spare_workers}")
        if start not in _STARTS:
            raise ValueError(f"start must be 'template' or 'interpreter', got {start!r}")
        if not isinstance(ignore_errors, bool):
            raise TypeError(f"ignore_errors must be a bool, got {ignore_errors!r}")
        self._options = _Options(check_timeout(timeout, "timeout"), _check_path(path), 0.0, False)
        idle = check_timeout(idle_timeout, "idle_timeout")
        init_blob = None
        if initializer is not None:
            try:
                init_blob = cloudpickle.dumps((initializer, initargs))
            except Exception as exc:
                raise TypeError(
                    f"initializer and initargs must be picklable for spawned workers: {exc}"
                ) from exc
        self._core = Core(
            get_hub(),
            max_workers,
            init_blob,
            idle,
            classify,
            ignore_errors,
            _check_devices(devices),
            spare_workers,
            start,
            check_max_tasks_per_child(max_tasks_per_child),
        )
        self._costs = CostModel() if cost_history is None else _shared_model(cost_history)
        self._base: PrecompileExecutor | None = None
        self._tasks: set[Task] = set()  # submitted through this object, future not yet set
        self._closed = False
        # Dropped without shutdown(): let its workers go back to the pool once they are idle,
        # rather than holding them until their idle timeout.
        weakref.finalize(self, _abandon, self._core).atexit = False

    @property
    def max_workers(self) -> int:
        """Most tasks running at once, both paths together."""
        return self._core.max_workers

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
        return self._submit(self._options, [(fn, args, kwargs)], chunked=False)

    def _check_open(self) -> None:
        """Raise if this object may not take tasks now (hub lock held)."""
        if self._closed:
            raise RuntimeError(AFTER_SHUTDOWN)
        self._core.check_open()

    def _submit(
        self, opts: _Options, calls: list[Call], *, chunked: bool, fn_blob: bytes | None = None
    ) -> Future[Any]:
        fn = calls[0][0]
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__} {short_repr(fn)}")
        core = self._core
        with core.lock:
            self._check_open()
        future: Future[Any] = Future()
        path: Literal["spawn", "fork"] = "fork" if opts.path == "fork" else "spawn"
        blob = None
        if path == "spawn":
            try:
                # fn and the arguments travel apart, so map() pickles fn once, not per task.
                if fn_blob is None:
                    fn_blob = cloudpickle.dumps(fn)
                blob = pickle.dumps((fn_blob, cloudpickle.dumps([(a, k) for _, a, k in calls])))
            except Exception as exc:  # noqa: BLE001 - anything a __reduce__ may raise
                if opts.path != "auto":
                    what = describe_unpicklable(*calls[0]) if len(calls) == 1 else "a call"
                    error = SerializationError(
                        f"could not serialize {what} for a spawned worker. Run unpicklable work "
                        "on the fork path: executor.options(path='fork'), or path='auto' to fall "
                        "back to it automatically."
                    )
                    error.__cause__ = exc
                    with core.lock:
                        core.failed += 1
                    future.set_running_or_notify_cancel()
                    future.set_exception(error)
                    return future
                path = "fork"
        cost, costs = self._cost_of(opts, calls)
        task = Task(
            future=future,
            owner=core,
            path=path,
            calls=calls if path == "fork" else None,
            blob=blob,
            n=len(calls),
            chunked=chunked,
            timeout=opts.timeout,
            priority=opts.priority,
            want_output=opts.with_output,
            origin=self._tasks,
            cost=cost,
            costs=costs,
            predicted_s=costs.estimate(cost) * len(calls),
        )
        # A weak reference: the future must not keep its task (and the task its future) alive.
        future.add_done_callback(functools.partial(_on_done, core, weakref.ref(task)))
        with core.lock:
            self._check_open()
            self._tasks.add(task)
            actions = core.enqueue_predicted(task)
        core.hub.run(actions)
        return future

    def _cost_of(self, opts: _Options, calls: list[Call]) -> tuple[CostKey, CostModel]:
        """The cost key of a task and the model it is predicted and recorded in."""
        fn, args, kwargs = calls[0]
        estimate: Estimate | None = None
        estimator = getattr(fn, COST_ATTRIBUTE, None)
        if callable(estimator):
            try:
                said = estimator(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a broken estimator must not fail the task
                log.debug("the cost estimator of %r raised; ignoring it", fn, exc_info=True)
            else:
                estimate = said if isinstance(said, Estimate) else Estimate(seconds=said)
        function = _function_key(fn)
        features = call_features(args, kwargs)
        prior = opts.cost
        costs = self._costs
        if estimate is not None:
            function = estimate.function or function
            if estimate.features is not None:
                features = features_key(estimate.features)
            if prior is None and isinstance(estimate.seconds, (int, float)):
                prior = float(estimate.seconds)
            if estimate.history is not None:
                costs = _shared_model(estimate.history)
        return CostKey(function, features, prior), costs

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """Like :meth:`concurrent.futures.Executor.map`: results lazily, in input order.

        The whole input is queued before anything starts, so the tasks start longest predicted
        first (see :meth:`options`' ``cost`` and ``cost_history``); results still come back
        in input order. ``timeout`` counts from this call; a task's exception is raised when
        its position is reached; ``chunksize`` sends that many calls to a worker in one message
        (each call still gets its own result or exception; the per-task timeout covers the
        chunk). ``buffersize`` (Python 3.14's, on any Python): submit only that many tasks
        (chunks) ahead, and one more before each result is waited for, so the input may be
        endless; the ordering then applies within the first window. Closing the iterator
        cancels what was submitted ahead, as the stdlib's does.
        """
        return self._map(self._options, fn, iterables, timeout, chunksize, buffersize)

    def _map(
        self,
        opts: _Options,
        fn: Callable[..., T],
        iterables: tuple[Iterable[Any], ...],
        timeout: float | None,
        chunksize: int,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        chunksize = check_chunksize(chunksize)
        buffersize = check_buffersize(buffersize)
        end = None if timeout is None else time.monotonic() + timeout
        arg_tuples = zip(*iterables, strict=False)
        groups: Iterator[list[Call]]
        if chunksize == 1:
            groups = ([(fn, a, {})] for a in arg_tuples)
        else:
            groups = iter(
                lambda: [(fn, a, {}) for a in itertools.islice(arg_tuples, chunksize)], []
            )
        fn_blob = None
        if opts.path != "fork" and callable(fn):
            try:
                fn_blob = cloudpickle.dumps(fn)
            except Exception:  # noqa: BLE001 - _submit reports it (or forks) per task
                fn_blob = None
        chunked = chunksize > 1
        # Held like batch(): the first max_workers tasks would otherwise start in input order
        # before the longer ones behind them are even queued.
        with self.batch():
            futures = collections.deque(
                self._submit(opts, calls, chunked=chunked, fn_blob=fn_blob)
                for calls in itertools.islice(groups, buffersize)
            )
        refill = None
        if buffersize is not None:
            refill = submit_ahead(
                self,
                groups,
                lambda ex, calls: ex._submit(opts, calls, chunked=chunked, fn_blob=fn_blob),
            )
        return results_in_order(futures, end, chunked=chunked, refill=refill)

    def options(
        self,
        *,
        timeout: float | None | object = ...,
        path: Path | object = ...,
        priority: float | object = ...,
        with_output: bool | object = ...,
        cost: float | None | object = ...,
    ) -> PrecompileExecutor:
        """Return a view of this executor with other per-task settings; it shares the pool.

        The view's ``shutdown()`` closes the view only (its own tasks); the executor it came
        from goes on. Shutting down that executor closes every view of it.

        Args:
            timeout: per-task timeout in seconds (``None``: none).
            path: ``"spawn"``, ``"fork"`` or ``"auto"``.
            priority: higher starts first among queued tasks, whatever their predicted cost;
                ties start the longest predicted first, then in submission order.
            with_output: results come back as :class:`TaskResult` with the captured output.
            cost: a hint: the seconds a call is expected to take (any consistent scale). It is
                the prior until this executor has observed the same call; then the observed
                durations (scaled by how far the hints were off) decide. ``None``: no hint.
        """
        opts = self._options
        if timeout is not ...:
            opts = dataclasses.replace(opts, timeout=check_timeout(timeout, "timeout"))
        if path is not ...:
            opts = dataclasses.replace(opts, path=_check_path(path))
        if priority is not ...:
            opts = dataclasses.replace(opts, priority=check_priority(priority))
        if with_output is not ...:
            opts = dataclasses.replace(opts, with_output=check_flag(with_output, "with_output"))
        if cost is not ...:
            opts = dataclasses.replace(opts, cost=check_cost(cost))
        view = PrecompileExecutor.__new__(PrecompileExecutor)
        view._core = self._core
        view._costs = self._costs
        view._options = opts
        view._base = self._base or self  # keeps the executor (and its finalizer) alive
        view._tasks = set()
        view._closed = False
        return view

    @contextlib.contextmanager
    def batch(self) -> Iterator[PrecompileExecutor]:
        """Queue everything submitted inside the block; start it only when the block exits.

        Without it, the first ``max_workers`` submissions start at once in submission order, so
        ``options(priority=...)`` can only order the rest. Inside it, priority orders the whole
        batch: e.g. the largest configs first, so the longest compile does not start last.
        """
        core = self._core
        with core.lock:
            core.held += 1
        try:
            yield self
        finally:
            with core.lock:
                core.held = max(0, core.held - 1)
                actions = core.pump()
            core.hub.run(actions)

    # -- workers ---------------------------------------------------------------------------------

    def warm_up(self, timeout: float | None = None) -> list[int]:
        """Start all ``max_workers`` spawn workers and run the initializer in each; return pids.

        Raises:
            WorkerStartError: a worker could not start (its initializer raised, say).
            TimeoutError: not all workers were ready within ``timeout`` seconds.
        """
        core = self._core
        end = None if timeout is None else time.monotonic() + timeout
        with core.lock:
            self._check_open()
            actions = core.warm_up_actions()
        core.hub.run(actions)
        with core.lock:
            while True:
                if core.broken is not None:
                    raise core.broken
                spawn = [w for w in core.workers if w.kind == "spawn"]
                if spawn and all(w.state in ("idle", "busy") for w in spawn):
                    return sorted(w.pid for w in spawn)
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"workers were not ready within {timeout}s")
                core.changed.wait(left)

    def statistics(self) -> ExecutorStatistics:
        """Return an immutable snapshot of this executor's queue, tasks and workers."""
        core = self._core
        with core.lock:
            queued = [t for q in core.queues.values() for _, t in q]
            return ExecutorStatistics(
                queued=sum(1 for t in queued if t.future_running or not t.future.cancelled()),
                running=len(core.in_flight),
                completed=core.completed,
                failed=core.failed,
                cancelled=core.cancelled
                + sum(1 for t in queued if not t.future_running and t.future.cancelled()),
                timed_out=core.timed_out,
                crashed=core.crashed,
                workers_alive=sum(1 for w in core.workers if w.state != "dead"),
                worker_restarts=core.restarts,
                spawn_tasks=core.spawn_tasks,
                fork_tasks=core.fork_tasks,
                start=core.effective_start(),
                start_note=core.start_note(),
            )

    def timeline(self) -> tuple[TaskTimeline, ...]:
        """Return when each settled task of this executor (and its views) passed each step.

        One immutable :class:`TaskTimeline` per task, oldest first (the last
        :data:`~precompile_executor._core.TIMELINE_LIMIT`): queued, sent, started, done, decoded,
        settled. ``benchmarks/gantt.py`` draws them.
        """
        with self._core.lock:
            return tuple(self._core.timeline)

    # -- shutting down ---------------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; idle workers go back to the process-wide pool, still warm.

        On a view from :meth:`options`, this closes the view only and concerns its own tasks.

        Args:
            wait: block until every queued and running task has finished (and, for the
                executor itself, until no worker of it is still starting).
            cancel_futures: cancel the tasks that have not started.
        """
        core = self._core
        if self._base is not None:
            self._shutdown_view(wait, cancel_futures)
            return
        with core.lock:
            core.shutdown = True
            core.held = 0  # a batch() still open must not keep shutdown(wait=True) waiting
            actions = core.cancel_queued(also_requeued=False) if cancel_futures else []
            actions += core.pump()
        core.hub.run(actions)
        if wait:
            with core.lock:
                while core.busy() or any(w.state == "starting" for w in core.workers):
                    core.changed.wait(0.5)
                actions = core.pump()
            core.hub.run(actions)

    def _shutdown_view(self, wait: bool, cancel_futures: bool) -> None:
        core = self._core
        with core.lock:
            self._closed = True
            if cancel_futures:
                for task in list(self._tasks):
                    if task.state is TaskState.QUEUED and not task.future_running:
                        task.future.cancel()  # the pump drops it, and counts it
        if wait:
            with core.lock:
                while any(not t.future.done() for t in self._tasks):
                    core.changed.wait(0.5)

    def _kill_running(self, grace_s: float, reason: str) -> None:
        core = self._core
        with core.lock:
            tasks = list(core.in_flight)
        core.hub.kill_tasks(tasks, reason, grace_s)

    def terminate_workers(self) -> None:
        """Shut down, cancel queued tasks, and stop every worker: running ones get SIGTERM (then
        SIGKILL after a grace), idle ones exit; pooled workers of the same initializer too."""
        self._stop_all(grace_s=1.0, how="terminate_workers()")

    def kill_workers(self) -> None:
        """Like :meth:`terminate_workers`, with SIGKILL for running tasks' process groups."""
        self._stop_all(grace_s=0.0, how="kill_workers()")

    def _stop_all(self, grace_s: float, how: str) -> None:
        core = self._core
        with core.lock:
            core.shutdown = True
            core.held = 0
            actions = core.cancel_queued(also_requeued=True)
        core.hub.run(actions)
        self._kill_until_idle(grace_s, f"killed by executor.{how}")
        with core.lock:
            actions = core.stop_idle() + core.stop_starting()
        core.hub.run(actions)
        for device in core.devices or [None]:
            stop_idle_workers(core.device_key(device))

    def _kill_until_idle(self, grace_s: float, reason: str, timeout_s: float = 30.0) -> None:
        """Kill what runs until nothing of this executor is in flight (a fork may be
        mid-``fork()`` on the first round)."""
        core = self._core
        end = time.monotonic() + timeout_s
        while True:
            self._kill_running(grace_s, reason)
            with core.lock:
                if not core.in_flight and not core.unsettled:
                    return
                if time.monotonic() > end:
                    log.warning("tasks still in flight %gs after a kill", timeout_s)
                    return
                core.changed.wait(0.1)

    def interrupt(self) -> None:
        """Cancel queued tasks and kill running ones now (what Ctrl-C in a batch does)."""
        core = self._core
        with core.lock:
            actions = core.cancel_queued(also_requeued=True)
        core.hub.run(actions)
        self._kill_until_idle(0.0, "killed because the caller was interrupted")

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Literal[False]:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupt()
        self.shutdown(wait=True)
        return False


def _abandon(core: Core) -> None:
    """The executor object is gone: shut down without waiting (its finalizer)."""
    with core.lock:
        core.shutdown = True
        core.held = 0
        actions = core.pump()
    core.hub.run(actions)


def _on_done(core: Core, task_ref: weakref.ref[Task], future: Future[Any]) -> None:
    """A future's done-callback (any thread): if the user cancelled it while queued, the core
    notifies its waiters at once."""
    if not future.cancelled():
        return
    task = task_ref()
    if task is not None:
        with core.lock:
            core.cancelled_by_user(task)


def _result_or_cancel(future: Future[Any], end: float | None) -> Any:
    try:
        return future.result() if end is None else future.result(end - time.monotonic())
    finally:
        future.cancel()
        del future


def submit_ahead(
    executor: E, items: Iterator[Any], submit: Callable[[E, Any], Future[Any]]
) -> Callable[[], Future[Any] | None]:
    """``map``'s ``buffersize`` refill, for every backend: a callable that submits the next of
    ``items`` with ``submit(executor, item)``, or returns ``None`` once the items run out or the
    executor is gone (held weakly: the results iterator must not keep it alive)."""
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


def stop_idle_workers(key: bytes | None = None) -> int:
    """Stop every idle worker in this process's pool (all initializers); return how many.

    Workers held by a live executor are not touched; use ``executor.terminate_workers()``.
    """
    hub = current_hub()
    if hub is None:
        return 0
    with hub.lock:
        keys = [key] if key is not None else list(hub.pool)
        victims = [w for k in keys for w in hub.pool.pop(k, []) if w.state == "idle"]
        # Spares still starting (no executor holds them) would join the pool right after.
        victims += [
            w
            for w in hub.workers
            if w.owner is None and w.kind == "spawn" and w.state == "starting" and w.key in keys
        ]
        for worker in victims:
            hub.forget(worker)
        # A warm template no live worker came from is only memory now: stop it too.
        in_use = {w.template_key for w in hub.workers if w.kind == "spawn"}
        templates = [t for k, t in hub.templates.items() if k not in in_use and not t.pending]
        for template in templates:
            hub.forget(template)
    hub.run([StopWorker(w, kill=False) for w in victims + templates])
    return len(victims)


def kill_running_futures(futures: Iterable[Future[Any]]) -> None:
    """Kill the workers running any of ``futures`` (process group, SIGKILL) and wait for them.

    Used on Ctrl-C and errors in :func:`wait_for_all`: nothing keeps running or printing.
    """
    hub = current_hub()
    if hub is None:
        return
    wanted = {id(f) for f in futures}
    with hub.lock:
        tasks = [t for core in hub.cores for t in core.in_flight if id(t.future) in wanted]
    hub.kill_tasks(tasks, "killed because the batch was interrupted", grace_s=0)
    deadline = time.monotonic() + 10.0
    for task in tasks:
        try:
            task.future.exception(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - TimeoutError/CancelledError: nothing more to do
            pass
