"""``PrecompileExecutor``: a ``concurrent.futures.Executor`` on warm, reusable worker processes.

This module is the local backend of the public layer (:mod:`._base`, which holds ``submit``,
``map``, the ``options()`` views, ``batch()``, shutting down): its settings and their validation,
how a task is sent (pickled for the spawn path, or kept in memory for the fork path, with its
:class:`._costs.CostKey` and predicted cost), ``warm_up()``, ``statistics()``, ``timeline()``,
``terminate_workers()``. Scheduling lives in :mod:`._scheduling` (one :class:`Scheduler` per
executor, the layer's :class:`._base.Backend`), processes in :mod:`._processes` (one per process).

Data flow of one task (the module that does each step on the right; docs/design.md, "Reading
the code", walks it)::

    submit(fn, *args)                                               _base      caller's thread
      │  map(): chunks, the whole input inside a batch() hold
      ▼
    PrecompileExecutor._send                                        _executor
      │  spawn path: cloudpickle (fn, args) now (fn's bytes kept while unchanged); a
      │  failure fails this future only ("auto": the fork path); predict its cost (_costs)
      ▼
    Scheduler: heaps keyed (-priority, -predicted cost, id),        _scheduling (lock held)
      │  one per path; futures stay PENDING (cancel() works)
      │  pump: while tasks in flight < max_workers, take the best head →
      ├── spawn ──► Send(idle worker, task)   (none idle: its WorkerManager adopts a pooled one
      │                                        or launches one; still none: Send ahead to a
      │                                        worker whose task is predicted to end soon)
      └── fork ───► Fork(task)
      ▼
    Hub.run(actions)                                                _processes (lock released)
      ├── Send: a Run frame (_wire) over the worker's socket ──►    _worker    worker process
      │         serve loop: Started, run the calls, Done
      └── Fork: os.fork() child: setsid, run the calls, send Done, _exit   (_fork)
                                  │
    Monitor thread ◄──────────────┘ one read per socket, frames →   _wire      monitor thread
      │  Hub.dispatch:                                              _processes
      Started → the task's clock starts (its deadline counts from here)
      Done    → Scheduler.task_returned: its Started→Done time to its cost model; _close:
                DONE, one Settle action; the worker's next task (the first sent ahead, else
                one written to it once the read's messages are handled) first; then
                the Settler sets the future: a plain result on the monitor at the end of its
                round, else on a settle thread (unpickle the result, or rebuild the exception
                as a RemoteError proxy); once nothing is left, the cost history is saved
      EOF     → Reaper: a task never started is queued again; a started one fails
                (WorkerCrashedError, exit code and output read by a job), never re-run
      deadline→ a job kills the worker's process group (SIGTERM, grace, SIGKILL) → its EOF →
                TaskTimeoutError

Workers belong to the process-wide :class:`._processes.Hub`, not to one executor: ``shutdown()``
returns idle workers to it, and the next executor with the same initializer reuses them.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import CodeType, FunctionType, ModuleType
from typing import Any, Literal, TypeVar

import cloudpickle

from ._base import BaseExecutor, Path, TaskOptions, failed_future, handoff, serialization_error
from ._costs import COST_ATTRIBUTE, CostKey, CostModel, Estimate, call_features, features_key
from ._costs import function_key as _function_key
from ._costs import shared_model as _shared_model
from ._errors import Classification
from ._processes import Task, current_hub, get_hub
from ._records import DEFAULT_IDLE_TIMEOUT_S, ExecutorStatistics, Settings, TaskTimeline
from ._scheduling import Scheduler
from ._validate import (
    check_count,
    check_flag,
    check_initializer,
    check_max_tasks_per_child,
    check_memory_limit,
    check_path,
    check_timeout,
    describe_unpicklable,
)
from ._worker import PLAIN_TYPES, Call

log = logging.getLogger("precompile_executor")

T = TypeVar("T")
Start = Literal["template", "interpreter"]
_STARTS = ("template", "interpreter")

DEFAULT_WORKERS_PER_CORE = 1.0
"""``max_workers`` by default: this many workers per usable core (at least one). Compiles on
every core slow each other by only a few per cent, far less than a core left idle costs: see
docs/gpu-runs.md, "Ordering by predicted cost", measured by
``benchmarks/s7_ordering.py --contention``."""

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_WORKERS_PER_CORE",
    "ExecutorStatistics",
    "PrecompileExecutor",
    "stop_idle_workers",
]


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


_warmed_callers: set[bytes] = set()
_warmed_lock = threading.Lock()


def _warm_caller(initializer: Any, initargs: tuple[Any, ...], key: bytes) -> None:
    """Run the caller's half of an initializer, ``initializer.in_caller(*initargs)``, once per
    process and per (initializer, initargs), on a daemon thread while the workers start
    (docs/design.md, "The caller's half of an initializer")."""
    in_caller = getattr(initializer, "in_caller", None)
    if not callable(in_caller):
        return
    with _warmed_lock:
        if key in _warmed_callers:
            return
        _warmed_callers.add(key)

    def run() -> None:
        try:
            in_caller(*initargs)
        except Exception:  # noqa: BLE001 - a warm-up only: the real work pays it if it failed
            log.debug("%r.in_caller%r failed", initializer, initargs, exc_info=True)

    threading.Thread(target=run, name="precompile-executor-warm-caller", daemon=True).start()


def _default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, round(cores * DEFAULT_WORKERS_PER_CORE))


class PrecompileExecutor(BaseExecutor[Scheduler]):
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
        memory_limit: bytes a task's process group — its worker and every process under it (a
            compiler it spawned) — may hold; checked every 20 ms while the task runs. Past it
            the group is killed at once and the task fails alone with
            :class:`TaskMemoryError` (a ``MemoryError``); its worker is replaced. Measured: the
            group's resident memory less the pages the worker shared with its warm template and
            libraries when the task started (about its USS; docs/design.md, "Memory limits").
            With a limit, tasks also start only while the running ones, counted at their
            limits, plus the next fit in the machine's available memory, so a batch queues
            instead of meeting the OOM killer (``statistics().waiting_for_memory``). ``None``:
            no limit; override per call with :meth:`options`.

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
        memory_limit: int | None = None,
    ) -> None:
        workers = check_count(max_workers, "max_workers", 1, optional=True)
        check_initializer(initializer, initargs, classify)
        spare_workers = check_count(spare_workers, "spare_workers", 0) or 0
        if start not in _STARTS:
            raise ValueError(f"start must be 'template' or 'interpreter', got {start!r}")
        check_flag(ignore_errors, "ignore_errors")
        options = TaskOptions(
            check_timeout(timeout, "timeout"),
            check_path(path),
            memory_limit=check_memory_limit(memory_limit),
        )
        init_blob = None
        if initializer is not None:
            try:
                init_blob = cloudpickle.dumps((initializer, initargs))
            except Exception as exc:
                raise TypeError(
                    f"initializer and initargs must be picklable for spawned workers: {exc}"
                ) from exc
        settings = Settings(
            max_workers=workers if workers is not None else _default_workers(),
            init_blob=init_blob,
            idle_timeout_s=check_timeout(idle_timeout, "idle_timeout"),
            classify=classify,
            ignore_errors=ignore_errors,
            devices=_check_devices(devices),
            spare_workers=spare_workers,
            start=start,
            cost_history=cost_history,
            max_tasks_per_child=check_max_tasks_per_child(max_tasks_per_child),
        )
        super().__init__(Scheduler(get_hub(), settings), options)
        if init_blob is not None:
            _warm_caller(initializer, initargs, init_blob)

    @property
    def max_workers(self) -> int:
        """Most tasks running at once, both paths together."""
        return self._backend.max_workers

    # -- sending a task (the layer's _send) ------------------------------------------------------

    def _prepare_map(self, fn: Callable[..., Any], opts: TaskOptions) -> bytes | None:
        """``fn`` pickled once for the whole ``map`` (the tasks carry only their arguments)."""
        if opts.path == "fork":
            return None
        try:
            return pickle_function(fn)
        except Exception:  # noqa: BLE001 - _send reports it (or forks) per task
            return None

    def _send(
        self, opts: TaskOptions, calls: list[Call], *, chunked: bool, prepared: Any
    ) -> Future[Any]:
        scheduler = self._backend
        # Refused early, before anything is pickled; read without the lock (flags only ever
        # set), and decided again under it below.
        scheduler.check_open()
        future: Future[Any] = Future()
        path: Literal["spawn", "fork"] = "fork" if opts.path == "fork" else "spawn"
        blob = None
        if path == "spawn":
            try:
                # fn and the arguments travel apart, so map() pickles fn once, not per task.
                fn_blob = prepared if prepared is not None else pickle_function(calls[0][0])
                blob = pickle.dumps((fn_blob, pickle_arguments(calls)), _PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - anything a __reduce__ may raise
                if opts.path != "auto":
                    what = describe_unpicklable(*calls[0]) if len(calls) == 1 else "a call"
                    advice = (
                        "Run unpicklable work on the fork path: executor.options(path='fork'), "
                        "or path='auto' to fall back to it automatically."
                    )
                    with scheduler.lock:
                        scheduler.count_unsendable()
                    return failed_future(
                        serialization_error(what, "for a spawned worker", advice, exc)
                    )
                path = "fork"
        cost, costs = self._cost_of(opts, calls)
        task = Task(
            future=future,
            owner=scheduler,
            path=path,
            calls=calls if path == "fork" else None,
            blob=blob,
            n=len(calls),
            chunked=chunked,
            timeout=opts.timeout,
            priority=opts.priority,
            want_output=opts.with_output,
            cost_key=cost,
            cost_model=costs,
            predicted_s=costs.estimate(cost) * len(calls),
            memory_limit=opts.memory_limit,
        )
        with scheduler.lock:
            scheduler.check_open()
            actions = scheduler.enqueue_predicted(task)
        scheduler.hub.run(actions)
        if not task.future_running:
            # Still queued: a cancel() must notify its waiters at once. Nobody else holds the
            # future yet, so none can come before this; one dispatched at once (the common,
            # warm case) is running and cannot be cancelled: no callback to add or to call.
            future.add_done_callback(scheduler.watch_cancel)
        return future

    def _cost_of(self, opts: TaskOptions, calls: list[Call]) -> tuple[CostKey, CostModel]:
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
        costs = self._backend.cost_model
        if estimate is not None:
            function = estimate.function or function
            if estimate.features is not None:
                features = features_key(estimate.features)
            if prior is None and isinstance(estimate.seconds, (int, float)):
                prior = float(estimate.seconds)
            if estimate.history is not None:
                costs = _shared_model(estimate.history)
        return CostKey(function, features, prior), costs

    def _check_memory_limit(self, value: object) -> int | None:
        """``memory_limit``: this backend enforces it (see the constructor)."""
        return check_memory_limit(value)

    # -- workers ---------------------------------------------------------------------------------

    def warm_up(self, timeout: float | None = None) -> list[int]:
        """Start all ``max_workers`` spawn workers and run the initializer in each; return pids.

        Raises:
            WorkerStartError: a worker could not start (its initializer raised, say).
            TimeoutError: not all workers were ready within ``timeout`` seconds.
            RuntimeError: the executor is shut down, or was shut down (``shutdown()``,
                ``terminate_workers()``) before all workers were ready.
        """
        self._check_view_open()
        with handoff.holding():  # the workers' hellos reach a caller that may be busy
            return self._backend.warm_up(timeout)

    def statistics(self) -> ExecutorStatistics:
        """Return an immutable snapshot of this executor's queue, tasks and workers."""
        return self._backend.statistics()

    def timeline(self) -> tuple[TaskTimeline, ...]:
        """Return when each settled task of this executor (and its views) passed each step.

        One immutable :class:`TaskTimeline` per task, oldest first (the last
        :data:`~precompile_executor._records.TIMELINE_LIMIT`): queued, sent, started, done, decoded,
        settled. ``benchmarks/gantt.py`` draws them.
        """
        return self._backend.timelines()

    def terminate_workers(self) -> None:
        """Shut down, cancel queued tasks, and stop every worker: running ones get SIGTERM (then
        SIGKILL after a grace), idle ones exit; pooled workers of the same initializer too."""
        self._backend.stop_workers(1.0, "killed by executor.terminate_workers()")

    def kill_workers(self) -> None:
        """Like :meth:`terminate_workers`, with SIGKILL for running tasks' process groups."""
        self._backend.stop_workers(0.0, "killed by executor.kill_workers()")


