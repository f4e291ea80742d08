"""One executor's scheduling state: its queues, its tasks in flight, its workers.

Every method marked "lock held" runs under the hub's lock and returns the actions it decided
(:mod:`._state`); the caller runs them with :meth:`._hub.Hub.run` after releasing the lock.
The hub calls the :class:`._state.Owner` methods when a task starts, returns, is lost or fails,
and when a worker is ready, gone or failed to start.

Each task carries its predicted cost (:mod:`._costs`), fixed when it is submitted; the queues
order by :meth:`._state.Task.sort_key` (priority, then the longest predicted, then the oldest).
When a task's ``Done`` arrives, its in-worker duration (``Started`` to ``Done``) is recorded in
its cost model; when the executor has nothing left to do, the settle that noticed writes the
model's history file (on a job thread when it settled on the monitor). Each settled task
leaves a :class:`TaskTimeline` (at most :data:`TIMELINE_LIMIT`, oldest dropped).

A task is resolved in one place: :meth:`Core._close` moves it to DONE under the lock (only the
first caller wins) and emits a :class:`Settle` action; :meth:`Core.settle`, on a settle-pool
thread, decodes the outcome and sets the future — or :meth:`Core.settle_now`, on the monitor,
when every call returned plain data and no user callback is attached (nothing it runs can block
the monitor). Nothing else sets a task's future.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import os
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import CancelledError, Future
from typing import Any, Literal

import cloudpickle

from . import _scheduler
from ._costs import CostModel, shared_model
from ._errors import (
    AFTER_SHUTDOWN,
    Classification,
    RemoteError,
    TaskMemoryError,
    WorkerCrashedError,
    WorkerStartError,
    proxy_from_record,
    unpickle_error,
)
from ._hub import Hub
from ._messages import Done
from ._records import ExecutorStatistics, TaskResult, TaskTimeline, count_outcome
from ._state import Action, Fork, Launch, Send, Settle, StopWorker, Task, TaskState, WorkerHandle

log = logging.getLogger("precompile_executor")


TIMELINE_LIMIT = 10_000
"""Timeline records an executor keeps (about 200 bytes each); older ones are dropped."""

MAX_REQUEUES = 3
"""A task whose worker died before it started runs elsewhere; after this many such deaths in a
row it fails (something kills every worker it reaches). A started task is never run again."""

DEFAULT_IDLE_TIMEOUT_S = 600.0
"""Idle workers stay warm this long: an autotuner benchmarks for minutes between compile
batches, and a restart costs an interpreter plus its imports (docs/design.md, "Process
lifecycle")."""

DEFAULT_START: Literal["template", "interpreter"] = "template"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one executor was built with, validated by the facade (``PrecompileExecutor``).

    Attributes:
        max_workers: most tasks in flight at once, both paths together.
        init_blob: cloudpickled ``(initializer, initargs)``, or ``None``; also the pool key.
        idle_timeout_s: seconds an idle worker stays; ``None``: until exit.
        classify: maps a task's exception to its classification.
        ignore_errors: classify every failure as ``"debug"``.
        devices: GPUs to pin spawn workers to (``CUDA_VISIBLE_DEVICES``), or ``None``.
        spare_workers: extra started workers kept idle in the hub's pool.
        start: ``"template"`` or ``"interpreter"``.
        cost_history: the JSON file of observed durations, or ``None`` (in memory only).
        max_tasks_per_child: a spawn worker leaves after this many tasks; ``None``: never.
    """

    max_workers: int
    init_blob: bytes | None = None
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S
    classify: Callable[[BaseException], Classification] | None = None
    ignore_errors: bool = False
    devices: tuple[str, ...] | None = None
    spare_workers: int = 0
    start: Literal["template", "interpreter"] = DEFAULT_START
    cost_history: str | os.PathLike[str] | None = None
    max_tasks_per_child: int | None = None


class Core:
    """Scheduling state of one executor (shared by its ``options()`` views)."""

    def __init__(self, hub: Hub, settings: Settings) -> None:
        self.hub = hub
        self.settings = settings
        self.start = settings.start
        self.max_tasks_per_child = settings.max_tasks_per_child
        self.memory_blocked = False  # the queue's head waits for memory (statistics)
        self.memory_killed = 0
        self.lock = hub.lock
        self.changed = hub.changed
        self.max_workers = settings.max_workers
        self.init_blob = settings.init_blob
        self.key = settings.init_blob or b""
        self.idle_timeout_s = settings.idle_timeout_s
        self.classify = settings.classify
        self.ignore_errors = settings.ignore_errors
        self.devices = settings.devices
        self.spare_workers = settings.spare_workers
        # Where this executor's durations are predicted from and recorded in (its views too).
        path = settings.cost_history
        self.costs = CostModel() if path is None else shared_model(path)
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
        self.timeline = Timeline()
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
        blocked = False  # the head that would start now waits for memory
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
            head = spawn if path == "spawn" else fork
            limit = head.memory_limit if head is not None else None
            if limit is not None and not self.hub.memory.admits(limit):
                blocked = True  # nothing passes it: priority order holds
                break
            _, task = heapq.heappop(self.queues[path])
            if not self.claim(task):
                task.close()
                self.cancelled += 1
                continue
            now = time.monotonic()
            self.in_flight.add(task)
            if task.memory_limit is not None:
                self.hub.memory.reserve(task, task.memory_limit)
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
        if blocked != self.memory_blocked:
            # While blocked, the memory watcher pumps this core every round: memory freed by
            # another executor or program lets the queue go on (_memory.py).
            log.debug(
                "queued tasks %s for memory (%d bytes reserved by running limited tasks)",
                "wait" if blocked else "no longer wait",
                self.hub.memory.reserved(),
            )
            self.memory_blocked = blocked
            self.hub.memory.wait_for_memory(self, blocked)
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
        costs nothing (lock held). See docs/design.md, "Ordering: the cost model"; the fault
        batch of ``benchmarks/s8_starts.py`` measures it."""
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
        if task.memory_limit is not None:
            self.hub.memory.release(task)
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
        if task.memory_limit is not None:
            self.hub.memory.release(task)
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
        """Decode ``outcome`` and set ``task``'s future; never raises (a settle thread)."""
        ok, value = self._decoded(task, outcome)
        self._recorded(task, ok, value)
        self._set_and_finish(task, ok, value)

    def settle_now(self, task: Task, outcome: Any) -> bool:
        """Settle ``task`` on this thread (the monitor's) when that imports nothing and runs no
        user code: every call returned plain data (``Done.plain``), no output was asked for,
        and the future has no done-callback but the executor's own. ``False``: nothing done,
        the caller hands it to a settle thread (docs/design.md, "Threads: who owns what")."""
        done = outcome[0] if isinstance(outcome, tuple) else None
        future = task.future
        if not (isinstance(done, Done) and done.plain) or task.want_output:
            return False
        if _user_callbacks(future):
            return False
        ok, value = self._decoded(task, outcome)
        self._recorded(task, ok, value)
        # Under the future's own lock (an RLock; set_result takes it again): a done-callback
        # added meanwhile waits for it, then sees the future done and runs on its adder's
        # thread. Only the executor's own callback (no lock, nothing slow) runs here.
        with future._condition:
            late = _user_callbacks(future)
            if not late:
                self._set(task, ok, value)
        if late:  # added between the two checks: its callback must not run on the monitor
            self.hub.submit_job(self._set_and_finish, task, ok, value)
            return True
        save = self._finished(task)
        if save:
            self.hub.submit_job(self._save, save)
        return True

    def _decoded(self, task: Task, outcome: Any) -> tuple[bool, Any]:
        try:
            ok, value = self._decode(task, outcome)
        except BaseException as exc:  # noqa: BLE001 - e.g. SystemExit from a result's __reduce__
            ok, value = False, self._error(unpickle_error(exc))
        task.decoded_at = time.monotonic()
        return ok, value

    def _recorded(self, task: Task, ok: bool, value: Any) -> None:
        with self.lock:
            # Recorded before the future is set, so whoever waited on it finds its record.
            task.settled_at = time.monotonic()
            self.timeline.add(task, ok)
            count_outcome(self, None if ok else value)
            if not ok and isinstance(value, TaskMemoryError):
                self.memory_killed += 1

    @staticmethod
    def _set(task: Task, ok: bool, value: Any) -> None:
        try:
            if ok:
                task.future.set_result(value)
            else:
                task.future.set_exception(value)
        except BaseException:  # noqa: BLE001 - a done-callback's error is the stdlib's to log
            log.exception("setting a future raised")

    def _set_and_finish(self, task: Task, ok: bool, value: Any) -> None:
        try:
            self._set(task, ok, value)
        finally:
            save = self._finished(task)
            if save:
                self._save(save)

    def _finished(self, task: Task) -> list[CostModel]:
        """The future is set: count it settled; the cost models to save if the executor has
        nothing left to do (lock taken here)."""
        with self.lock:
            self.unsettled -= 1
            if task.origin is not None:
                task.origin.discard(task)
            save: list[CostModel] = []
            if self.learned and not self.busy():
                # A model without a history file has nothing to write: no job for it.
                save = [model for model in self.learned if model.path is not None]
                self.learned = set()
                if save:
                    self.saving += 1
            self.changed.notify_all()
        return save

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
            error = unpickle_error(exc)
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

    # -- the facade's requests (no lock held; the _base.Backend protocol and more) ------------

    def _stop_taking(self) -> None:
        """Take no new tasks (lock held); an open ``batch()`` must not keep
        ``shutdown(wait=True)`` waiting, so the hold goes too."""
        self.shutdown = True
        self.held = 0

    def hold(self) -> None:
        """A ``batch()`` block begins: dispatch nothing until it ends."""
        with self.lock:
            self.held += 1

    def release(self) -> None:
        """A ``batch()`` block ends: dispatch what waits, best first."""
        with self.lock:
            self.held = max(0, self.held - 1)
            actions = self.pump()
        self.hub.run(actions)

    def begin_shutdown(self, *, cancel_futures: bool = False) -> None:
        """Take no new tasks; queued ones still run unless ``cancel_futures``."""
        with self.lock:
            self._stop_taking()
            actions = self.cancel_queued(also_requeued=False) if cancel_futures else []
            actions += self.pump()
        self.hub.run(actions)

    def join(self) -> None:
        """Block until nothing of this executor is queued, in flight, unsettled or starting."""
        with self.lock:
            while self.busy() or any(w.state == "starting" for w in self.workers):
                self.changed.wait(0.5)
            actions = self.pump()
        self.hub.run(actions)

    def interrupt(self) -> None:
        """Cancel queued tasks and kill running ones now (Ctrl-C)."""
        with self.lock:
            actions = self.cancel_queued(also_requeued=True)
        self.hub.run(actions)
        self._kill_until_idle(0.0, "killed because the caller was interrupted")

    def kill(self, futures: AbstractSet[Future[Any]]) -> list[Future[Any]]:
        """Kill the process groups running any of ``futures``; return the futures killed."""
        with self.lock:
            tasks = [t for t in self.in_flight if t.future in futures]
        self.hub.kill_tasks(tasks, "killed because the batch was interrupted", grace_s=0)
        return [t.future for t in tasks]

    def stop_workers(self, grace_s: float, reason: str) -> None:
        """Shut down, cancel every queued task, kill the running ones (SIGTERM, ``grace_s``,
        SIGKILL), then stop this executor's idle workers and the pooled ones of its kind."""
        with self.lock:
            self._stop_taking()
            actions = self.cancel_queued(also_requeued=True)
        self.hub.run(actions)
        self._kill_until_idle(grace_s, reason)
        with self.lock:
            actions = self.stop_idle() + self.stop_starting()
        self.hub.run(actions)
        for device in self.devices or [None]:
            self.hub.stop_idle(self.device_key(device))

    def _kill_until_idle(self, grace_s: float, reason: str, timeout_s: float = 30.0) -> None:
        """Kill what runs until nothing of this executor is in flight (a fork may be
        mid-``fork()`` on the first round)."""
        end = time.monotonic() + timeout_s
        while True:
            with self.lock:
                tasks = list(self.in_flight)
            self.hub.kill_tasks(tasks, reason, grace_s)
            with self.lock:
                if not self.in_flight and not self.unsettled:
                    return
                if time.monotonic() > end:
                    log.warning("tasks still in flight %gs after a kill", timeout_s)
                    return
                self.changed.wait(0.1)

    def warm_up(self, timeout: float | None) -> list[int]:
        """Start ``max_workers`` spawn workers; return their pids once all are ready."""
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            self.check_open()
            actions = self.warm_up_actions()
        self.hub.run(actions)
        with self.lock:
            while True:
                if self.broken is not None:
                    raise self.broken
                spawn = self._spawn_workers()
                if spawn and all(w.state in ("idle", "busy") for w in spawn):
                    return sorted(w.pid for w in spawn)
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"workers were not ready within {timeout}s")
                self.changed.wait(left)

    def statistics(self) -> ExecutorStatistics:
        """An immutable snapshot of the counters, the queue and the workers."""
        with self.lock:
            queued = [t for q in self.queues.values() for _, t in q]
            return ExecutorStatistics(
                queued=sum(1 for t in queued if t.future_running or not t.future.cancelled()),
                running=len(self.in_flight),
                completed=self.completed,
                failed=self.failed,
                cancelled=self.cancelled
                + sum(1 for t in queued if not t.future_running and t.future.cancelled()),
                timed_out=self.timed_out,
                crashed=self.crashed,
                workers_alive=sum(1 for w in self.workers if w.state != "dead"),
                worker_restarts=self.restarts,
                spawn_tasks=self.spawn_tasks,
                fork_tasks=self.fork_tasks,
                start=self.effective_start(),
                start_note=self.start_note(),
                memory_killed=self.memory_killed,
                waiting_for_memory=(
                    min(
                        sum(1 for t in queued if t.future_running or not t.future.cancelled()),
                        max(0, self.max_workers - len(self.in_flight)),
                    )
                    if self.memory_blocked
                    else 0
                ),
                memory_reserved=self.hub.memory.reserved(),
            )

    def timelines(self) -> tuple[TaskTimeline, ...]:
        """The settled tasks' timelines, oldest first."""
        with self.lock:
            return tuple(self.timeline)


