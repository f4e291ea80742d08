"""One executor's scheduling state: its queues, its tasks in flight, its workers.

Every method marked "lock held" runs under the hub's lock and returns the actions it decided
(:mod:`._state`); the caller runs them with :meth:`._hub.Hub.run` after releasing the lock.
The hub calls the :class:`._state.Owner` methods when a task starts, returns, is lost or fails,
and when a worker is ready, gone or failed to start.

Each task carries its predicted cost (:mod:`._costs`), fixed when it is submitted; the queues
order by :meth:`._state.Task.sort_key` (priority, then the longest predicted, then the oldest).
When a task's ``Done`` arrives, its in-worker duration (``Started`` to ``Done``) is recorded in
its cost model (the history file is written by the settle path, :mod:`._settle`).

A task is resolved in one place: :meth:`Core._close` moves it to DONE under the lock (only the
first caller wins) and emits a :class:`Settle` action; the settle path
(:class:`._settle.Settling`, the core's base) decodes the outcome and sets the future. Nothing
else sets a task's future. This executor's workers (adopting, starting, pooling, spares, device
balance) are :class:`._staff.Staffing`, the core's other base.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import os
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from concurrent.futures import CancelledError, Future
from typing import Any, Literal

from . import _scheduler
from ._costs import CostModel, shared_model
from ._errors import (
    AFTER_SHUTDOWN,
    Classification,
    WorkerCrashedError,
    WorkerStartError,
)
from ._hub import Hub
from ._settle import TIMELINE_LIMIT as TIMELINE_LIMIT
from ._settle import Settling, Timeline
from ._state import Action, Fork, Send, Settle, Task, TaskState, WorkerHandle

log = logging.getLogger("precompile_executor")


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


class Core(Settling):
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
            worker.free(now)
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


def _start_error(error: BaseException) -> WorkerStartError:
    failed = WorkerStartError(f"no worker could start to run this task: {error}")
    failed.__cause__ = error
    return failed