_PROTOCOL = pickle.HIGHEST_PROTOCOL
_by_reference: weakref.WeakKeyDictionary[Callable[..., Any], bytes] = weakref.WeakKeyDictionary()
_by_value: weakref.WeakKeyDictionary[Callable[..., Any], tuple[tuple[Any, ...], bytes]] = (
    weakref.WeakKeyDictionary()
)

_STABLE_TYPES = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))
"""Values whose pickle cannot change while the same object is bound: immutable, holding nothing."""


def pickle_function(fn: Callable[..., Any]) -> bytes:
    """``cloudpickle.dumps(fn)``, kept per function object while its bytes cannot have changed.

    A module's own top-level function, pickled by reference (its bytes are plain pickle's, a
    module and a name), is kept while that name in its module is still this function. A
    function pickled by value (a ``__main__`` function, a lambda, a closure: its code, and the
    globals and cells it uses as they are now) is kept with the objects its bytes were made
    from — its code, name, defaults, each global it names and each cell's content — and used
    while each of them is still the same object and every one is immutable (a number, a
    string, a tuple of such, a module, a class or function pickled by reference); one that
    uses a list, a dict or any other object that could change inside is pickled again for
    every task. Nothing is kept while a module is registered to be pickled by value.
    docs/design.md, "Per-task overhead".
    """
    if type(fn) is not FunctionType or cloudpickle.list_registry_pickle_by_value():
        return cloudpickle.dumps(fn, _PROTOCOL)  # type: ignore[no-any-return]
    kept_blob = _by_reference.get(fn)
    if kept_blob is not None and _named(fn):
        return kept_blob
    kept = _by_value.get(fn)
    if kept is not None:
        now = _made_from(fn)
        if now is not None and len(now) == len(kept[0]):
            if all(a is b for a, b in zip(now, kept[0], strict=True)):
                return kept[1]
    blob: bytes = cloudpickle.dumps(fn, _PROTOCOL)
    if _named(fn):
        try:
            by_reference = pickle.dumps(fn, _PROTOCOL) == blob
        except Exception:  # noqa: BLE001 - plain pickle cannot name it: not by reference
            by_reference = False
        if by_reference:
            _by_reference[fn] = blob
            return blob
    made_from = _made_from(fn)
    if made_from is not None:
        _by_value[fn] = (made_from, blob)
    return blob