class Timeline:
    """The :class:`TaskTimeline` records of an executor's settled tasks, the newest
    :data:`TIMELINE_LIMIT`: kept as plain tuples, one per settle, and made records only when
    read (``tuple(core.timeline)``, lock held) — a frozen dataclass per task costs more on the
    settle path than the rest of the record keeping."""

    def __init__(self) -> None:
        self._rows: deque[tuple[Any, ...]] = deque(maxlen=TIMELINE_LIMIT)

    def add(self, task: Task, ok: bool) -> None:
        self._rows.append(
            (
                task.id,
                task.cost,
                task.path,
                task.worker_pid,
                task.n,
                task.predicted_s,
                ok,
                task.queued_at,
                task.sent_at,
                task.started_at,
                task.done_at,
                task.decoded_at,
                task.settled_at,
                weakref.ref(task.future),
            )
        )

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[TaskTimeline]:
        for row in list(self._rows):
            (task_id, cost, path, pid, calls, predicted_s, ok, *times, future_ref) = row
            queued, sent, started, done, decoded, settled = times
            yield TaskTimeline(
                task_id=task_id,
                function=cost.function if cost is not None else "",
                features=cost.features if cost is not None else "",
                path=path,
                worker_pid=pid,
                calls=calls,
                predicted_s=predicted_s,
                ok=ok,
                queued=queued,
                sent=sent,
                started=started,
                done=done,
                decoded=decoded,
                settled=settled,
                future_ref=future_ref,
            )


OWN_DONE_CALLBACKS = 1
"""Done-callbacks the executor itself attaches to each future (the cancel notification of
``_executor._submit``; tests/test_contract.py checks the count): more means a user's."""


def _user_callbacks(future: Future[Any]) -> bool:
    # ``_done_callbacks`` is the stdlib Future's list (3.11-3.14); read, never changed here.
    return len(future._done_callbacks) > OWN_DONE_CALLBACKS  # type: ignore[attr-defined]


def _start_error(error: BaseException) -> WorkerStartError:
    failed = WorkerStartError(f"no worker could start to run this task: {error}")
    failed.__cause__ = error
    return failed
