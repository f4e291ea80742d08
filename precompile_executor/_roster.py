"""The roster of worker processes: every worker of this process not yet dead, its socket, the
ones still starting, and the idle pool of warm workers no executor holds.

One :class:`WorkerRoster` per hub; every method runs with the hub's lock held. Taking a worker
from the pool is one step (:meth:`WorkerRoster.take_pooled` pops it), so an idle expiry and a
dispatch can never both have it; :meth:`WorkerRoster.forget` drops a worker from every list at
once, also from the warm templates' lifecycle (:mod:`._template_lifecycle`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Literal

from ._state import Owner, WorkerHandle
from ._template_lifecycle import TemplateLifecycle


class WorkerRoster:
    """Who is alive, reachable, starting or pooled (hub lock held; see the module doc).

    Args:
        directory: where each worker's capture file goes.
        changed: the hub's condition, notified when a worker leaves.
        wake: makes the monitor recompute what it waits on.
    """

    def __init__(
        self, directory: str, changed: threading.Condition, wake: Callable[[], None]
    ) -> None:
        self._dir = directory
        self._changed = changed
        self._wake = wake
        self._capture_ids = iter(range(1, 1 << 62))
        self.workers: set[WorkerHandle] = set()  # every worker not yet dead
        self.conns: dict[Connection, WorkerHandle] = {}  # every socket said hello on
        self.starting: dict[str, WorkerHandle] = {}  # by token, until its hello
        self.pool: dict[bytes, list[WorkerHandle]] = {}  # idle workers no executor holds, by kind
        self.templates = TemplateLifecycle(self.new_capture_path)  # the warm template per kind

    def new_capture_path(self) -> str:
        """A fresh file path for one worker's captured output."""
        return os.path.join(self._dir, f"out-{next(self._capture_ids)}.txt")

    def new_worker(
        self,
        key: bytes,
        owner: Owner | None,
        idle_timeout_s: float | None,
        device: str | None,
        *,
        start: Literal["template", "interpreter"] = "interpreter",
        template_key: bytes = b"",
        max_tasks: int | None = None,
    ) -> WorkerHandle:
        """Register a spawn worker in state ``starting``; a :class:`._state.Launch` action
        starts it."""
        worker = WorkerHandle(
            "spawn",
            key,
            self.new_capture_path(),
            device=device,
            idle_timeout_s=idle_timeout_s,
            start=start,
            template_key=template_key,
        )
        worker.max_tasks = max_tasks
        worker.owner = owner
        self.register_starting(worker)
        return worker

    def register_starting(self, worker: WorkerHandle) -> None:
        """Register a new worker or template in state ``starting``."""
        self.starting[worker.token] = worker
        self.workers.add(worker)

    def take_pooled(self, key: bytes) -> WorkerHandle | None:
        """Take an idle pooled worker of kind ``key``: one step, so an idle expiry can never take
        the same worker."""
        pool = self.pool.get(key)
        while pool:
            worker = pool.pop()
            if worker.state == "idle":
                return worker
        return None

    def put_pooled(self, worker: WorkerHandle, now: float) -> None:
        """Give an idle worker back to the pool."""
        worker.owner = None
        worker.since = now
        self.pool.setdefault(worker.key, []).append(worker)
        self._wake()  # its idle expiry is a new timer

    def pooled_victims(self, key: bytes | None) -> list[WorkerHandle]:
        """Take out the idle pooled workers of kind ``key`` (every kind: ``None``) and the spares
        still starting for it (no executor holds them: they would join the pool right after)."""
        keys = [key] if key is not None else list(self.pool)
        victims = [w for k in keys for w in self.pool.pop(k, []) if w.state == "idle"]
        victims += [
            w
            for w in self.workers
            if w.owner is None and w.kind == "spawn" and w.state == "starting" and w.key in keys
        ]
        return victims

    def unused_templates(self) -> list[WorkerHandle]:
        """The warm templates no live spawn worker came from."""
        in_use = {w.template_key for w in self.workers if w.kind == "spawn"}
        return self.templates.unused(in_use)

    def forget(self, worker: WorkerHandle) -> None:
        """Mark a worker dead and drop it from every list."""
        worker.die(time.monotonic())
        self.workers.discard(worker)
        self.starting.pop(worker.token, None)
        pool = self.pool.get(worker.key)
        if pool and worker in pool:
            pool.remove(worker)
        if worker.kind == "template":
            self.templates.forget(worker)
        elif worker.kind == "spawn":
            self.templates.drop_pending(worker)  # not forked yet: never will be
        self._changed.notify_all()

    def watch_list(self) -> dict[Any, int | None]:
        """What the monitor waits on: every known socket, and the process sentinel of each
        worker still starting (fd looked up when first registered)."""
        live: dict[Any, int | None] = dict.fromkeys(self.conns)
        for worker in self.starting.values():
            if worker.process is not None and worker.state == "starting":
                live[worker] = worker.process.sentinel
        return live