def _made_from(fn: FunctionType) -> tuple[Any, ...] | None:
    """The objects ``fn``'s by-value pickle is made of, or ``None`` when one of them could
    change without being rebound (then its bytes are never kept)."""
    if fn.__dict__ or fn.__kwdefaults__:
        return None
    names = _global_names(fn.__code__)
    found = [fn.__globals__.get(name, _MISSING) for name in names]
    cells = [cell.cell_contents for cell in fn.__closure__ or ()]
    defaults = list(fn.__defaults__ or ())
    for value in (*found, *cells, *defaults):
        if not _stable(value):
            return None
    notes = fn.__annotations__
    if not all(_stable(v) for v in notes.values()):
        return None
    head = (fn.__code__, fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__)
    return (*head, fn.__defaults__, *found, *cells, *notes, *notes.values())


_MISSING = object()


def _stable(value: Any) -> bool:
    """Whether ``value``'s pickle stays the same while the same object is bound."""
    kind = type(value)
    if kind in _STABLE_TYPES or value is _MISSING:
        return True
    if kind is tuple:
        return all(_stable(v) for v in value)
    if kind is ModuleType:
        return True  # pickled by its name
    if kind is FunctionType or isinstance(value, type):
        return _named(value) and value.__module__ != "__main__"  # pickled by reference
    return False


