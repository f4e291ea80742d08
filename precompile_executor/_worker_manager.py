"""One executor's workers: adopting warm ones from the hub's pool, starting new ones, giving idle
ones back, warm spares, balance across devices, stopping idle or starting ones.

A :class:`WorkerManager` belongs to one :class:`._scheduler.Scheduler`, which asks it for
workers and tells it when one is ready or gone. Every method runs with the hub's lock held and
returns the actions it decided (:mod:`._state`), which the caller runs after releasing the lock.
The process-wide registry it takes workers from and gives them back to is the hub's
:class:`._roster.WorkerRoster`.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Literal

from . import _policy
from ._state import Action, Launch, Owner, StopWorker, WorkerHandle

if TYPE_CHECKING:
    from ._hub import Hub
    from ._records import Settings


class WorkerManager:
    """The workers one executor holds (hub lock held throughout; see the module doc).

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
