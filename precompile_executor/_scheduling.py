"""Scheduling, one executor's side: its queues, what starts when, its workers, the one place a
task is resolved, and the settler that sets the task's future.

One :class:`Scheduler` per executor (shared by its ``options()`` views), built from one frozen
:class:`Settings`; it is the :class:`._base.Backend` the public layer drives and the
:class:`._processes.Owner` the hub reports to. Every method marked "lock held" runs under the
hub's lock and returns the actions it decided (:mod:`._processes`); the caller runs them with
:meth:`._processes.Hub.run` after releasing the lock. The rules it decides by are pure functions
of :mod:`._policy`. It holds two parts, each read and tested alone:

* :class:`WorkerManager` — this executor's workers (adopt, start, give back, spares, devices);
* :class:`Settler` — decodes a resolved task's outcome, classifies it, records its timeline row
  and sets its future (:meth:`Settler.settle` on a settle thread; :meth:`Settler.settle_now` on
  the monitor, when every call returned plain data and no callback but the library's own is
  attached: :func:`own_callback`).

A task's way through here: :meth:`Scheduler.enqueue_predicted` queues it (futures stay
PENDING: the honest queue); :meth:`Scheduler.pump` takes the best head while a slot is free and
emits ``Send`` (an idle worker) or ``Fork``; the hub reports its ``Done``
(:meth:`Scheduler.task_returned`), a death (:meth:`Scheduler.task_lost`,
:meth:`Scheduler.task_failed`) or a kill; :meth:`Scheduler._close` moves it to DONE under the
lock — only the first caller wins — and emits the one ``Settle`` action; the settler sets the
future. Nothing else sets a task's future. A reader follows a task from ``submit`` to its
result through six modules (docs/design.md, "Reading the code"), this one twice.

Each task carries its predicted cost (:mod:`._costs`), fixed when it is submitted; the queues
order by :meth:`._processes.Task.sort_key` (priority, then the longest predicted, then the
oldest).
When a task's ``Done`` arrives, its in-worker duration (``Started`` to ``Done``) is recorded in
its cost model; the settle that leaves the executor idle writes the history files.
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any, Literal

import cloudpickle

from . import _errors, _policy, _stdlib
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
from ._processes import (
    Action,
    Fork,
    KillOrder,
    Launch,
    Owner,
    Send,
    Settle,
    StopWorker,
    Task,
    TaskState,
    WorkerHandle,
)
from ._records import (
    TIMELINE_LIMIT,
    ExecutorStatistics,
    Settings,
    TaskResult,
    TaskTimeline,
    count_outcome,
)
from ._wire import Done

if TYPE_CHECKING:
    from ._processes import Hub


log = logging.getLogger("precompile_executor")

AHEAD_MAX_BYTES = 64 << 10
"""The most bytes of tasks sent ahead to one worker: they wait in its socket until the worker
reads them, and must fit in the socket's buffer (Linux's default: 208 KiB), or the write would
block this process's thread until the worker's current task ends."""

KILLED_DETAIL = "killed because the batch was interrupted"
"""What a task killed by :meth:`Scheduler.kill` (``kill_running_futures``) fails with."""

MAX_REQUEUES = 3
"""A task whose worker died before it started runs elsewhere; after this many such deaths in a
row it fails (something kills every worker it reaches). A started task is never run again."""


@_stdlib.own_callback
def _watch_cancel(scheduler_ref: weakref.ref[Scheduler], future: Future[Any]) -> None:
    """Every queued task's done-callback, one per executor (any thread): a future the user
    cancelled while its task was queued has its waiters notified at once, not when the queue
    reaches it. The executor is held weakly: a future must not keep it alive."""
    if not future.cancelled():
        return
    scheduler = scheduler_ref()
    if scheduler is None:
        return
    with scheduler.lock:
        task = scheduler.cancellable.get(future)
        if task is not None:
            scheduler.cancelled_by_user(task)


class Scheduler:
    """The scheduling state of one executor (see the module doc): its queues, its tasks in
    flight, its counters; its workers (:attr:`worker_manager`) and its settler (:attr:`settler`).

    Long because one executor's scheduling is one concept, decided under one lock: submitting,
    dispatching, the hub's reports, and the facade's requests all move the same queues and the
    same tasks; the parts that are not scheduling are its :class:`WorkerManager` and
    :class:`Settler`.
    """

    def __init__(self, hub: Hub, settings: Settings) -> None:
        self.hub = hub
        self.settings = settings
        self.lock = hub.lock
        self.changed = hub.changed
        self.max_workers = settings.max_workers
        # Where this executor's durations are predicted from and recorded in (its views too).
        path = settings.cost_history
        self.cost_model = CostModel() if path is None else shared_model(path)
        # Each path's heap holds sort keys (Task.sort_key: numbers only, so the collector stops
        # tracing them), the tasks themselves are in ``waiting`` under their ids (the key's last
        # field): an entry holding its task would be one more object traced per queued task
        # (docs/design.md, "Per-task overhead").
        self.queues: dict[str, list[tuple[float, float, int]]] = {"spawn": [], "fork": []}
        self.waiting: dict[int, Task] = {}  # every queued task, by id
        # Queued tasks whose futures the user may still cancel, by future: the executor's one
        # cancel watch finds the task here, so a queued task carries no callback object of its
        # own for the collector to trace (docs/design.md, "Per-task overhead").
        self.cancellable: dict[Future[Any], Task] = {}
        self.watch_cancel = functools.partial(_watch_cancel, weakref.ref(self))
        self.in_flight: set[Task] = set()  # SENT or STARTED: each holds one of max_workers
        self.ahead: set[Task] = set()  # SENT behind a worker's task (WorkerHandle.ahead)
        self.sent_ahead = 0  # tasks ever sent ahead (statistics)
        self.batch_holds = 0  # open batch() blocks: nothing is dispatched meanwhile
        self.predicted_max = 0.0  # the longest prediction of the tasks queued so far
        self.shutdown = False
        self.broken: BaseException | None = None
        self.cancelled = 0
        self.spawn_tasks = self.fork_tasks = 0
        self.memory_blocked = False  # the queue's head waits for memory (statistics)
        self.worker_manager = WorkerManager(hub, self, settings)
        self.settler = Settler(
            self.lock,
            self.changed,
            settings.classify,
            settings.ignore_errors,
            busy=self.busy,
            submit_job=hub.submit_job,
        )
        hub.schedulers.add(self)

    # -- submitting (lock held) -----------------------------------------------------------------

    def check_open(self) -> None:
        """Raise if no task may be submitted now. Decided under the lock; also read before it
        (an early refusal): each flag, once set, stays set."""
        if self.hub.exiting or self.hub.closed:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if self.broken is not None:
            raise self.broken
        if self.shutdown:
            raise RuntimeError(AFTER_SHUTDOWN)

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

    def enqueue(self, task: Task) -> list[Action]:
        if task.queued_at is None:
            task.queued_at = time.monotonic()
        key = task.sort_key()
        heapq.heappush(self.queues[task.path], key)
        self.waiting[key[2]] = task
        if not task.future_running:  # a re-queued task's future can no longer be cancelled
            self.cancellable[task.future] = task
        return self.pump()

    def count_unsendable(self) -> None:
        """A call that could not be pickled failed its future before it was queued (lock
        held)."""
        self.settler.failed += 1

    def queued(self) -> list[Task]:
        """Tasks waiting for a worker whose futures are not cancelled (lock held)."""
        return [t for t in self.waiting.values() if not t.future.cancelled()]

    def busy(self) -> bool:
        """Whether anything of this executor is queued, in flight, unsettled or being saved
        (lock held)."""
        settler = self.settler
        return bool(
            self.in_flight or self.ahead or settler.unsettled or settler.saving or self.queued()
        )

    # -- dispatch (lock held) -------------------------------------------------------------------

    def pump(self) -> list[Action]:
        """Dispatch what may start now; start workers the queue needs."""
        actions: list[Action] = []
        if self.batch_holds:
            return actions
        manager = self.worker_manager
        blocked = False  # the head that would start now waits for memory
        while _policy.free_slots(self.max_workers, len(self.in_flight)):
            spawn, fork = self._head("spawn"), self._head("fork")
            if spawn is not None and not manager.idle:
                manager.adopt_pooled()
            path = _policy.next_path(
                spawn.sort_key() if spawn else None,
                fork.sort_key() if fork else None,
                bool(manager.idle),
            )
            if path is None:
                break
            head = spawn if path == "spawn" else fork
            limit = head.memory_limit if head is not None else None
            if limit is not None and not self.hub.memory.admits(limit):
                blocked = True  # nothing passes it: priority order holds
                break
            task = self._pop_claimed(path)
            if task is None:
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
                worker = self.worker_manager.take_idle()
                worker.take(task, now)
                task.send_to(worker, now)
                self.spawn_tasks += 1
                actions.append(Send(worker, task))
        if not blocked:
            actions += self._send_ahead()
        if blocked != self.memory_blocked:
            # While blocked, the memory watcher pumps this scheduler every round: memory freed
            # by another executor or program lets the queue go on (_memory.py).
            log.debug(
                "queued tasks %s for memory (%d bytes reserved by running limited tasks)",
                "wait" if blocked else "no longer wait",
                self.hub.memory.reserved(),
            )
            self.memory_blocked = blocked
            self.hub.memory.wait_for_memory(self, blocked)
        actions += self._start_workers()
        if self.shutdown and not self.queued():
            actions += manager.release_idle()
        self.changed.notify_all()
        return actions

    def _send_ahead(self) -> list[Action]:
        """With no spawn worker idle, write queued spawn tasks to busy workers whose tasks are
        predicted to end soon, behind their tasks (docs/design.md, "Sending ahead")."""
        manager = self.worker_manager
        if manager.idle or manager.devices or manager.max_tasks_per_child is not None:
            # Devices: the task goes where the balance says, when a worker there is free.
            # max_tasks_per_child: a worker may leave after its task, before reading the next.
            return []
        head = self._head("spawn")
        if head is None:
            return []
        busy = [
            w
            for w in manager.workers
            if w.kind == "spawn"
            and w.state == "busy"
            and len(w.ahead) < _policy.AHEAD_MAX_TASKS
            and w.conn is not None
            and (t := w.task) is not None
            and t.kill_order is None
            and t.memory_limit is None
        ]
        if not busy:
            return []
        now = time.monotonic()
        whole: list[float] = []
        left: list[float] = []
        ahead_s: list[float] = []
        ahead_n: list[int] = []
        ahead_bytes: list[int] = []
        for w in busy:
            t = w.task
            assert t is not None
            p = _predicted_now(t)
            whole.append(p)
            left.append(p - (now - (t.started_at or t.sent_at or now)))
            queued = [a.ahead_s for a in w.ahead]  # as predicted when each went ahead
            ahead_s.append(sum(queued) if all(queued) else float("inf"))
            ahead_n.append(len(queued))
            ahead_bytes.append(sum(len(a.blob or b"") for a in w.ahead))
        actions: list[Action] = []
        while head is not None:
            size = len(head.blob or b"")
            if head.memory_limit is not None or size > AHEAD_MAX_BYTES:
                break  # admitted for memory when it starts; too big to wait in a socket
            head_s = _predicted_now(head)
            index = _policy.ahead_of(whole, left, ahead_s, ahead_n, head_s)
            if index is not None and ahead_bytes[index] + size > AHEAD_MAX_BYTES:
                index = None  # the tasks waiting in its socket must fit in its buffer
            if index is None:
                break
            task = self._pop_claimed("spawn")
            if task is not None:
                worker = busy[index]
                task.send_to(worker, now)
                task.ahead_s = head_s
                worker.ahead.append(task)
                self.ahead.add(task)
                self.sent_ahead += 1
                self.spawn_tasks += 1
                ahead_s[index] += head_s if head_s > 0 else float("inf")
                ahead_n[index] += 1
                ahead_bytes[index] += size
                actions.append(Send(worker, task))
            head = self._head("spawn")
        return actions

    def _pop_claimed(self, path: str) -> Task | None:
        """Take ``path``'s head off its queue and claim it; ``None`` if the user cancelled it
        meanwhile (then it is dropped and counted)."""
        task = self.waiting.pop(heapq.heappop(self.queues[path])[2])
        if self.claim(task):
            task.lone = not self.waiting  # Run.lone
            return task
        task.close()
        self.cancelled += 1
        return None

    def _head(self, path: str) -> Task | None:
        queue = self.queues[path]
        while queue:
            task = self.waiting[queue[0][2]]
            if task.future_running or not task.future.cancelled():
                return task
            del self.waiting[heapq.heappop(queue)[2]]
            self.claim(task)  # False: cancelled (notified now if it was not yet)
            task.close()
            self.cancelled += 1
        return None

    def _start_workers(self) -> list[Action]:
        # Also after shutdown(): queued tasks still run (and a re-queued one needs a worker).
        if self.broken is not None:
            return []
        if not self.queues["spawn"] or len(self.in_flight) >= self.max_workers:
            return []  # nothing waits, or no slot free: workers_to_start would say 0
        waiting = self._waiting_spawn(limit=self.max_workers)
        if not waiting:
            return []
        return self.worker_manager.starts_for(
            waiting, len(self.in_flight), spares=not self.shutdown
        )

    def _waiting_spawn(self, limit: int) -> int:
        """Queued spawn tasks not cancelled, counted up to ``limit`` (no decision needs more):
        the pump runs after every task, so it must not walk a queue of thousands."""
        n = 0
        for key in self.queues["spawn"]:
            task = self.waiting[key[2]]
            if task.future_running or not task.future.cancelled():
                n += 1
                if n >= limit:
                    break
        return n

    def claim(self, task: Task) -> bool:
        """Call the future's ``set_running_or_notify_cancel()``, once per task whoever asks:
        True, RUNNING (it may start); False, the user cancelled it, and its waiters are
        notified, so ``wait()`` and ``as_completed()`` see it (lock held)."""
        self.cancellable.pop(task.future, None)  # claimed either way: nothing left to watch
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

    # -- the hub's reports (lock held; the _processes.Owner protocol) -----------------------------

    def _close(self, task: Task, outcome: Any) -> list[Action]:
        """The one place a task is resolved: DONE now, its future set by the settler."""
        self.in_flight.discard(task)
        self.ahead.discard(task)
        if task.memory_limit is not None:
            self.hub.memory.release(task)
        if not task.close():
            return []
        self.settler.unsettled += 1
        return [Settle(self.settler, task, outcome)]

    def task_returned(self, task: Task, outcome: Any, *, pump: bool = True) -> list[Action]:
        """``task``'s ``Done`` arrived: resolve it; its worker takes the next task. Not
        ``pump``: the hub pumps once it has read every ``Done`` that came with this one."""
        worker = task.worker
        task.done_at = now = time.monotonic()
        if worker is not None:
            task.worker_pid = worker.pid
        if (
            task.cost_key is not None
            and task.cost_model is not None
            and task.started_at is not None
        ):
            task.cost_model.observe(task.cost_key, (now - task.started_at) / task.n)
            self.settler.learned.add(task.cost_model)
        actions = self._close(task, outcome)
        if worker is not None and worker.kind == "spawn" and worker.state == "busy":
            worker.tasks_run += 1
            if worker.ahead:
                # Already in its socket: the worker has started it, or is about to.
                following = worker.ahead.popleft()
                worker.task = following
                self.ahead.discard(following)
                self.in_flight.add(following)
                return actions + self.pump() if pump else actions
            worker.free(now)
            if self.shutdown and not self.queued():
                actions += self.worker_manager.give_back(worker, worker.since)
            else:
                self.worker_manager.idle_again(worker)
        return actions + self.pump() if pump else actions

    def task_lost(self, task: Task, *, counted: bool = True) -> list[Action]:
        """``task``'s worker died before the task started: it never ran, so it runs elsewhere.
        Not ``counted`` towards ``MAX_REQUEUES``: it was sent ahead, and the task before it
        ended the worker."""
        self.in_flight.discard(task)
        self.ahead.discard(task)
        if task.memory_limit is not None:
            self.hub.memory.release(task)
        task.back_to_queue(counted=counted)
        if task.requeues > MAX_REQUEUES:
            error = WorkerCrashedError(
                0, None, detail=f"{task.requeues} workers died before this task could start"
            )
            return self._close(task, error) + self.pump()
        log.debug("task %d never started (its worker died first): queued again", task.id)
        return self.enqueue(task)

    def task_failed(self, task: Task, error: BaseException) -> list[Action]:
        """``task`` failed with ``error`` (a crash, a timeout, a kill, a failed fork)."""
        return self._close(task, error) + self.pump()

    def worker_ready(self, worker: WorkerHandle) -> list[Action]:
        """One of this executor's workers said hello."""
        if self.shutdown and not self.queued():
            self.worker_manager.pool(worker)
            return []
        self.worker_manager.idle_again(worker)
        return self.pump()

    def worker_gone(
        self, worker: WorkerHandle, *, expected: bool, recycled: bool = False
    ) -> list[Action]:
        """A worker ended; ``recycled``: it ran its ``max_tasks_per_child`` (replaced, as a
        crashed one is, but not counted as a restart)."""
        manager = self.worker_manager
        manager.forget(worker)
        actions: list[Action] = []
        if worker.kind == "spawn" and not expected:
            if not self.shutdown and self.broken is None:
                actions += manager.replace(worker, recycled=recycled)
            else:
                manager.restarts += 0 if recycled else 1
        return actions + self.pump()

    def worker_failed_to_start(self, worker: WorkerHandle, error: BaseException) -> list[Action]:
        """A worker could not start: like the stdlib pools, the executor is broken."""
        self.worker_manager.forget(worker)
        if not isinstance(error, WorkerStartError):
            wrapped = WorkerStartError(f"a worker could not start: {error}")
            wrapped.__cause__ = error
            error = wrapped
        if self.broken is None:
            self.broken = error
        # What waits for a worker fails.
        actions: list[Action] = []
        for queue in self.queues.values():
            for key in queue:
                task = self.waiting.pop(key[2])
                if self.claim(task):
                    actions += self._close(task, _start_error(error))
                else:
                    task.close()
                    self.cancelled += 1
            queue.clear()
        actions += (
            self.worker_manager.release_idle()
        )  # nothing will use them: to the pool, still warm
        self.changed.notify_all()
        return actions

    # -- shutting down --------------------------------------------------------------------------

    def cancel_queued(self, *, also_requeued: bool) -> list[Action]:
        """Cancel queued tasks (lock held). Re-queued ones (their futures already RUNNING) stay
        queued unless ``also_requeued``: then they fail with ``CancelledError``."""
        actions: list[Action] = []
        for name, queue in self.queues.items():
            keep = []
            for key in queue:
                task = self.waiting[key[2]]
                if task.future_running and not also_requeued:
                    keep.append(key)
                    continue
                del self.waiting[key[2]]
                if task.future_running:
                    actions += self._close(task, CancelledError("cancelled before it started"))
                elif task.future.cancel():
                    self.claim(task)  # notified (its done-callback may have done it already)
                    task.close()
                    self.cancelled += 1
            heapq.heapify(keep)
            self.queues[name] = keep
        self.changed.notify_all()
        return actions

    def drain_at_exit(self) -> None:
        """Wait until every task of this executor is done (interpreter exit; no lock held)."""
        with self.lock:
            self.batch_holds = 0
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
            for task in [*self.in_flight, *self.ahead]:
                actions += self._close(task, WorkerCrashedError(0, None, detail=reason))
        for action in actions:
            if isinstance(action, Settle):
                self.settler.settle(action.task, action.outcome)

    # -- the facade's requests (no lock held; the _base.Backend protocol and more) ------------

    def _stop_taking(self) -> None:
        """Take no new tasks (lock held); an open ``batch()`` must not keep
        ``shutdown(wait=True)`` waiting, so the hold goes too; a ``warm_up()`` waiting for
        workers stops waiting."""
        self.shutdown = True
        self.batch_holds = 0
        self.changed.notify_all()

    def hold(self) -> None:
        """A ``batch()`` block begins: dispatch nothing until it ends."""
        with self.lock:
            self.batch_holds += 1

    def release(self) -> None:
        """A ``batch()`` block ends: dispatch what waits, best first."""
        with self.lock:
            self.batch_holds = max(0, self.batch_holds - 1)
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
            while self.busy() or any(w.state == "starting" for w in self.worker_manager.workers):
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
        """Kill the process groups running any of ``futures``; return the futures killed.

        A task sent ahead dies with its worker when the worker's task is killed too. Alone, it
        is only marked: its worker's task ends as it would, and the hub kills the one ahead as
        soon as the worker starts it (``Hub._started``); its future is not among those returned
        (it fails once that task is done, which may be long after)."""
        with self.lock:
            tasks = [t for t in self.in_flight if t.future in futures]
            now = time.monotonic()
            for task in self.ahead:
                if task.future not in futures or task.worker is None:
                    continue
                running = task.worker.task
                if running is None or running.future in futures:
                    tasks.append(task)
                elif task.kill_order is None:
                    task.kill_order = KillOrder("killed", now, KILLED_DETAIL)
        self.hub.kill_tasks(tasks, KILLED_DETAIL, grace_s=0)
        return [t.future for t in tasks]

    def warm_up(self, timeout: float | None) -> list[int]:
        """Start ``max_workers`` spawn workers; return their pids once all are ready."""
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            self.check_open()
            actions = self.worker_manager.warm_up_actions()
        self.hub.run(actions)
        with self.lock:
            while True:
                if self.broken is not None:
                    raise self.broken
                if self.shutdown:  # no task can use them now; stop_workers stops them too
                    raise RuntimeError(AFTER_SHUTDOWN)
                if self.worker_manager.ready():
                    return sorted(w.pid for w in self.worker_manager.spawn_workers())
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"workers were not ready within {timeout}s")
                self.changed.wait(left)

    def stop_workers(self, grace_s: float, reason: str) -> None:
        """Shut down, cancel every queued task, kill the running ones (SIGTERM, ``grace_s``,
        SIGKILL), then stop this executor's idle workers and the pooled ones of its kind."""
        with self.lock:
            self._stop_taking()
            actions = self.cancel_queued(also_requeued=True)
        self.hub.run(actions)
        self._kill_until_idle(grace_s, reason)
        with self.lock:
            actions = self.worker_manager.stop_idle() + self.worker_manager.stop_starting()
        self.hub.run(actions)
        for key in self.worker_manager.pool_keys():
            self.hub.stop_idle(key)

    def _kill_until_idle(self, grace_s: float, reason: str, timeout_s: float = 30.0) -> None:
        """Kill what runs until nothing of this executor is in flight (a fork may be
        mid-``fork()`` on the first round)."""
        end = time.monotonic() + timeout_s
        while True:
            with self.lock:
                tasks = [*self.in_flight, *self.ahead]
            self.hub.kill_tasks(tasks, reason, grace_s)
            with self.lock:
                if not self.in_flight and not self.ahead and not self.settler.unsettled:
                    return
                if time.monotonic() > end:
                    log.warning("tasks still in flight %gs after a kill", timeout_s)
                    return
                self.changed.wait(0.1)

    def statistics(self) -> ExecutorStatistics:
        """An immutable snapshot of the counters, the queue and the workers."""
        with self.lock:
            queued = list(self.waiting.values())
            waiting = sum(1 for t in queued if t.future_running or not t.future.cancelled())
            settler = self.settler
            return ExecutorStatistics(
                queued=waiting + len(self.ahead),  # those ahead: in a socket, behind a task
                running=len(self.in_flight),
                completed=settler.completed,
                failed=settler.failed,
                cancelled=self.cancelled
                + sum(1 for t in queued if not t.future_running and t.future.cancelled()),
                timed_out=settler.timed_out,
                crashed=settler.crashed,
                workers_alive=sum(1 for w in self.worker_manager.workers if w.state != "dead"),
                worker_restarts=self.worker_manager.restarts,
                spawn_tasks=self.spawn_tasks,
                fork_tasks=self.fork_tasks,
                start=self.worker_manager.effective_start(),
                start_note=self.worker_manager.start_note(),
                memory_killed=settler.memory_killed,
                waiting_for_memory=(
                    min(waiting, max(0, self.max_workers - len(self.in_flight)))
                    if self.memory_blocked
                    else 0
                ),
                memory_reserved=self.hub.memory.reserved(),
                sent_ahead=self.sent_ahead,
            )

    def timelines(self) -> tuple[TaskTimeline, ...]:
        """The settled tasks' timelines, oldest first."""
        with self.lock:
            return tuple(self.settler.timeline)


