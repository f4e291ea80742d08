"""Staffing: the workers of one executor — adopting warm ones from the hub's pool, starting new
ones, giving idle ones back, warm spares, balance across devices, stopping idle or starting ones.

:class:`Staffing` is the worker half of :class:`._core.Core`: its attributes are the core's, set
by ``Core.__init__``; every method runs with the hub's lock held and returns the actions it
decided (:mod:`._state`), which the caller runs after releasing the lock.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Literal, cast

from . import _scheduler
from ._state import Action, Launch, Owner, StopWorker, Task, WorkerHandle

if TYPE_CHECKING:
    from ._hub import Hub


class Staffing:
    """This executor's workers (lock held throughout; see the module doc)."""

    # Set by ``Core.__init__``; guarded by the hub's lock.
    hub: Hub
    max_workers: int
    key: bytes
    init_blob: bytes | None
    idle_timeout_s: float | None
    devices: tuple[str, ...] | None
    spare_workers: int
    start: Literal["template", "interpreter"]
    max_tasks_per_child: int | None
    queues: dict[str, list[tuple[tuple[float, float, int], Task]]]
    in_flight: set[Task]
    workers: set[WorkerHandle]  # this executor's live workers (both paths)
    idle: list[WorkerHandle]  # its idle spawn workers, warmest last
    shutdown: bool
    broken: BaseException | None
    lock: threading.RLock
    changed: threading.Condition
    restarts: int

    def owner(self) -> Owner:
        """This core as the :class:`._state.Owner` its workers report to."""
        return cast("Owner", self)  # Core, which implements the protocol, is the only subclass

    def check_open(self) -> None:
        raise NotImplementedError  # Core's: raise if no task may be submitted now

    def pump(self) -> list[Action]:
        raise NotImplementedError  # Core's: dispatch what may start now

    def queued(self) -> list[Task]:
        raise NotImplementedError  # Core's: tasks waiting for a worker, not cancelled

    # -- the hub's reports about this executor's workers ----------------------------------------

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

    # -- choosing, adopting and starting workers ------------------------------------------------

    def _take_idle(self) -> WorkerHandle:
        if not self.devices:
            return self.idle.pop()  # the warmest
        busy = Counter(w.device for w in self.workers if w.state == "busy")
        index = _scheduler.pick_idle([w.device for w in self.idle], busy)
        return self.idle.pop(index)

    def _adopt(self, worker: WorkerHandle) -> None:
        worker.owner = self.owner()
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
        if not self.queues["spawn"] or len(self.in_flight) >= self.max_workers:
            return []  # nothing waits, or no slot free: workers_to_start would say 0
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
            self.owner() if owned else None,
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
