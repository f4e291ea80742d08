"""``PrecompileExecutor``: a ``concurrent.futures.Executor`` on warm, reusable worker processes.

Data flow::

    submit(fn, *args)                           (caller's thread)
      │  spawn path: cloudpickle (fn, args) now; a failure fails this future only
      │  ("auto": fall back to the fork path)
      ▼
    _Core queues ── priority heaps, one per path; futures stay PENDING (cancel() works)
      │  pump: dispatch only while busy processes < max_workers
      ├── spawn ──► idle Worker ── socket ──► loky worker: serve loop ── run, capture fd 1/2
      │              (none idle: take one from the Hub's pool, or start one with loky)
      └── fork ───► os.fork() child: setsid, run, send result over a socketpair, _exit
                                  │
    Hub monitor thread ◄──────────┘ one thread waits on every socket:
      "done"  → result unpickled, or exception rebuilt as a RemoteError proxy → Future
      EOF     → worker died → WorkerCrashedError for its task only; a replacement starts
      deadline→ kill the worker's process group (SIGTERM, grace, SIGKILL) → TaskTimeoutError

Workers belong to the process-wide :class:`._pool.Hub`, not to one executor: ``shutdown()``
returns idle workers to it, and the next executor with the same initializer reuses them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, InvalidStateError
from typing import Any, Literal, TypeVar

import cloudpickle

from ._errors import (
    Classification,
    RemoteError,
    ResultSerializationError,
    SerializationError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
    proxy_from_record,
)
from ._pool import Hub, Worker, get_hub
from ._worker import Call

log = logging.getLogger("precompile_executor")

T = TypeVar("T")
Path = Literal["spawn", "fork", "auto"]
_PATHS = ("spawn", "fork", "auto")

DEFAULT_IDLE_TIMEOUT_S = 600.0
"""Idle workers stay warm this long: an autotuner benchmarks for minutes between compile
batches, and a restart costs an interpreter plus its imports (about 1.5 s with torch)."""

MAX_RERUNS = 3
"""A task that never reached its worker (the worker died first) is re-queued at most this often.
A task that was running when its worker died is never re-run."""


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


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """What a task returns under ``executor.options(with_output=True)``.

    Attributes:
        value: the task's return value.
        output: what it wrote to stdout and stderr (fd level, so C code too).
        worker_pid: the process that ran it.
        elapsed_s: seconds from its start on the worker to its result.
    """

    value: Any
    output: str
    worker_pid: int
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class _Options:
    timeout: float | None
    path: Path
    priority: float
    with_output: bool


@dataclasses.dataclass(eq=False)
class _Task:
    id: int
    future: Future[Any]
    owner: _Core
    path: Literal["spawn", "fork"]
    calls: list[Call] | None
    blob: bytes | None
    n: int
    chunked: bool
    timeout: float | None
    priority: float
    want_output: bool
    reruns: int = 0
    requeued: bool = False
    claimed: bool = False
    started_at: float | None = None
    deadline: float | None = None
    worker: Worker | None = None
    kill_reason: str = ""

    def sort_key(self) -> tuple[float, int]:
        return (-self.priority, self.id)


_task_ids = itertools.count(1)
_AFTER_SHUTDOWN = "cannot schedule new futures after shutdown"


def _check_timeout(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0 seconds (or None for no limit), got {value!r}")
    return float(value)


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
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _describe_unpicklable(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Name the first of ``fn``, ``args`` and ``kwargs`` that cloudpickle cannot serialize."""
    candidates: list[tuple[str, Any]] = [("the callable", fn)]
    candidates += [(f"positional argument {i}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for what, obj in candidates:
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001
            return f"{what} {_short_repr(obj)} ({type(obj).__qualname__}): {exc}"
    return "the call"


def _short_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001
        text = object.__repr__(obj)
    return text if len(text) <= 80 else text[:77] + "..."


class _Core:
    """Scheduling state of one executor; every method runs with ``hub.lock`` held unless noted."""

    def __init__(
        self,
        hub: Hub,
        max_workers: int,
        init_blob: bytes | None,
        idle_timeout_s: float | None,
        classify: Callable[[BaseException], Classification] | None,
        ignore_errors: bool,
        devices: tuple[str, ...] | None = None,
        spare_workers: int = 0,
    ) -> None:
        self.hub = hub
        self.devices = devices
        self.spare_workers = spare_workers
        self.held = 0
        self.max_workers = max_workers
        self.init_blob = init_blob
        self.key = init_blob or b""
        self.idle_timeout_s = idle_timeout_s
        self.classify = classify
        self.ignore_errors = ignore_errors
        self.queues: dict[str, list[tuple[tuple[float, int], _Task]]] = {"spawn": [], "fork": []}
        self.workers: set[Worker] = set()
        self.running: set[_Task] = set()
        self.shutdown = False
        self.changed = threading.Condition(hub.lock)
        self.completed = self.failed = self.cancelled = 0
        self.timed_out = self.crashed = self.restarts = 0
        self.spawn_tasks = self.fork_tasks = 0
        self.start_error: BaseException | None = None

    # -- queueing and dispatch (lock held) -------------------------------------------------------

    def enqueue(self, task: _Task) -> None:
        heapq.heappush(self.queues[task.path], (task.sort_key(), task))

    def _head(self, path: str) -> _Task | None:
        queue = self.queues[path]
        while queue:
            task = queue[0][1]
            if not task.future.cancelled():
                return task
            heapq.heappop(queue)
            self.cancelled += 1
        return None

    def _busy(self) -> int:
        return sum(1 for w in self.workers if w.state == "busy")

    def pump(self) -> list[tuple[str, Any, Any]]:
        """Decide what to start now; returns actions for :meth:`act` to run outside the lock."""
        actions: list[tuple[str, Any, Any]] = []
        if self.held:  # inside executor.batch(): nothing starts until the whole batch is queued
            return actions
        busy = self._busy()
        idle = [w for w in self.workers if w.kind == "spawn" and w.state == "idle"]
        while busy < self.max_workers:
            spawn, fork = self._head("spawn"), self._head("fork")
            if spawn is not None and not idle:
                pooled = self.take_pooled()
                if pooled is not None:
                    pooled.owner = self
                    pooled.idle_timeout_s = self.idle_timeout_s
                    self.workers.add(pooled)
                    idle.append(pooled)
                else:
                    spawn = None
            choices = [t for t in (spawn, fork) if t is not None]
            if not choices:
                break
            task = min(choices, key=_Task.sort_key)
            heapq.heappop(self.queues[task.path])
            if not task.requeued and not task.future.set_running_or_notify_cancel():
                self.cancelled += 1
                continue
            now = time.monotonic()
            task.started_at = now
            task.deadline = now + task.timeout if task.timeout is not None else None
            self.running.add(task)
            busy += 1
            if task.path == "fork":
                self.fork_tasks += 1
                actions.append(("fork", task, None))
            else:
                worker = self._pick_idle(idle)
                worker.state = "busy"
                worker.task = task
                task.worker = worker
                self.spawn_tasks += 1
                actions.append(("send", worker, task))
        actions += self._start_workers_if_needed(busy, len(idle))
        if self.shutdown and not self.queues["spawn"] and not self.queues["fork"]:
            for worker in idle:
                self.workers.discard(worker)
                self.hub.release(worker)
        return actions

    def _start_workers_if_needed(self, busy: int, idle: int) -> list[tuple[str, Any, Any]]:
        waiting = len(self.queues["spawn"])  # may count a cancelled one: harmless, O(1)
        if not waiting:
            return []
        spawn_workers = sum(1 for w in self.workers if w.kind == "spawn")
        starting = sum(1 for w in self.workers if w.state == "starting")
        want = min(waiting, self.max_workers - busy) - idle - starting
        room = self.max_workers - spawn_workers
        starts = [("start", self._new_worker(), None) for _ in range(max(0, min(want, room)))]
        return starts + self.spares_needed() if starts else starts

    def device_key(self, device: str | None) -> bytes:
        """The pool key of this executor's workers pinned to ``device``."""
        return self.key if device is None else self.key + b"|device=" + device.encode()

    def _devices_least_used_first(self) -> list[str | None]:
        if not self.devices:
            return [None]
        count: dict[str | None, int] = dict.fromkeys(self.devices, 0)
        for w in self.workers:
            if w.kind == "spawn" and w.device in count:
                count[w.device] += 1
        return sorted(self.devices, key=lambda d: count[d])  # stable: ties keep list order

    def _pick_idle(self, idle: list[Worker]) -> Worker:
        """Take an idle worker, from the device with the fewest busy workers when pinned."""
        if self.devices and len(idle) > 1:
            busy = collections.Counter(
                w.device for w in self.workers if w.kind == "spawn" and w.state == "busy"
            )
            best = min(idle, key=lambda w: busy[w.device])
            idle.remove(best)
            return best
        return idle.pop()

    def take_pooled(self) -> Worker | None:
        """Take a warm idle worker from the hub's pool, keeping devices balanced."""
        for device in self._devices_least_used_first():
            worker = self.hub.take_idle(self.device_key(device))
            if worker is not None:
                return worker
        return None

    def spares_needed(self) -> list[tuple[str, Any, Any]]:
        """Start actions that bring this executor's warm spares up to ``spare_workers``."""
        if not self.spare_workers or self.shutdown:
            return []
        keys = {self.device_key(d) for d in (self.devices or [None])}
        have = sum(
            1
            for w in self.hub.workers
            if w.owner is None
            and w.kind == "spawn"
            and w.state in ("idle", "starting")
            and w.key in keys
        )
        actions: list[tuple[str, Any, Any]] = []
        for _ in range(self.spare_workers - have):
            device = self._devices_least_used_first()[0]
            spare = self.hub.new_spawn_worker(self.device_key(device), self.idle_timeout_s, device)
            actions.append(("start", spare, None))  # unowned: joins the hub's pool when ready
        return actions

    def _new_worker(self) -> Worker:
        device = self._devices_least_used_first()[0]
        worker = self.hub.new_spawn_worker(self.device_key(device), self.idle_timeout_s, device)
        worker.owner = self
        self.workers.add(worker)
        return worker

    def act(self, actions: list[tuple[str, Any, Any]]) -> None:
        """Run what :meth:`pump` decided (no lock held)."""
        wake = False
        for kind, a, b in actions:
            if kind == "send":
                worker, task = a, b
                message = pickle.dumps(("run", task.id, task.n, task.want_output, task.blob))
                log.debug("task %d on the spawn path, worker pid %d", task.id, worker.pid)
                if not self.hub.send(worker, message):
                    self._unsent(task)
                wake = wake or task.deadline is not None
            elif kind == "fork":
                self._fork(a)
            elif kind == "start":
                threading.Thread(
                    target=self.hub.launch,
                    args=(a, self.init_blob),
                    name="precompile-start",
                    daemon=True,
                ).start()
        if wake:
            self.hub.wake()

    def _fork(self, task: _Task) -> None:
        try:
            worker = self.hub.fork(task, self)
        except Exception as exc:  # noqa: BLE001 - e.g. EAGAIN: too many processes
            with self.hub.lock:
                task.claimed = True
            self._finish(task, exc=exc)
            return
        log.debug("task %d on the fork path, child pid %d", task.id, worker.pid)
        with self.hub.lock:
            task.worker = worker
            if worker.state != "dead":
                self.workers.add(worker)

    def _unsent(self, task: _Task) -> None:
        """The worker died before the task reached it: not the task's fault, so queue it again."""
        with self.hub.lock:
            if task.claimed:
                return
            self.running.discard(task)
            if task.reruns < MAX_RERUNS:
                task.reruns += 1
                task.requeued = True
                task.worker = None
                self.enqueue(task)
                actions = self.pump()
            else:
                task.claimed = True
                actions = []
        if task.claimed:
            self._finish(task, exc=WorkerCrashedError(0, None, detail="no worker could take it"))
        self.act(actions)

    # -- results (no lock held) ----------------------------------------------------------------

    def _classify(self, exc: BaseException) -> Classification:
        if self.ignore_errors:
            return "debug"
        if self.classify is None:
            return "raise"
        try:
            verdict = self.classify(exc)
        except Exception:  # noqa: BLE001 - a broken hook must not lose the task's error
            log.exception("the classify hook raised; treating the error as 'raise'")
            return "raise"
        return verdict if verdict in ("raise", "warn", "debug") else "raise"

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, RemoteError):
            exc.classification = self._classify(exc)
        return exc

    def _outcome(self, task: _Task, ok: bool, payload: Any) -> tuple[bool, Any]:
        if not ok:
            return False, self._error(proxy_from_record(payload))
        try:
            return True, cloudpickle.loads(payload)
        except Exception as exc:  # noqa: BLE001
            err = ResultSerializationError(
                f"the task's result could not be unpickled in the parent: "
                f"{type(exc).__name__}: {exc}. Return plain data, or make its class importable "
                "in the caller."
            )
            err.worker_pid = task.worker.pid if task.worker else 0
            return False, self._error(err)

    def _finish(self, task: _Task, *, exc: BaseException | None = None, value: Any = None) -> None:
        with self.hub.lock:
            self.running.discard(task)
            if exc is None:
                self.completed += 1
            else:
                self.failed += 1
                if isinstance(exc, TaskTimeoutError):
                    self.timed_out += 1
                elif isinstance(exc, WorkerCrashedError):
                    self.crashed += 1
            self.changed.notify_all()
        try:
            if exc is not None:
                task.future.set_exception(exc)
            else:
                task.future.set_result(value)
        except InvalidStateError:
            pass

    def on_task_done(
        self, worker: Worker, task: _Task, outcomes: list[Any], output: str | None
    ) -> None:
        """A worker sent a task's outcomes (monitor thread)."""
        if worker.kind == "spawn":
            with self.hub.lock:
                actions = self.pump()
            self.act(actions)
        results = [self._outcome(task, ok, payload) for ok, payload in outcomes]
        if task.chunked:
            self._finish(task, value=results)
            return
        ok, value = results[0]
        if not ok:
            self._finish(task, exc=value)
        elif task.want_output:
            elapsed = time.monotonic() - (task.started_at or time.monotonic())
            self._finish(task, value=TaskResult(value, output or "", worker.pid, elapsed))
        else:
            self._finish(task, value=value)

    def on_task_crashed(
        self, task: _Task, worker: Worker, exit_code: int | None, output: str
    ) -> None:
        """The worker died while running ``task``."""
        err = WorkerCrashedError(worker.pid, exit_code, output, detail=task.kill_reason)
        self._finish(task, exc=self._error(err))

    def on_task_timeout(self, task: _Task, worker: Worker, elapsed: float, output: str) -> None:
        """``task`` ran past its deadline; its worker's group is dead now."""
        err = TaskTimeoutError(task.timeout or 0.0, elapsed, worker.pid, output)
        self._finish(task, exc=self._error(err))

    # -- worker lifecycle (no lock held) -------------------------------------------------------

    def on_worker_ready(self, worker: Worker) -> None:
        with self.hub.lock:
            actions = self.pump()
            self.changed.notify_all()
        self.act(actions)

    def on_worker_gone(self, worker: Worker, *, expected: bool) -> None:
        with self.hub.lock:
            self.workers.discard(worker)
            if worker.kind == "spawn" and not expected:
                self.restarts += 1
                if not self.shutdown:
                    # Keep the pool at strength: a warm spare takes the dead worker's place at
                    # once; without one, a replacement starts now, not when the next task comes.
                    spare = self.take_pooled()
                    if spare is not None:
                        spare.owner = self
                        spare.idle_timeout_s = self.idle_timeout_s
                        self.workers.add(spare)
                        self.act_later(self.spares_needed())
                    else:
                        self.act_later([("start", self._new_worker(), None), *self.spares_needed()])
            actions = self.pump()
            self.changed.notify_all()
        self.act(actions)

    def abandon(self) -> None:
        """The executor object is gone: shut down without waiting (finalizer)."""
        with self.hub.lock:
            self.shutdown = True
            actions = self.pump()
        self.act(actions)

    def act_later(self, actions: list[tuple[str, Any, Any]]) -> None:
        threading.Thread(target=self.act, args=(actions,), daemon=True).start()

    def on_start_failed(self, worker: Worker, exc: BaseException) -> None:
        doomed: list[_Task] = []
        with self.hub.lock:
            self.workers.discard(worker)
            self.start_error = exc
            alive = any(w.kind == "spawn" for w in self.workers)
            if not alive:
                doomed = [t for _, t in self.queues["spawn"]]
                self.queues["spawn"].clear()
            self.changed.notify_all()
        log.warning("a worker failed to start: %s", exc)
        for task in doomed:
            if task.requeued or task.future.set_running_or_notify_cancel():
                error = WorkerStartError(f"no worker could start to run this task: {exc}")
                error.__cause__ = exc
                self._finish(task, exc=error)


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
            GPU. A replacement worker goes to the device with the fewest. ``None``: no pinning.

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
        if not isinstance(ignore_errors, bool):
            raise TypeError(f"ignore_errors must be a bool, got {ignore_errors!r}")
        self._options = _Options(_check_timeout(timeout, "timeout"), _check_path(path), 0.0, False)
        idle = _check_timeout(idle_timeout, "idle_timeout")
        init_blob = None
        if initializer is not None:
            try:
                init_blob = cloudpickle.dumps((initializer, initargs))
            except Exception as exc:
                raise TypeError(
                    f"initializer and initargs must be picklable for spawned workers: {exc}"
                ) from exc
        self._core = _Core(
            get_hub(),
            max_workers,
            init_blob,
            idle,
            classify,
            ignore_errors,
            _check_devices(devices),
            spare_workers,
        )
        self._parent: PrecompileExecutor | None = None
        # Dropped without shutdown(): let its workers go back to the pool once they are idle,
        # rather than holding them until their idle timeout.
        weakref.finalize(self, self._core.abandon).atexit = False

    @property
    def max_workers(self) -> int:
        """Most tasks running at once, both paths together."""
        return self._core.max_workers

    # -- submitting ------------------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Schedule ``fn(*args, **kwargs)``; return a standard ``concurrent.futures.Future``.

        Raises:
            TypeError: ``fn`` is not callable.
            RuntimeError: the executor was shut down.
        """
        return self._submit(self._options, [(fn, args, kwargs)], chunked=False)

    def _submit(
        self, opts: _Options, calls: list[Call], *, chunked: bool, fn_blob: bytes | None = None
    ) -> Future[Any]:
        fn = calls[0][0]
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__} {_short_repr(fn)}")
        future: Future[Any] = Future()
        core = self._core
        path: Literal["spawn", "fork"] = "fork" if opts.path == "fork" else "spawn"
        blob = None
        if path == "spawn":
            try:
                # fn and the arguments travel apart, so map() pickles fn once, not per task.
                if fn_blob is None:
                    fn_blob = cloudpickle.dumps(fn)
                blob = pickle.dumps((fn_blob, cloudpickle.dumps([(a, k) for _, a, k in calls])))
            except Exception as exc:  # noqa: BLE001 - anything a __reduce__ may raise
                if opts.path == "auto":
                    path = "fork"
                else:
                    what = _describe_unpicklable(*calls[0]) if len(calls) == 1 else "a call"
                    error = SerializationError(
                        f"could not serialize {what} for a spawned worker. Run unpicklable work "
                        "on the fork path: executor.options(path='fork'), or path='auto' to fall "
                        "back to it automatically."
                    )
                    error.__cause__ = exc
                    with core.hub.lock:
                        if core.shutdown:
                            raise RuntimeError(_AFTER_SHUTDOWN) from None
                        core.failed += 1
                    future.set_running_or_notify_cancel()
                    future.set_exception(error)
                    return future
        task = _Task(
            id=next(_task_ids),
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
        )
        with core.hub.lock:
            if core.shutdown:
                raise RuntimeError(_AFTER_SHUTDOWN)
            core.enqueue(task)
            actions = core.pump()
        core.act(actions)
        return future

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]:
        """Like :meth:`concurrent.futures.Executor.map`: results lazily, in input order.

        ``timeout`` counts from this call; a task's exception is raised when its position is
        reached; ``chunksize`` sends that many calls to a worker in one message (each call
        still gets its own result or exception; the per-task timeout covers the chunk).
        """
        return self._map(self._options, fn, iterables, timeout, chunksize)

    def _map(
        self,
        opts: _Options,
        fn: Callable[..., T],
        iterables: tuple[Iterable[Any], ...],
        timeout: float | None,
        chunksize: int,
    ) -> Iterator[T]:
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"chunksize must be an int >= 1, got {chunksize!r}")
        end = None if timeout is None else time.monotonic() + timeout
        arg_tuples = zip(*iterables, strict=False)
        futures: list[Future[Any]] = []
        fn_blob = None
        if opts.path != "fork" and callable(fn):
            try:
                fn_blob = cloudpickle.dumps(fn)
            except Exception:  # noqa: BLE001 - _submit reports it (or forks) per task
                fn_blob = None
        if chunksize == 1:
            futures = [
                self._submit(opts, [(fn, a, {})], chunked=False, fn_blob=fn_blob)
                for a in arg_tuples
            ]
        else:
            while chunk := list(itertools.islice(arg_tuples, chunksize)):
                calls: list[Call] = [(fn, a, {}) for a in chunk]
                futures.append(self._submit(opts, calls, chunked=True, fn_blob=fn_blob))
        return _results(futures, end, chunked=chunksize > 1)

    def options(
        self,
        *,
        timeout: float | None | object = ...,
        path: Path | object = ...,
        priority: float | object = ...,
        with_output: bool | object = ...,
    ) -> PrecompileExecutor:
        """Return a view of this executor with other per-task settings; it shares the pool.

        Args:
            timeout: per-task timeout in seconds (``None``: none).
            path: ``"spawn"``, ``"fork"`` or ``"auto"``.
            priority: higher starts first among queued tasks (e.g. the largest configs first,
                so the longest compile does not start last); ties keep submission order.
            with_output: results come back as :class:`TaskResult` with the captured output.
        """
        opts = self._options
        if timeout is not ...:
            opts = dataclasses.replace(opts, timeout=_check_timeout(timeout, "timeout"))
        if path is not ...:
            opts = dataclasses.replace(opts, path=_check_path(path))
        if priority is not ...:
            if isinstance(priority, bool) or not isinstance(priority, (int, float)):
                raise TypeError(f"priority must be a number, got {priority!r}")
            opts = dataclasses.replace(opts, priority=float(priority))
        if with_output is not ...:
            if not isinstance(with_output, bool):
                raise TypeError(f"with_output must be a bool, got {with_output!r}")
            opts = dataclasses.replace(opts, with_output=with_output)
        view = object.__new__(PrecompileExecutor)
        view._core = self._core
        view._options = opts
        view._parent = self._parent or self  # keeps the executor (and its finalizer) alive
        return view

    @contextlib.contextmanager
    def batch(self) -> Iterator[PrecompileExecutor]:
        """Queue everything submitted inside the block; start it only when the block exits.

        Without it, the first ``max_workers`` submissions start at once in submission order, so
        ``options(priority=...)`` can only order the rest. Inside it, priority orders the whole
        batch: e.g. the largest configs first, so the longest compile does not start last.
        """
        core = self._core
        with core.hub.lock:
            core.held += 1
        try:
            yield self
        finally:
            with core.hub.lock:
                core.held -= 1
                actions = core.pump()
            core.act(actions)

    # -- workers ---------------------------------------------------------------------------------

    def warm_up(self, timeout: float | None = None) -> list[int]:
        """Start all ``max_workers`` spawn workers and run the initializer in each; return pids.

        Raises:
            WorkerStartError: a worker could not start (its initializer raised, say).
            TimeoutError: not all workers were ready within ``timeout`` seconds.
        """
        core = self._core
        end = None if timeout is None else time.monotonic() + timeout
        with core.hub.lock:
            if core.shutdown:
                raise RuntimeError("cannot warm up after shutdown")
            core.start_error = None
            actions: list[tuple[str, Any, Any]] = []
            while sum(1 for w in core.workers if w.kind == "spawn") < core.max_workers:
                pooled = core.take_pooled()
                if pooled is not None:
                    pooled.owner = core
                    core.workers.add(pooled)
                else:
                    actions.append(("start", core._new_worker(), None))
            actions += core.spares_needed()
        core.act(actions)
        with core.hub.lock:
            while True:
                spawn = [w for w in core.workers if w.kind == "spawn"]
                if core.start_error is not None:
                    raise WorkerStartError(
                        f"a worker failed to start: {core.start_error}"
                    ) from core.start_error
                if spawn and all(w.state in ("idle", "busy") for w in spawn):
                    return sorted(w.pid for w in spawn)
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"workers were not ready within {timeout}s")
                core.changed.wait(left)

    def statistics(self) -> ExecutorStatistics:
        """Return an immutable snapshot of this executor's queue, tasks and workers."""
        core = self._core
        with core.hub.lock:
            queued = [t for q in core.queues.values() for _, t in q]
            return ExecutorStatistics(
                queued=sum(1 for t in queued if not t.future.cancelled()),
                running=len(core.running),
                completed=core.completed,
                failed=core.failed,
                cancelled=core.cancelled + sum(1 for t in queued if t.future.cancelled()),
                timed_out=core.timed_out,
                crashed=core.crashed,
                workers_alive=sum(1 for w in core.workers if w.state != "dead"),
                worker_restarts=core.restarts,
                spawn_tasks=core.spawn_tasks,
                fork_tasks=core.fork_tasks,
            )

    # -- shutting down ---------------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; idle workers go back to the process-wide pool, still warm.

        Args:
            wait: block until every queued and running task has finished.
            cancel_futures: cancel the tasks that have not started.
        """
        core = self._core
        with core.hub.lock:
            core.shutdown = True
            core.held = 0  # a batch() still open must not keep shutdown(wait=True) waiting
            cancelled: list[_Task] = []
            if cancel_futures:
                for queue in core.queues.values():
                    cancelled += [t for _, t in queue]
                    queue.clear()
            actions = core.pump()
        for task in cancelled:
            if task.future.cancel():
                with core.hub.lock:
                    core.cancelled += 1
        core.act(actions)
        if wait:
            with core.hub.lock:
                while core.running or any(core.queues.values()):
                    core.changed.wait(1.0)
                actions = core.pump()
            core.act(actions)

    def _kill_running(self, grace_s: float, reason: str) -> None:
        core = self._core
        with core.hub.lock:
            busy = [(w, w.task) for w in core.workers if w.state == "busy" and w.task is not None]
            for _, task in busy:
                task.kill_reason = reason
        from ._process import kill_group

        threads = [
            threading.Thread(target=kill_group, args=(w.pid, grace_s), daemon=True)
            for w, _ in busy
            if w.pid
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=grace_s + 10)

    def terminate_workers(self) -> None:
        """Shut down, cancel queued tasks, and stop every worker: running ones get SIGTERM (then
        SIGKILL after a grace), idle ones exit; pooled workers of the same initializer too."""
        self._stop_all(grace_s=1.0, how="terminate_workers()")

    def kill_workers(self) -> None:
        """Like :meth:`terminate_workers`, with SIGKILL for running tasks' process groups."""
        self._stop_all(grace_s=0.0, how="kill_workers()")

    def _stop_all(self, grace_s: float, how: str) -> None:
        self.shutdown(wait=False, cancel_futures=True)
        self._kill_running(grace_s, f"killed by executor.{how}")
        self._wait_idle(timeout_s=30.0)
        core = self._core
        with core.hub.lock:
            idle = [w for w in core.workers if w.kind == "spawn"]
        for worker in idle:
            core.hub.stop(worker)
        for device in core.devices or [None]:
            core.hub.stop_idle(core.device_key(device))

    def _wait_idle(self, timeout_s: float) -> None:
        core = self._core
        end = time.monotonic() + timeout_s
        with core.hub.lock:
            while core.running and time.monotonic() < end:
                core.changed.wait(0.1)

    def interrupt(self) -> None:
        """Cancel queued tasks and kill running ones now (what Ctrl-C in a batch does)."""
        core = self._core
        with core.hub.lock:
            cancelled = [t for q in core.queues.values() for _, t in q]
            for queue in core.queues.values():
                queue.clear()
        for task in cancelled:
            task.future.cancel()
        self._kill_running(0.0, "killed because the caller was interrupted")
        self._wait_idle(timeout_s=30.0)

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Literal[False]:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupt()
        self.shutdown(wait=True)
        return False


def _results(futures: list[Future[Any]], end: float | None, *, chunked: bool) -> Iterator[Any]:
    pending = futures[::-1]
    try:
        while pending:
            future = pending[-1]
            value = future.result() if end is None else future.result(end - time.monotonic())
            pending.pop()
            if not chunked:
                yield value
                continue
            for ok, item in value:
                if not ok:
                    raise item
                yield item
    finally:
        for future in pending:
            future.cancel()


def stop_idle_workers() -> int:
    """Stop every idle worker in this process's pool (all initializers); return how many.

    Workers held by a live executor are not touched; use ``executor.terminate_workers()``.
    """
    return get_hub().stop_idle()


def kill_running_futures(futures: Iterable[Future[Any]]) -> None:
    """Kill the workers running any of ``futures`` (process group, SIGKILL) and wait for them.

    Used on Ctrl-C and errors in :func:`wait_for_all`: nothing keeps running or printing.
    """
    wanted = {id(f) for f in futures}
    hub = get_hub()
    with hub.lock:
        victims = [
            w
            for w in hub.workers
            if w.state == "busy" and w.task is not None and id(w.task.future) in wanted
        ]
        for worker in victims:
            assert worker.task is not None
            worker.task.kill_reason = "killed because the batch was interrupted"
    from ._process import kill_group

    for worker in victims:
        if worker.pid:
            kill_group(worker.pid, grace_s=0)
    deadline = time.monotonic() + 10.0
    for worker in victims:
        task = worker.task
        if task is not None:
            try:
                task.future.exception(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - TimeoutError/CancelledError: nothing more to do
                pass