class Timeline:
    """The :class:`TaskTimeline` records of an executor's settled tasks, the newest
    :data:`._records.TIMELINE_LIMIT`: kept as plain tuples, one per settle, and made records
    only when read (``tuple(settler.timeline)``, lock held) — a frozen dataclass per task costs
    more on the settle path than the rest of the record keeping."""

    def __init__(self) -> None:
        self._rows: deque[tuple[Any, ...]] = deque(maxlen=TIMELINE_LIMIT)

    def add(self, task: Task, ok: bool) -> None:
        self._rows.append(
            (
                task.id,
                task.cost_key,
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


class Settler:
    """Sets resolved tasks' futures (no lock held on entry; see the module doc) and counts and
    records their outcomes (under the hub's ``lock``).

    Args:
        lock: the hub's lock.
        changed: the hub's condition, notified when a task is settled.
        classify: the executor's ``classify`` hook.
        ignore_errors: classify every failure as ``"debug"``.
        busy: whether the executor has anything left to do (lock held).
        submit_job: runs a function on the hub's job pool.
    """

    def __init__(
        self,
        lock: threading.RLock,
        changed: threading.Condition,
        classify: Callable[[BaseException], Classification] | None,
        ignore_errors: bool,
        *,
        busy: Callable[[], bool],
        submit_job: Callable[..., None],
    ) -> None:
        self.lock = lock
        self.changed = changed
        self.classify = classify
        self.ignore_errors = ignore_errors
        self._busy = busy
        self._submit_job = submit_job
        self.unsettled = 0  # resolved, future not yet set
        self.timeline = Timeline()
        self.learned: set[CostModel] = set()  # cost models with observations not yet saved
        self.saving = 0  # settle threads writing cost histories
        self.completed = self.failed = self.timed_out = self.crashed = 0
        self.memory_killed = 0

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
        if _stdlib.user_callbacks(future):
            return False
        ok, value = self._decoded(task, outcome)
        self._recorded(task, ok, value)
        # Under the future's own lock (an RLock; set_result takes it again): a done-callback
        # added meanwhile waits for it, then sees the future done and runs on its adder's
        # thread. Only the executor's own callback (no lock, nothing slow) runs here.
        with _stdlib.future_condition(future):
            late = _stdlib.user_callbacks(future)
            waited = not late and _stdlib.has_waiters(future)
            if not late:
                self._set(task, ok, value)
        if late:  # added between the two checks: its callback must not run on the monitor
            self._submit_job(self._set_and_finish, task, ok, value)
            return True
        if waited:
            # The thread just woken needs the interpreter lock, which this thread would keep
            # through its bookkeeping to the next poll: give it up now (docs/design.md, "The
            # monitor thread").
            time.sleep(0)
        save = self._finished(task)
        if save:
            self._submit_job(self._save, save)
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
            save: list[CostModel] = []
            if self.learned and not self._busy():
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
        return _errors.classification(exc, self.classify, self.ignore_errors)


def _predicted_now(task: Task) -> float:
    """``task``'s whole predicted duration from what its cost model knows now (0: nothing): a
    batch queued before its first task returned learns its length from that task."""
    if task.cost_key is None or task.cost_model is None:
        return 0.0
    return task.cost_model.estimate(task.cost_key) * task.n


def _start_error(error: BaseException) -> WorkerStartError:
    failed = WorkerStartError(f"no worker could start to run this task: {error}")
    failed.__cause__ = error
    return failed


# ----------------------------------------------------------------------------------------------
# One executor's workers: adopting warm ones from the hub's pool, starting new ones, giving idle
# ones back, warm spares, balance across devices, stopping idle or starting ones.
#
# A :class:`WorkerManager` belongs to one :class:`Scheduler`, which asks it for
# workers and tells it when one is ready or gone. Every method runs with the hub's lock held and
# returns the actions it decided (:mod:`._processes`), which the caller runs after releasing the
# lock. The process-wide registry it takes workers from and gives them back to is the hub's
# :class:`._processes.WorkerRoster`.


class WorkerManager:
    """The workers one executor holds (hub lock held throughout; see the comment above).

    Args:
        hub: the process's hub (its roster holds every worker).
        owner: the scheduler these workers report to.
        settings: the executor's settings.
    """

    def __init__(self, hub: Hub, owner: Owner, settings: Settings) -> None:
        self._hub = hub
        self._roster = hub.roster
        self._owner = owner
        self.max_workers = settings.max_workers
        self.key = settings.init_blob or b""  # the worker kind: the pickled initializer
        self.init_blob = settings.init_blob
        self.idle_timeout_s = settings.idle_timeout_s
        self.devices = settings.devices
        self.spare_workers = settings.spare_workers
        self.start: Literal["template", "interpreter"] = settings.start
        self.max_tasks_per_child = settings.max_tasks_per_child
        self.workers: set[WorkerHandle] = set()  # this executor's live workers (both paths)
        self.idle: list[WorkerHandle] = []  # its idle spawn workers, warmest last
        self.restarts = 0  # workers replaced after a crash or a kill (statistics)

    # -- the scheduler's questions --------------------------------------------------------------

    def spawn_workers(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.kind == "spawn"]

    def take_idle(self) -> WorkerHandle:
        """Take the idle worker for the next spawn task, in one step (lock held): the warmest
        (LIFO), or with devices pinned, one on the device with the fewest busy workers."""
        idle = self.idle
        if not self.devices:
            return idle.pop()
        return idle.pop(_policy.pick_idle([w.device for w in idle], self.busy_by_device()))

    def idle_again(self, worker: WorkerHandle) -> None:
        """``worker`` (ready, or done with its task) waits for this executor's next task."""
        self.idle.append(worker)

    def forget(self, worker: WorkerHandle) -> None:
        """``worker`` ended or failed to start: no longer this executor's (lock held)."""
        self.workers.discard(worker)
        if worker in self.idle:
            self.idle.remove(worker)

    def pool(self, worker: WorkerHandle) -> None:
        """Give a worker that became ready after shutdown to the hub's pool (lock held)."""
        self.workers.discard(worker)
        self._roster.put_pooled(worker, worker.since)

    def busy_by_device(self) -> Counter[str | None]:
        """Busy workers per device (for :func:`._policy.pick_idle`)."""
        return Counter(w.device for w in self.workers if w.state == "busy")

    def start_note(self) -> str | None:
        """Why this executor's workers fell back from a template to interpreters."""
        if self.start != "template":
            return None
        return self._hub.template_refused(self.key)

    def effective_start(self) -> str:
        """How this executor's workers start now."""
        if self.start == "template" and self.start_note() is None:
            return "template"
        return "interpreter"

    def device_key(self, device: str | None) -> bytes:
        """The pool key of this executor's workers pinned to ``device``: workers are shared
        only by executors with the same initializer, device and ``max_tasks_per_child`` (a
        worker counts its tasks from its start and leaves after that many)."""
        key = self.key
        if self.max_tasks_per_child is not None:
            key += b"|max_tasks=%d" % self.max_tasks_per_child
        return key if device is None else key + b"|device=" + device.encode()

    # -- adopting, starting and giving back -----------------------------------------------------

    def adopt(self, worker: WorkerHandle) -> None:
        """Make ``worker`` (ready, idle) one of this executor's."""
        worker.owner = self._owner
        worker.idle_timeout_s = self.idle_timeout_s
        self.workers.add(worker)

    def adopt_pooled(self) -> bool:
        """Take a warm idle worker from the hub's pool, keeping devices balanced."""
        for device in self._devices_least_used_first():
            worker = self._roster.take_pooled(self.device_key(device))
            if worker is not None:
                self.adopt(worker)
                self.idle.append(worker)
                return True
        return False

    def give_back(self, worker: WorkerHandle, now: float) -> list[Action]:
        """An idle worker leaves this executor: to the hub's pool, still warm — unless it ran
        tasks under ``max_tasks_per_child``: then it stops, so the next executor counts its
        limit from a fresh process, as the stdlib's pool (one pool, its own processes) does."""
        self.workers.discard(worker)
        if worker.max_tasks is not None and worker.tasks_run:
            self._roster.forget(worker)
            return [StopWorker(worker, kill=False)]
        self._roster.put_pooled(worker, now)
        return []

    def release_idle(self) -> list[Action]:
        """Give every idle worker back."""
        now = time.monotonic()
        actions: list[Action] = []
        for worker in self.idle:
            actions += self.give_back(worker, now)
        self.idle.clear()
        return actions

    def new_worker(self, *, owned: bool = True) -> Launch:
        """Register a new spawn worker (a spare when not ``owned``) on the least used device."""
        device = self._devices_least_used_first()[0]
        worker = self._roster.new_worker(
            self.device_key(device),
            self._owner if owned else None,
            self.idle_timeout_s,
            device,
            start=self.start,
            template_key=self.key,
            max_tasks=self.max_tasks_per_child,
        )
        if owned:
            self.workers.add(worker)
        return Launch(worker, self.init_blob)

    def starts_for(self, waiting: int, in_flight: int, *, spares: bool) -> list[Action]:
        """Starts for ``waiting`` queued spawn tasks (``in_flight``: the executor's tasks in
        flight), and with ``spares`` (not after shutdown) the spares to go with them."""
        spawn = self.spawn_workers()
        n = _policy.workers_to_start(
            waiting=waiting,
            idle=len(self.idle),
            starting=sum(1 for w in spawn if w.state == "starting"),
            spawn_workers=len(spawn),
            in_flight=in_flight,
            max_workers=self.max_workers,
        )
        starts: list[Action] = [self.new_worker() for _ in range(n)]
        return starts + self.spares_needed() if starts and spares else starts

    def replace(self, worker: WorkerHandle, *, recycled: bool) -> list[Action]:
        """Keep the pool at strength after ``worker`` died unexpectedly: a warm spare takes its
        place at once; without one, a replacement starts now, not when the next task comes.
        ``recycled``: it ran its ``max_tasks_per_child`` (not counted as a restart)."""
        self.restarts += 0 if recycled else 1
        if self.adopt_pooled():
            return self.spares_needed()
        return [self.new_worker(), *self.spares_needed()]

    def spares_needed(self) -> list[Action]:
        """Starts that bring the pool's warm spares for this executor up to ``spare_workers``."""
        if not self.spare_workers:
            return []
        keys = {self.device_key(d) for d in (self.devices or [None])}
        have = sum(
            1
            for w in self._roster.workers
            if w.owner is None and w.state in ("idle", "starting") and w.key in keys
        )
        return [self.new_worker(owned=False) for _ in range(self.spare_workers - have)]

    def warm_up_actions(self) -> list[Action]:
        """Bring this executor to ``max_workers`` spawn workers."""
        actions: list[Action] = []
        while len(self.spawn_workers()) < self.max_workers:
            if not self.adopt_pooled():
                actions.append(self.new_worker())
        return actions + self.spares_needed()

    def ready(self) -> bool:
        """Whether every spawn worker (at least one) has started."""
        spawn = self.spawn_workers()
        return bool(spawn) and all(w.state in ("idle", "busy") for w in spawn)

    # -- stopping ---------------------------------------------------------------------------------

    def stop_idle(self) -> list[Action]:
        """Stop this executor's idle workers."""
        actions: list[Action] = []
        for worker in self.idle:
            self._roster.forget(worker)
            self.workers.discard(worker)
            actions.append(StopWorker(worker, kill=False))
        self.idle.clear()
        return actions

    def stop_starting(self) -> list[Action]:
        """Stop this executor's workers still starting — a replacement launched just before
        ``terminate_workers()`` would otherwise say hello afterwards and go to the pool, keeping
        its template alive too
        (``tests/test_limits.py::test_terminate_workers_leaves_no_process_and_only_the_monitor``)."""
        actions: list[Action] = []
        for worker in [w for w in self.workers if w.state == "starting"]:
            self._roster.forget(worker)
            self.workers.discard(worker)
            actions.append(StopWorker(worker, kill=True))
        return actions

    def pool_keys(self) -> list[bytes]:
        """The pool keys of this executor's kind, one per device."""
        return [self.device_key(device) for device in self.devices or [None]]

    def _devices_least_used_first(self) -> list[str | None]:
        if not self.devices:
            return [None]
        load = Counter(w.device for w in self.spawn_workers())
        return sorted(self.devices, key=lambda d: load[d])  # stable: ties keep list order
