"""The reaper: a worker's end — its socket's end of file, reaping the process and reporting the
task it had started, a failed start, retiring a dead worker's resources, stopping a worker.

:class:`Reaper` runs on the monitor thread (an end of file, a death before hello) and on the job
pool (reaping, stopping); see :mod:`._hub` for which thread runs what. A dead worker's socket is
closed only on the monitor's thread (:meth:`._monitor.Monitor.close_conn`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import CancelledError
from multiprocessing.connection import Connection
from typing import Any, Protocol

from . import _process
from ._errors import TaskMemoryError, TaskTimeoutError, WorkerCrashedError
from ._launcher import Launcher, died_early
from ._messages import Stop, encode
from ._monitor import Monitor
from ._roster import WorkerRoster
from ._state import Action, Task, TaskState, WorkerHandle
from ._worker import read_capture_file

log = logging.getLogger("precompile_executor")


class ReapSite(Protocol):
    """What the reaper needs of the hub."""

    lock: threading.RLock
    guardian: _process.Guardian

    @property
    def roster(self) -> WorkerRoster: ...

    @property
    def monitor(self) -> Monitor: ...

    @property
    def launcher(self) -> Launcher: ...

    def run(self, actions: Iterable[Action]) -> None: ...

    def submit_job(self, fn: Any, *args: Any) -> None: ...


class Reaper:
    """How a worker's end is noticed and cleaned up (see the module doc)."""

    def __init__(self, hub: ReapSite) -> None:
        self._hub = hub

    def stop(self, worker: WorkerHandle, kill: bool) -> None:
        """Stop a worker already marked dead: ask its serve loop to return, or kill its group."""
        if kill or worker.conn is None:
            if worker.pid:
                _process.kill_group(worker.pid, grace_s=0)
            if worker.conn is None:  # never connected: nothing will report its end
                self.retire(worker)
            return
        with worker.send_lock:
            conn = worker.conn
            with contextlib.suppress(OSError, ValueError):
                if not conn.closed:
                    conn.send_bytes(encode(Stop()))

    def start_failed(self, worker: WorkerHandle, error: BaseException) -> None:
        hub = self._hub
        with hub.lock:
            if worker.state == "dead":
                return
            hub.roster.forget(worker)
            owner = worker.owner
            actions = owner.worker_failed_to_start(worker, error) if owner is not None else []
        if worker.kind == "template":
            log.debug("a warm template failed to start: %s", error)
            self.retire(worker)
            hub.launcher.template_gone(worker, said_hello=False)
            return
        log.warning("a worker failed to start: %s", error)
        self.retire(worker)
        hub.run(actions)

    def retire(self, worker: WorkerHandle) -> None:
        """Release a dead worker's resources: socket, process, guardian entry, capture file."""
        hub = self._hub
        if worker.conn is not None:
            hub.monitor.close_conn(worker.conn, worker.send_lock)
        process = worker.process
        if process is not None:
            process.join(5.0)
            if process.exitcode is None:  # told to stop but still there: no more waiting
                _process.kill_group(worker.pid, grace_s=0)
                process.join(5.0)
        if worker.pid:
            hub.guardian.forget(worker.pid)
        with contextlib.suppress(OSError):
            os.unlink(worker.capture_path)

    def reap(self, worker: WorkerHandle, task: Task | None) -> None:
        """A worker's socket closed: get its exit code, report its started task (job pool)."""
        hub = self._hub
        if worker.kind == "fork":
            code = reap_child(worker.pid)
        else:
            code = hub.launcher.exit_code_of(worker)
        output = read_capture_file(worker.capture_path) if task is not None else ""
        self.retire(worker)
        if task is None:
            return
        order = task.kill_order
        error: BaseException
        if order is not None and order.cause == "timeout":
            elapsed = order.at - (task.started_at or order.at)
            error = TaskTimeoutError(task.timeout or 0.0, elapsed, worker.pid, output)
        elif order is not None and order.cause == "memory":
            error = TaskMemoryError(task.memory_limit or 0, task.memory_peak, worker.pid, output)
        else:
            detail = order.detail if order else ""
            error = WorkerCrashedError(worker.pid, code, output, detail=detail)
        with hub.lock:
            actions = task.owner.task_failed(task, error)
        hub.run(actions)

    def died_starting(self, worker: WorkerHandle) -> None:
        hub = self._hub
        with hub.lock:
            if worker.state != "starting":
                return
        self.start_failed(worker, died_early(worker, hub.launcher.exit_code_of(worker)))

    def eof(self, conn: Connection) -> None:
        hub = self._hub
        actions: list[Action] = []
        with hub.lock:
            if conn in hub.monitor.unknown:
                hub.monitor.unknown.remove(conn)
                conn.close()
                return
            worker = hub.roster.conns.pop(conn, None)
            if worker is None:
                return
            task = worker.task
            was_alive = worker.state != "dead"
            hub.roster.forget(worker)
            started = None
            if task is not None and task.state is TaskState.SENT:
                actions += _never_started(task, counted=True)
            elif task is not None and task.state is TaskState.STARTED:
                started = task  # the reaper reports it, with the exit code and the output
            ahead = worker.ahead
            if ahead is not None and ahead.state is TaskState.SENT:
                # Sent behind the worker's task: the worker died of that task, not of this one.
                actions += _never_started(ahead, counted=False)
            owner = worker.owner
            if was_alive and owner is not None:
                expected = worker.kind == "fork" and task is None
                actions += owner.worker_gone(worker, expected=expected)
        with worker.send_lock, contextlib.suppress(OSError):
            conn.close()  # the monitor's own thread, and no send in progress: safe
            worker.conn = None
        if worker.kind == "template":
            hub.launcher.template_gone(worker, said_hello=True)
        hub.submit_job(self.reap, worker, started)
        hub.run(actions)


def _never_started(task: Task, *, counted: bool) -> list[Action]:
    """A task its dead worker never started (lock held): one being killed is cancelled, any
    other runs elsewhere (``counted`` towards the requeue limit unless it was sent ahead)."""
    if task.kill_order is not None:
        return task.owner.task_failed(task, CancelledError(task.kill_order.detail))
    return task.owner.task_lost(task, counted=counted)


def reap_child(pid: int) -> int | None:
    """Wait for our forked child ``pid`` and return its exit code (negative: signal)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            _process.kill_group(pid, grace_s=0)
            deadline = time.monotonic() + 5.0
        time.sleep(0.005)