@functools.lru_cache(maxsize=1024)
def _global_names(code: CodeType) -> tuple[str, ...]:
    """Every name ``code`` and the code nested in it may look up as a global (a superset:
    attribute names too)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names.update(_global_names(const))
    return tuple(sorted(names))


def _named(fn: Any) -> bool:
    """Whether ``fn`` is what its module's global of its name holds now."""
    module = sys.modules.get(fn.__module__)
    return module is not None and getattr(module, fn.__qualname__, None) is fn


def pickle_arguments(calls: list[Call]) -> bytes:
    """The calls' ``[(args, kwargs), ...]`` pickled: by plain pickle when every argument is of
    one of :data:`._worker.PLAIN_TYPES` (the same bytes, made faster), else by cloudpickle."""
    pairs = [(a, k) for _, a, k in calls]
    for args, kwargs in pairs:
        if kwargs or any(type(a) not in PLAIN_TYPES for a in args):
            blob: bytes = cloudpickle.dumps(pairs, _PROTOCOL)
            return blob
    return pickle.dumps(pairs, _PROTOCOL)


def stop_idle_workers(key: bytes | None = None) -> int:
    """Stop every idle worker in this process's pool (all initializers); return how many.

    Workers held by a live executor are not touched; use ``executor.terminate_workers()``.
    """
    hub = current_hub()
    return 0 if hub is None else hub.stop_idle(key)
