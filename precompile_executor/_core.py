"""One executor's scheduling state: its queues, its tasks in flight, its workers.

Every method marked "lock held" runs under the hub's lock and returns the actions it decided
(:mod:`._state`); the caller runs them with :meth:`._hub.Hub.run` after releasing the lock.
The hub calls the :class:`._state.Owner` methods when a task starts, returns, is lost or fails,
and when a worker is ready, gone or failed to start.

Each task carries its predicted cost (:mod:`._costs`), fixed when it is submitted; the queues
order by :meth:`._state.Task.sort_key` (priority, then the longest predicted, then the oldest).
When a task's ``Done`` arrives, its in-worker duration (``Started`` to ``Done``) is recorded in
its cost model; when the executor has nothing left to do, the settle thread that noticed writes
the model's history file. Each settled task leaves a :class:`TaskTimeline` (at most
:data:`TIMELINE_LIMIT`, oldest dropped).

A task is resolved in one place: :meth:`Core._close` moves it to DONE under the lock (only the
first caller wins) and emits a :class:`Settle` action; :meth:`Core.settle`, on a settle-pool
thread, decodes the outcome and sets the future. Nothing else sets a task's future.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any, Literal

import cloudpickle

from . import _scheduler
from ._costs import CostModel
from ._errors import (
    Classification,
    RemoteError,
    ResultSerializationError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
    proxy_from_record,
)
from ._hub import Hub
from ._messages import Done
from ._state import Action, Fork, Launch, Send, Settle, StopWorker, Task, TaskState, WorkerHandle

log = logging.getLogger("precompile_executor")


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
class TaskTimeline:
    """When one settled task passed each step, from :meth:`PrecompileExecutor.timeline`.

    Times are ``time.monotonic()`` seconds in the caller's process; a step the task never
    reached (a task that failed before it started) is ``None``.

    Attributes:
        task_id: the executor's id of the task (submission order).
        function: what its cost is recorded under (``module:qualname``, ``triton:<kernel>``).
        features: what described the call (its history key; ``""``: nothing).
        path: ``"spawn"`` or ``"fork"``.
        worker_pid: the process that ran it (0 if none returned it).
        calls: calls in the task (``map(chunksize=n)`` sends n).
        predicted_s: its predicted duration when it was queued (0: nothing was known).
        ok: whether its future got a value (not an exception).
        queued: submitted to the queue.
        sent: written to a worker (or forked).
        started: the worker's ``Started`` arrived; the in-worker clock starts.
        done: the worker's ``Done`` was handled (its result is in this process).
        decoded: the result was unpickled (or the error rebuilt).
        settled: the future was set (its done-callbacks run right after: for a Triton compile,
            installing the artifacts, see ``CompileJob.installed_at``).
        future: the task's future (to join with other records) while the caller still holds it,
            else ``None``: the timeline holds it weakly, so it never keeps a result alive.
    """

    task_id: int
    function: str
    features: str
    path: str
    worker_pid: int
    calls: int
    predicted_s: float
    ok: bool
    queued: float | None
    sent: float | None
    started: float | None
    done: float | None
    decoded: float | None
    settled: float | None
    future_ref: weakref.ref[Future[Any]] = dataclasses.field(repr=False, compare=False)

    @property
    def future(self) -> Future[Any] | None:
        return self.future_ref()

    @property
    def run_s(self) -> float | None:
        """Seconds in the worker (``started`` to ``done``): what the cost model records."""
        if self.started is None or self.done is None:
            return None
        return self.done - self.started


TIMELINE_LIMIT = 10_000
"""Timeline records an executor keeps (about 200 bytes each); older ones are dropped."""

MAX_REQUEUES = 3
"""A task whose worker died before it started runs elsewhere; after this many such deaths in a
row it fails (something kills every worker it reaches). A started task is never run again."""

AFTER_SHUTDOWN = "cannot schedule new futures after shutdown"


class Core:
    """Scheduling state of one executor (shared by its ``options()`` views)."""

    def __init__(
        self,
        hub: Hub,
        max_workers: int,
        init_blob: bytes | None,
        idle_timeout_s: float | None,
        classify: Callable[[BaseException], Classification] | None,
        ignore_errors: bool,
        devices: tuple[str, ...] | None,
        spare_workers: int,
        start: Literal["template", "interpreter"] = "template",
        max_tasks_per_child: int | None = None,
    ) -> None:
        self.hub = hub
        self.start = start
        self.max_tasks_per_child = max_tasks_per_child
        self.lock = hub.lock
        self.changed = hub.changed
        self.max_workers = max_workers
        self.init_blob = init_blob
        self.key = init_blob or b""
        self.idle_timeout_s = idle_timeout_s
        self.classify = classify
        self.ignore_errors = ignore_errors
        self.devices = devices
        self.spare_workers = spare_workers
        self.queues: dict[str, list[tuple[tuple[float, float, int], Task]]] = {
            "spawn": [],
            "fork": [],
        }
        self.in_flight: set[Task] = set()  # SENT or STARTED: each holds one of max_workers
        self.unsettled = 0  # closed, future not yet set
        self.workers: set[WorkerHandle] = set()  # this executor's live workers (both paths)
        self.idle: list[WorkerHandle] = []  # its idle spawn workers, warmest last
        self.held = 0  # open batch() blocks: nothing is dispatched meanwhile
        self.predicted_max = 0.0  # the longest prediction of the tasks queued so far
        self.shutdown = False
        self.broken: BaseException | None = None
        self.completed = self.failed = self.cancelled = 0
        self.timed_out = self.crashed = self.restarts = 0
        self.spawn_tasks = self.fork_tasks = 0
        self.timeline: deque[TaskTimeline] = deque(maxlen=TIMELINE_LIMIT)
        self.learned: set[CostModel] = set()  # cost models with observations not yet saved
        self.saving = 0  # settle threads writing cost histories
        hub.cores.add(self)

    # -- submitting (lock held) -----------------------------------------------------------------

    def check_open(self) -> None:
        """Raise if no task may be submitted now (lock held)."""
        if self.hub.exiting or self.hub.closed:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if self.broken is not None:
            raise self.broken
        if self.shutdown:
            raise RuntimeError(AFTER_SHUTDOWN)

    def enqueue(self, task: Task) -> list[Action]:
        if task.queued_at is None:
            task.queued_at = time.monotonic()
        heapq.heappush(self.queues[task.path], (task.sort_key(), task))
        return self.pump()

    def queued(self) -> list[Task]:
        """Tasks waiting for a worker whose futures are not cancelled (lock held)."""
        return [t for q in self.queues.values() for _, t in q if not t.future.cancelled()]

    def busy(self) -> bool:
        """Whether anything of this executor is queued, in flight, unsettled or being saved
        (lock held)."""
        return bool(self.in_flight or self.unsettled or self.saving or self.queued())

    # -- dispatch (lock held) -------------------------------------------------------------------

    def _head(self, path: str) -> Task | None:
        queue = self.queues[path]
        while queue:
            task = queue[0][1]
            if task.future_running or not task.future.cancelled():
                return task
            heapq.heappop(queue)
            self.claim(task)  # False: cancelled (notified now if it was not yet)
            task.close()
            self.cancelled += 1
        return None

    def claim(self, task: Task) -> bool:
        """Call the future's ``set_running_or_notify_cancel()``, once per task whoever asks:
        True, RUNNING (it may start); False, the user cancelled it, and its waiters are
        notified, so ``wait()`` and ``as_completed()`` see it (lock held)."""
        if task.future_running:
            return True
        if task.cancel_notified:
            return False
        if task.future.set_running_or_notify_cancel():
            task.future_running = True
            return True
        task.cancel_notified = True
        return False

    def cancelled_by_user(self, task: Task) -> None:
        """A queued task's future was cancelled: notify its waiters now, not when the queue
        reaches it (the queue drops it then, lock held)."""
        if task.state is TaskState.QUEUED:
            self.claim(task)

    def pump(self) -> list[Action]:
        """Dispatch what may start now; start workers the queue needs."""
        actions: list[Action] = []
        if self.held:
            return actions
        while _scheduler.free_slots(self.max_workers, len(self.in_flight)):
            spawn, fork = self._head("spawn"), self._head("fork")
            if spawn is not None and not self.idle:
                self._adopt_pooled()
            path = _scheduler.next_path(
                spawn.sort_key() if spawn else None,
                fork.sort_key() if fork else None,
                bool(self.idle),
            )
            if path is None:
                break
            _, task = heapq.heappop(self.queues[path])
            if not self.claim(task):
                task.close()
                self.cancelled += 1
                continue
            now = time.monotonic()
            self.in_flight.add(task)
            if path == "fork":
                task.state = TaskState.SENT  # the fork itself runs outside the lock
                task.sent_at = now
                self.fork_tasks += 1
                actions.append(Fork(task))
            else:
                worker = self._take_idle()
                worker.take(task, now)
                task.send_to(worker, now)
                self.spawn_tasks += 1
                actions.append(Send(worker, task))
        actions += self._start_workers()
        if self.shutdown and not self.queued():
            actions += self._release_idle()
        self.changed.notify_all()
        return actions

    def _take_idle(self) -> WorkerHandle:
        if not self.devices:
            return self.idle.pop()  # the warmest
        busy = Counter(w.device for w in self.workers if w.state == "busy")
        index = _scheduler.pick_idle([w.device for w in self.idle], busy)
        return self.idle.pop(index)

    def _adopt(self, worker: WorkerHandle) -> None:
        worker.owner = self
        worker.idle_timeout_s = self.idle_timeout_s
        self.workers.add(worker)

    def _adopt_pooled(self) -> bool:
        """Take a warm idle worker from the hub's pool, keeping devices balanced."""
        for device in self._devices_least_used_first():
            worker = self.hub.take_pooled(self.device_key(device))
            if worker is not None:
                self._adopt(worker)
                self.idle.append(worker)
                return True
        return False

    def _release_idle(self) -> list[Action]:
        now = time.monotonic()
        actions: list[Action] = []
        for worker in self.idle:
            actions += self._give_back(worker, now)
        self.idle.clear()
        return actions

    def _give_back(self, worker: WorkerHandle, now: float) -> list[Action]:
        """An idle worker leaves this executor: to the hub's pool, still warm — unless it ran
        tasks under ``max_tasks_per_child``: then it stops, so the next executor counts its
        limit from a fresh process, as the stdlib's pool (one pool, its own processes) does."""
        self.workers.discard(worker)
        if worker.max_tasks is not None and worker.tasks_run:
            self.hub.forget(worker)
            return [StopWorker(worker, kill=False)]
        self.hub.put_pooled(worker, now)
        return []

    def _spawn_workers(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.kind == "spawn"]

    def _start_workers(self) -> list[Action]:
        # Also after shutdown(): queued tasks still run (and a re-queued one needs a worker).
        if self.broken is not None:
            return []
        waiting = self._waiting_spawn(limit=self.max_workers)
        if not waiting:
            return []
        spawn = self._spawn_workers()
        n = _scheduler.workers_to_start(
            waiting=waiting,
            idle=len(self.idle),
            starting=sum(1 for w in spawn if w.state == "starting"),
            spawn_workers=len(spawn),
            in_flight=len(self.in_flight),
            max_workers=self.max_workers,
        )
        starts: list[Action] = [self._new_worker() for _ in range(n)]
        return starts + self.spares_needed() if starts else starts

    def start_note(self) -> str | None:
        """Why this executor's workers fell back from a template to interpreters (lock held)."""
        if self.start != "template":
            return None
        return self.hub.template_refused(self.key)

    def effective_start(self) -> str:
        """How this executor's workers start now (lock held)."""
        if self.start == "template" and self.start_note() is None:
            return "template"
        return "interpreter"

    def _waiting_spawn(self, limit: int) -> int:
        """Queued spawn tasks not cancelled, counted up to ``limit`` (no decision needs more):
        the pump runs after every task, so it must not walk a queue of thousands."""
        n = 0
        for _, task in self.queues["spawn"]:
            if task.future_running or not task.future.cancelled():
                n += 1
                if n >= limit:
                    break
        return n

    def enqueue_predicted(self, task: Task) -> list[Action]:
        """Queue ``task``; one with no prediction is placed as the longest task this executor
        has predicted (ties keep submission order), not last and not as an average one: an
        unknown task (a first call of a new function, a hang) may be long, and a long task that
        starts late holds the batch for its whole duration, while a short one started early
        costs nothing (lock held). Measured on the fault batch of benchmarks/s8_starts.py."""
        if task.predicted_s > 0:
            self.predicted_max = max(self.predicted_max, task.predicted_s)
        else:
            task.predicted_s = self.predicted_max
        return self.enqueue(task)

    def device_key(self, device: str | None) -> bytes:
        """The pool key of this executor's workers pinned to ``device``: workers are shared
        only by executors with the same initializer, device and ``max_tasks_per_child`` (a
        worker counts its tasks from its start and leaves after that many)."""
        key = self.key
        if self.max_tasks_per_child is not None:
            key += b"|max_tasks=%d" % self.max_tasks_per_child
        return key if device is None else key + b"|device=" + device.encode()

    def _devices_least_used_first(self) -> list[str | None]:
        if not self.devices:
            return [None]
        load = Counter(w.device for w in self._spawn_workers())
        return sorted(self.devices, key=lambda d: load[d])  # stable: ties keep list order

    def _new_worker(self, *, owned: bool = True) -> Launch:
        device = self._devices_least_used_first()[0]
        worker = self.hub.new_worker(
            self.device_key(device),
            self if owned else None,
            self.idle_timeout_s,
            device,
            start=self.start,
            template_key=self.key,
            max_tasks=self.max_tasks_per_child,
        )
        if owned:
            self.workers.add(worker)
        return Launch(worker, self.init_blob)

    def spares_needed(self) -> list[Action]:
        """Starts that bring the pool's warm spares for this executor up to ``spare_workers``."""
        if not self.spare_workers or self.shutdown:
            return []
        keys = {self.device_key(d) for d in (self.devices or [None])}
        have = sum(
            1
            for w in self.hub.workers
            if w.owner is None and w.state in ("idle", "starting") and w.key in keys
        )
        return [self._new_worker(owned=False) for _ in range(self.spare_workers - have)]

    def warm_up_actions(self) -> list[Action]:
        """Bring this executor to ``max_workers`` spawn workers (lock held)."""
        actions: list[Action] = []
        while len(self._spawn_workers()) < self.max_workers:
            if not self._adopt_pooled():
                actions.append(self._new_worker())
        return actions + self.spares_needed()

    # -- the hub's reports (lock held) ----------------------------------------------------------

    def _close(self, task: Task, outcome: Any) -> list[Action]:
        """The one place a task is resolved: DONE now, its future set by :meth:`settle`."""
        self.in_flight.discard(task)
        if not task.close():
            return []
        self.unsettled += 1
        return [Settle(task, outcome)]

    def task_returned(self, task: Task, outcome: Any) -> list[Action]:
        worker = task.worker
        task.done_at = now = time.monotonic()
        if worker is not None:
            task.worker_pid = worker.pid
        if task.cost is not None and task.costs is not None and task.started_at is not None:
            task.costs.observe(task.cost, (now - task.started_at) / task.n)
            self.learned.add(task.costs)
        actions = self._close(task, outcome)
        if worker is not None and worker.kind == "spawn" and worker.state == "busy":
            worker.free(time.monotonic())
            worker.tasks_run += 1
            if self.shutdown and not self.queued():
                actions += self._give_back(worker, worker.since)
            else:
                self.idle.append(worker)
        return actions + self.pump()

    def task_lost(self, task: Task) -> list[Action]:
        self.in_flight.discard(task)
        task.back_to_queue()
        if task.requeues > MAX_REQUEUES:
            error = WorkerCrashedError(
                0, None, detail=f"{task.requeues} workers died before this task could start"
            )
            return self._close(task, error) + self.pump()
        log.debug("task %d never started (its worker died first): queued again", task.id)
        return self.enqueue(task)

    def task_failed(self, task: Task, error: BaseException) -> list[Action]:
        return self._close(task, error) + self.pump()

    def worker_ready(self, worker: WorkerHandle) -> list[Action]:
        if self.shutdown and not self.queued():
            self.workers.discard(worker)
            self.hub.put_pooled(worker, worker.since)
            return []
        self.idle.append(worker)
        return self.pump()

    def worker_gone(
        self, worker: WorkerHandle, *, expected: bool, recycled: bool = False
    ) -> list[Action]:
        """A worker ended; ``recycled``: it ran its ``max_tasks_per_child`` (replaced, as a
        crashed one is, but not counted as a restart)."""
        self.workers.discard(worker)
        if worker in self.idle:
            self.idle.remove(worker)
        actions: list[Action] = []
        if worker.kind == "spawn" and not expected:
            self.restarts += 0 if recycled else 1
            if not self.shutdown and self.broken is None:
                # Keep the pool at strength: a warm spare takes the dead worker's place at
                # once; without one, a replacement starts now, not when the next task comes.
                if self._adopt_pooled():
                    actions += self.spares_needed()
                else:
                    actions += [self._new_worker(), *self.spares_needed()]
        return actions + self.pump()

    def worker_failed_to_start(self, worker: WorkerHandle, error: BaseException) -> list[Action]:
        self.workers.discard(worker)
        if not isinstance(error, WorkerStartError):
            wrapped = WorkerStartError(f"a worker could not start: {error}")
            wrapped.__cause__ = error
            error = wrapped
        if self.broken is None:
            self.broken = error
        # Like the stdlib pools: the executor is broken; what waits for a worker fails.
        actions: list[Action] = []
        for queue in self.queues.values():
            for _, task in queue:
                if self.claim(task):
                    actions += self._close(task, _start_error(error))
                else:
                    task.close()
                    self.cancelled += 1
            queue.clear()
        for idle in self.idle:  # nothing will use them: back to the pool, still warm
            actions += self._give_back(idle, time.monotonic())
        self.idle.clear()
        self.changed.notify_all()
        return actions

    # -- settling (a settle-pool thread, no lock) --------------------------------------------

    def settle(self, task: Task, outcome: Any) -> None:
        """Decode ``outcome`` and set ``task``'s future; never raises."""
        try:
            ok, value = self._decode(task, outcome)
        except BaseException as exc:  # noqa: BLE001 - e.g. SystemExit from a result's __reduce__
            ok, value = False, self._error(_unpickle_error(exc, task))
        task.decoded_at = time.monotonic()
        with self.lock:
            # Recorded before the future is set, so whoever waited on it finds its record.
            task.settled_at = time.monotonic()
            self.timeline.append(_timeline(task, ok))
            if ok:
                self.completed += 1
            else:
                self.failed += 1
                if isinstance(value, TaskTimeoutError):
                    self.timed_out += 1
                elif isinstance(value, WorkerCrashedError):
                    self.crashed += 1
        try:
            if ok:
                task.future.set_result(value)
            else:
                task.future.set_exception(value)
        except BaseException:  # noqa: BLE001 - a done-callback's error is the stdlib's to log
            log.exception("setting a future raised")
        finally:
            with self.lock:
                self.unsettled -= 1
                if task.origin is not None:
                    task.origin.discard(task)
                save: list[CostModel] = []
                if self.learned and not self.busy():
                    save, self.learned = list(self.learned), set()
                    self.saving += 1
                self.changed.notify_all()
            if save:
                self._save(save)

    def _save(self, models: list[CostModel]) -> None:
        """The batch is over: keep what it taught for the next run (a settle thread, no lock).
        Counted as busy meanwhile, so ``shutdown(wait=True)`` returns with the files written."""
        try:
            for model in models:
                model.save()
        finally:
            with self.lock:
                self.saving -= 1
                self.changed.notify_all()

    def _decode(self, task: Task, outcome: Any) -> tuple[bool, Any]:
        if isinstance(outcome, BaseException):
            return False, self._error(outcome)
        done, pid = outcome
        assert isinstance(done, Done)
        results = [self._decode_one(ok, payload, task, pid) for ok, payload in done.outcomes]
        if task.chunked:
            return True, results
        ok, value = results[0]
        if ok and task.want_output:
            elapsed = time.monotonic() - (task.started_at or time.monotonic())
            value = TaskResult(value, done.output or "", pid, elapsed)
        return ok, value

    def _decode_one(self, ok: bool, payload: Any, task: Task, pid: int) -> tuple[bool, Any]:
        if not ok:
            return False, self._error(proxy_from_record(payload))
        try:
            return True, cloudpickle.loads(payload)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: it fails this task only
            error = _unpickle_error(exc, task)
            error.worker_pid = pid
            return False, self._error(error)

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, RemoteError):
            exc.classification = self._classify(exc)
        return exc

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

    # -- shutting down --------------------------------------------------------------------------

    def cancel_queued(self, *, also_requeued: bool) -> list[Action]:
        """Cancel queued tasks (lock held). Re-queued ones (their futures already RUNNING) stay
        queued unless ``also_requeued``: then they fail with ``CancelledError``."""
        actions: list[Action] = []
        for name, queue in self.queues.items():
            keep = []
            for entry in queue:
                task = entry[1]
                if task.future_running:
                    if also_requeued:
                        actions += self._close(task, CancelledError("cancelled before it started"))
                    else:
                        keep.append(entry)
                elif task.future.cancel():
                    self.claim(task)  # notified (its done-callback may have done it already)
                    task.close()
                    self.cancelled += 1
            heapq.heapify(keep)
            self.queues[name] = keep
        self.changed.notify_all()
        return actions

    def running_tasks(self) -> list[Task]:
        return [t for t in self.in_flight if t.state is TaskState.STARTED]

    def drain_at_exit(self) -> None:
        """Wait until every task of this executor is done (interpreter exit; no lock held)."""
        with self.lock:
            self.held = 0
            actions = self.pump()
        self.hub.run(actions)
        with self.lock:
            while self.busy():
                self.changed.wait(0.5)

    def abort(self, reason: str) -> None:
        """Fail everything still queued or in flight (the hub is closing; no lock held)."""
        with self.lock:
            self.shutdown = True
            actions = self.cancel_queued(also_requeued=True)
            for task in list(self.in_flight):
                actions += self._close(task, WorkerCrashedError(0, None, detail=reason))
        for action in actions:
            if isinstance(action, Settle):
                self.settle(action.task, action.outcome)

    def stop_idle(self) -> list[Action]:
        """Stop this executor's idle workers (lock held)."""
        actions: list[Action] = []
        for worker in self.idle:
            self.hub.forget(worker)
            self.workers.discard(worker)
            actions.append(StopWorker(worker, kill=False))
        self.idle.clear()
        return actions

    def stop_starting(self) -> list[Action]:
        """Stop this executor's workers still starting — a replacement launched just before
        ``terminate_workers()`` would otherwise say hello afterwards and go to the pool, keeping
        its template alive too (issue 24) (lock held)."""
        actions: list[Action] = []
        for worker in [w for w in self.workers if w.state == "starting"]:
            self.hub.forget(worker)
            self.workers.discard(worker)
            actions.append(StopWorker(worker, kill=True))
        return actions


def _timeline(task: Task, ok: bool) -> TaskTimeline:
    cost = task.cost
    return TaskTimeline(
        task_id=task.id,
        function=cost.function if cost is not None else "",
        features=cost.features if cost is not None else "",
        path=task.path,
        worker_pid=task.worker_pid,
        calls=task.n,
        predicted_s=task.predicted_s,
        ok=ok,
        queued=task.queued_at,
        sent=task.sent_at,
        started=task.started_at,
        done=task.done_at,
        decoded=task.decoded_at,
        settled=task.settled_at,
        future_ref=weakref.ref(task.future),
    )


def _start_error(error: BaseException) -> WorkerStartError:
    failed = WorkerStartError(f"no worker could start to run this task: {error}")
    failed.__cause__ = error
    return failed


def _unpickle_error(exc: BaseException, task: Task) -> ResultSerializationError:
    return ResultSerializationError(
        f"the task's result could not be unpickled in the parent: {type(exc).__name__}: {exc}. "
        "Return plain data, or make its class importable in the caller."
    )
