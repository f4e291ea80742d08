"""The hub's task path: sending a task to a spawn worker, forking a fork-path task, a task's
``Started`` and ``Done``, handing an outcome to a settle thread, kills, and the memory watcher's
hooks (a task past its limit, memory freed).

:class:`TaskPath` is a base of :class:`._hub.Hub`: its attributes are the hub's, set by
``Hub.__init__``; see :mod:`._hub` for which thread runs what.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from . import _process
from ._fork import fork_task
from ._hub_ends import WorkerEnds
from ._jobs import JobPool
from ._memory import MemoryGuard, anon_bytes, kill_now
from ._messages import Done, Run, Started, encode, write_frame
from ._state import Action, Doom, StopWorker, Task, TaskState, WorkerHandle

log = logging.getLogger("precompile_executor")


class TaskPath(WorkerEnds):
    """A task's way through the hub, between the cores' actions and the monitor's reports."""

    # Set by ``Hub.__init__``; guarded by ``lock``.
    memory: MemoryGuard
    _settlers: JobPool

    def new_capture_path(self) -> str:
        raise NotImplementedError  # the Hub's: a fresh capture file path

    def wake(self) -> None:
        raise NotImplementedError  # the Hub's: make the monitor recompute its wait

    def _settle(self, task: Task, outcome: Any) -> None:
        try:
            self._settlers.submit(task.owner.settle, task, outcome)
        except RuntimeError:  # the settle pool is shut down (or exit is near): do it here
            task.owner.settle(task, outcome)

    def _send(self, worker: WorkerHandle, task: Task) -> None:
        assert task.blob is not None
        message = encode(Run(task.id, task.n, task.want_output, task.blob))
        log.debug("task %d on the spawn path, worker pid %d", task.id, worker.pid)
        with worker.send_lock:
            conn = worker.conn
            try:
                if conn is None or conn.closed:
                    raise OSError("socket closed")
                write_frame(conn.fileno(), message)  # send_bytes' bytes; the send_lock held
            except (OSError, ValueError):
                # The worker is dying; its end of file (read by the monitor) puts the task,
                # which never started, back in the queue.
                log.debug("task %d: worker pid %d gone before the send", task.id, worker.pid)

    def _fork(self, task: Task) -> None:
        assert task.calls is not None
        worker = WorkerHandle("fork", b"", self.new_capture_path())
        worker.owner = task.owner
        # What the child starts with is the caller's: its memory charge counts from here.
        anon_at_fork = anon_bytes(os.getpid()) if task.memory_limit is not None else 0
        try:
            pid, conn = fork_task(
                task.id,
                task.calls,
                task.want_output,
                worker.capture_path,
                self.guardian.fileno(),
                self.monitor.private_fds(),
            )
        except Exception as exc:  # noqa: BLE001 - e.g. EAGAIN: too many processes
            with self.lock:
                actions = task.owner.task_failed(task, exc)
            self.run(actions)
            return
        self.guardian.watch(pid)  # the child registered itself too, before anything else
        now = time.monotonic()
        with self.lock:
            worker.pid = pid
            worker.conn = conn
            worker.state = "busy"
            worker.task = task
            task.worker = worker
            task.start(now)
            if task.memory_limit is not None:
                self.memory.watch(task, pid, task.memory_limit, fork_anon=anon_at_fork)
            self.workers.add(worker)
            self.conns[conn] = worker
        log.debug("task %d on the fork path, child pid %d", task.id, pid)
        self.wake()

    def kill_tasks(self, tasks: Iterable[Task], detail: str, grace_s: float) -> list[Task]:
        """Kill the workers running (or about to run) ``tasks``; once reaped, a started one
        fails with ``WorkerCrashedError`` saying ``detail``, one not yet started is cancelled.
        Returns the tasks a kill went out for."""
        now = time.monotonic()
        victims: list[tuple[Task, WorkerHandle]] = []
        with self.lock:
            for task in tasks:
                worker = task.worker
                live = task.state in (TaskState.SENT, TaskState.STARTED)
                if live and task.doom is None and worker is not None:
                    task.doom = Doom("killed", now, detail)
                    victims.append((task, worker))
        threads = [
            threading.Thread(target=_process.kill_group, args=(w.pid, grace_s), daemon=True)
            for _, w in victims
            if w.pid
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=grace_s + 10)
        return [t for t, _ in victims]

    def _started(self, conn: Connection, message: Started) -> None:
        with self.lock:
            worker = self.conns.get(conn)
            task = worker.task if worker is not None else None
            if task is not None and task.id == message.task_id and task.state is TaskState.SENT:
                task.start(time.monotonic())
                if task.memory_limit is not None and worker is not None:
                    self.memory.watch(task, worker.pid, task.memory_limit)

    def _memory_exceeded(self, task: Task, pid: int, peak: int) -> None:
        """The memory watcher saw ``task``'s group past its limit: doom it and kill the group
        at once, no grace (the machine's memory is at stake); its end of file makes the
        reaper report :class:`TaskMemoryError`. Watcher thread, no lock held."""
        with self.lock:
            worker = task.worker
            if task.state is not TaskState.STARTED or task.doom is not None:
                return
            if worker is None or worker.pid != pid:
                return
            task.doom = Doom("memory", time.monotonic())
            task.memory_peak = peak
        log.debug("task %d: process group %d past its memory limit, killed", task.id, pid)
        kill_now(pid)
        self.submit_job(_process.kill_group, pid, 0.0)  # waits for them; catches stragglers

    def _repump(self, core: Any) -> None:
        """Memory may have freed: let ``core``'s queue go on (memory watcher, no lock held)."""
        with self.lock:
            actions = core.pump()
        self.run(actions)

    def _done(self, conn: Connection, message: Done) -> None:
        actions: list[Action] = []
        with self.lock:
            worker = self.conns.get(conn)
            task = worker.task if worker is not None else None
            if worker is None or task is None or task.id != message.task_id:
                return
            if task.state is not TaskState.STARTED or task.doom is not None:
                return  # being killed: the reaper reports it
            if message.retire:
                # A sticky CUDA error: this process is done for; replace it like a crashed one.
                log.debug("worker pid %d retires after a sticky CUDA error", worker.pid)
                self.forget(worker)
            elif message.recycle:
                # max_tasks_per_child reached: the worker leaves on its own; a new one replaces
                # it at once (from the warm template: milliseconds).
                self.forget(worker)
            actions += task.owner.task_returned(task, (message, worker.pid))
            if (message.retire or message.recycle) and worker.owner is not None:
                actions += worker.owner.worker_gone(
                    worker, expected=False, recycled=message.recycle
                )
        if message.retire:
            actions.append(StopWorker(worker, kill=True))
        self.run(actions)
