"""The hub's worker ends: a socket's end of file, reaping the process and reporting its started
task, a failed start, retiring a dead worker's resources, stopping a worker.

:class:`WorkerEnds` is a base of :class:`._hub.Hub`: its attributes are the hub's, set by
``Hub.__init__``; see :mod:`._hub` for which thread runs what.
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
from typing import Any

from . import _process
from ._errors import TaskMemoryError, TaskTimeoutError, WorkerCrashedError
from ._messages import Stop, encode
from ._monitor import Monitor
from ._starts import Starts, died_early
from ._state import Action, Task, TaskState, WorkerHandle
from ._templates import Templates
from ._worker import read_capture_file

log = logging.getLogger("precompile_executor")


class WorkerEnds:
    """How a worker's end is noticed and cleaned up (see the module doc)."""

    # Set by ``Hub.__init__``; guarded by ``lock``.
    lock: threading.RLock
    changed: threading.Condition
    conns: dict[Connection, WorkerHandle]
    workers: set[WorkerHandle]  # every worker not yet dead
    guardian: _process.Guardian
    monitor: Monitor
    starts: Starts
    templates: Templates
    _starting: dict[str, WorkerHandle]

    def run(self, actions: Iterable[Action]) -> None:
        raise NotImplementedError  # the Hub's: carry out the cores' actions

    def submit_job(self, fn: Any, *args: Any) -> None:
        raise NotImplementedError  # the Hub's: run ``fn`` on the job pool

    def _unpool(self, worker: WorkerHandle) -> None:
        raise NotImplementedError  # the Hub's: drop ``worker`` from the idle pool

    def _stop(self, worker: WorkerHandle, kill: bool) -> None:
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

    def forget(self, worker: WorkerHandle) -> None:
        """Drop a worker from every registry (``lock`` held)."""
        worker.die(time.monotonic())
        self.workers.discard(worker)
        self._starting.pop(worker.token, None)
        self._unpool(worker)
        if worker.kind == "template":
            self.templates.forget(worker)
        elif worker.kind == "spawn":
            self.templates.drop_pending(worker)  # not forked yet: never will be
        self.changed.notify_all()

    def start_failed(self, worker: WorkerHandle, error: BaseException) -> None:
        with self.lock:
            if worker.state == "dead":
                return
            self.forget(worker)
            owner = worker.owner
            actions = owner.worker_failed_to_start(worker, error) if owner is not None else []
        if worker.kind == "template":
            log.debug("a warm template failed to start: %s", error)
            self.retire(worker)
            self.starts.template_gone(worker, said_hello=False)
            return
        log.warning("a worker failed to start: %s", error)
        self.retire(worker)
        self.run(actions)

    def retire(self, worker: WorkerHandle) -> None:
        """Release a dead worker's resources: socket, process, guardian entry, capture file."""
        if worker.conn is not None:
            self.monitor.close_conn(worker.conn, worker.send_lock)
        process = worker.process
        if process is not None:
            process.join(5.0)
            if process.exitcode is None:  # told to stop but still there: no more waiting
                _process.kill_group(worker.pid, grace_s=0)
                process.join(5.0)
        if worker.pid:
            self.guardian.forget(worker.pid)
        with contextlib.suppress(OSError):
            os.unlink(worker.capture_path)

    def _reap(self, worker: WorkerHandle, task: Task | None) -> None:
        """A worker's socket closed: get its exit code, report its started task (job pool)."""
        if worker.kind == "fork":
            code = _reap_child(worker.pid)
        else:
            code = self.starts.exit_code_of(worker)
        output = read_capture_file(worker.capture_path) if task is not None else ""
        self.retire(worker)
        if task is None:
            return
        doom = task.doom
        error: BaseException
        if doom is not None and doom.reason == "timeout":
            elapsed = doom.at - (task.started_at or doom.at)
            error = TaskTimeoutError(task.timeout or 0.0, elapsed, worker.pid, output)
        elif doom is not None and doom.reason == "memory":
            error = TaskMemoryError(task.memory_limit or 0, task.memory_peak, worker.pid, output)
        else:
            error = WorkerCrashedError(worker.pid, code, output, detail=doom.detail if doom else "")
        with self.lock:
            actions = task.owner.task_failed(task, error)
        self.run(actions)

    def died_starting(self, worker: WorkerHandle) -> None:
        with self.lock:
            if worker.state != "starting":
                return
        self.start_failed(worker, died_early(worker, self.starts.exit_code_of(worker)))

    def eof(self, conn: Connection) -> None:
        actions: list[Action] = []
        with self.lock:
            if conn in self.monitor.unknown:
                self.monitor.unknown.remove(conn)
                conn.close()
                return
            worker = self.conns.pop(conn, None)
            if worker is None:
                return
            task = worker.task
            was_alive = worker.state != "dead"
            self.forget(worker)
            started = None
            if task is not None and task.state is TaskState.SENT and task.doom is not None:
                actions += task.owner.task_failed(task, CancelledError(task.doom.detail))
            elif task is not None and task.state is TaskState.SENT:
                actions += task.owner.task_lost(task)  # never started: it runs elsewhere
            elif task is not None and task.state is TaskState.STARTED:
                started = task  # the reaper reports it, with the exit code and the output
            owner = worker.owner
            if was_alive and owner is not None:
                expected = worker.kind == "fork" and task is None
                actions += owner.worker_gone(worker, expected=expected)
        with worker.send_lock, contextlib.suppress(OSError):
            conn.close()  # the monitor's own thread, and no send in progress: safe
            worker.conn = None
        if worker.kind == "template":
            self.starts.template_gone(worker, said_hello=True)
        self.submit_job(self._reap, worker, started)
        self.run(actions)


def _reap_child(pid: int) -> int | None:
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
