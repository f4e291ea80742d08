"""The process-wide hub: worker processes, their sockets, the monitor thread, background jobs.

One hub per parent process owns every worker, so workers outlive the executor that started
them: an executor returns its idle workers to the hub's pool when it shuts down, and the next
executor with the same initializer takes them back (same pids, imports already paid).

The :class:`Hub` holds its parts, each with one concern, and is the one place the schedulers'
actions run (:meth:`Hub.run`: send a task, fork one, launch a worker, settle, stop):

* :class:`._roster.WorkerRoster` — who is alive, reachable, starting or pooled;
* :class:`._launcher.Launcher` — process starts: a fork from the kind's warm template (whose
  lifecycle rules are :class:`._template_lifecycle.TemplateLifecycle`) or a fresh interpreter;
* :class:`._monitor.Monitor` — the monitor thread: reads every socket and hands the hub each
  message (:meth:`Hub.dispatch`), end of file and due timer;
* :class:`._reaper.Reaper` — a worker's end: end of file, reaping, a failed start, retiring;
* :class:`._memory.MemoryGuard` — the memory watcher of tasks with a ``memory_limit``.

What stays here is a task's way through the hub — a ``Run`` written to a spawn worker, a fork
for a fork-path task, its ``Started`` and ``Done`` reported to its scheduler, the hand-off of
its outcome to a settle thread, kills — plus the workers' hellos, the timers and exit. Until a
worker says hello, the monitor also watches its process sentinel, so a worker that dies while
starting is noticed at once.

Threads and what they own:

* **monitor** (one): waits on every socket; turns wire messages into state changes under
  ``lock``; enforces deadlines and idle limits. It never blocks on a process and never runs user
  code: kills, reaps and starts go to the job pool, decoding results and setting futures (and so
  the user's done-callbacks) to the settle threads — except a plain result with no user
  callback, which it settles itself (``Settler.settle_now``, :mod:`._scheduler`). It alone
  closes worker sockets.
* **job pool** (bounded, :class:`._jobs.JobPool`): starts workers, kills process groups, reaps
  dead workers and reports their tasks, stops workers.
* **settle threads** (at most a few, a ``JobPool`` too): unpickle results and set futures.
* **memory watcher** (:mod:`._memory`, while a task with a ``memory_limit`` runs or waits):
  samples those tasks' process groups; one past its limit is marked for a kill and killed.
* callers' threads: submit, decide under ``lock`` and run the resulting actions.

Only the monitor lives for the process's life: idle job, settle and watcher threads end.

``lock`` guards every task, worker handle and scheduler (one lock: a task's state and its
worker's state always change together). Decisions are made under it; sends, forks, kills and
future updates happen after it is released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from . import _process, _stdlib
from ._errors import WorkerStartError, proxy_from_record
from ._fork import fork_task
from ._jobs import JobPool
from ._launcher import Launcher
from ._memory import MemoryGuard, anon_bytes, kill_now
from ._messages import (
    Done,
    Exited,
    Forked,
    ForkRefused,
    Hello,
    Run,
    Started,
    Stop,
    encode,
    send_frame,
)
from ._monitor import Monitor
from ._reaper import Reaper, reap_child
from ._roster import WorkerRoster
from ._state import (
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
from ._template_lifecycle import Decision

log = logging.getLogger("precompile_executor")

WORKER_START_TIMEOUT_S = 600.0
"""How long a new worker may take to start and run its initializer (``import torch`` is slow
on a loaded machine) before it counts as failed."""

JOB_THREADS = 64
"""Most background job threads at once: kills wait out a grace period each, so many may run
at once. Idle ones end (:mod:`._jobs`): only the monitor stays for the process's life."""

SETTLE_THREADS = 4
"""Most threads decoding results and setting futures at once; a slow done-callback holds only
one. Idle ones end, like the job threads."""


class Hub:
    """Process-wide owner of workers, the listening socket, the monitor and the job pools.

    Long because a task's way through the process is one concept: the actions the schedulers
    decided (:meth:`run`) and what the monitor reads back (:meth:`dispatch`) meet here, on
    the registry the roster keeps; starting and ending workers are its parts' (module doc).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # any task or worker changed state
        self._pid = os.getpid()
        self._dir = tempfile.mkdtemp(prefix="precompile-executor-")
        self.address = os.path.join(self._dir, "hub.sock")
        self.guardian = _process.Guardian()
        self.roster = WorkerRoster(self._dir, self.changed, self.wake)
        self.templates = self.roster.templates  # the warm template of each kind
        self.launcher = Launcher(self)
        self.reaper = Reaper(self)
        self.schedulers: weakref.WeakSet[Owner] = weakref.WeakSet()  # drained, aborted at exit
        self.closed = False
        self.exiting = False  # the interpreter is exiting: no new tasks
        # Both pools start threads on demand and let idle ones end (tests/test_limits.py: a
        # burst of kills must not leave 64 idle threads for the process's life).
        self._jobs = JobPool(JOB_THREADS, "precompile-job")
        self._settlers = JobPool(SETTLE_THREADS, "precompile-settle")
        self.memory = MemoryGuard(self.lock, self._memory_exceeded, self._repump, self.submit_job)
        self.monitor = Monitor(self.address, self)
        # At exit, before threads are joined: submitted tasks finish, then workers stop.
        _stdlib.register_before_thread_pools_exit(self._at_exit)

    @property
    def workers(self) -> set[WorkerHandle]:
        """Every worker not yet dead (``lock`` held)."""
        return self.roster.workers

    def wake(self) -> None:
        """Make the monitor recompute its deadlines and the sockets it waits on."""
        self.monitor.wake()

    def submit_job(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on the job pool (here, when no thread can start any more)."""
        try:
            self._jobs.submit(fn, *args)
        except RuntimeError:  # the interpreter is past the point of new threads: do it here
            fn(*args)

    def template_refused(self, key: bytes) -> str | None:
        """Why workers of kind ``key`` start as interpreters, or ``None`` (``lock`` held)."""
        return self.templates.refusal(key)

    def stop_idle(self, key: bytes | None = None) -> int:
        """Stop the idle pooled workers of kind ``key`` (all kinds: ``None``), and the warm
        templates no live worker came from (only memory now); return how many workers."""
        with self.lock:
            victims = self.roster.pooled_victims(key)
            for worker in victims:
                self.roster.forget(worker)
            templates = self.roster.unused_templates()
            for template in templates:
                self.roster.forget(template)
        self.run([StopWorker(w, kill=False) for w in victims + templates])
        return len(victims)

    # -- running actions (no lock held) --------------------------------------------------------

    def run(self, actions: Iterable[Action]) -> None:
        """Carry out what the schedulers decided under the lock.

        Settles go last: a task's ``Done`` returns its worker, and the next task is on that
        worker's socket before its result is decoded and its future set, so the worker runs
        meanwhile; on the monitor, they wait for the end of its round (:meth:`Monitor.later`)
        (docs/design.md, "Per-task overhead")."""
        self.memory.start_pending()
        wake = False
        settles: list[Settle] = []
        for action in actions:
            if isinstance(action, Send):
                self._send(action.worker, action.task)
                wake = wake or action.task.timeout is not None
            elif isinstance(action, Settle):
                settles.append(action)
            elif isinstance(action, Fork):
                self._fork(action.task)
            elif isinstance(action, Launch):
                self.submit_job(self.launcher.launch, action.worker, action.init_blob)
            elif isinstance(action, StopWorker):
                self.submit_job(self.reaper.stop, action.worker, action.kill)
        if wake:
            self.wake()
        if not settles:
            return
        if self.monitor.on_thread():
            self.monitor.later(self._carry_settles, settles)
        else:
            self._carry_settles(settles)

    def _carry_settles(self, settles: list[Settle]) -> None:
        for settle in settles:
            # A plain result with no user callback is settled right here (on the monitor: no
            # hand-off); anything else on a settle thread.
            if not settle.task.owner.settle_now(settle.task, settle.outcome):
                self._settle(settle.task, settle.outcome)

    def _settle(self, task: Task, outcome: Any) -> None:
        try:
            self._settlers.submit(task.owner.settle, task, outcome)
        except RuntimeError:  # the settle pool is shut down (or exit is near): do it here
            task.owner.settle(task, outcome)

    def _send(self, worker: WorkerHandle, task: Task) -> None:
        """Write ``task``'s ``Run`` to ``worker`` — with every task decided for it before, in the
        order decided (``WorkerHandle.outbox``): another thread may hold the ``Send`` of an
        earlier one, and whoever takes the send lock first writes them all."""
        with worker.send_lock:
            while worker.outbox:
                self._write_run(worker, worker.outbox.popleft())

    @staticmethod
    def _write_run(worker: WorkerHandle, task: Task) -> None:
        """One ``Run`` on the socket (``worker.send_lock`` held)."""
        assert task.blob is not None
        message = encode(Run(task.id, task.n, task.want_output, task.blob))
        log.debug("task %d on the spawn path, worker pid %d", task.id, worker.pid)
        conn = worker.conn
        try:
            if conn is None or conn.closed:
                raise OSError("socket closed")
            send_frame(conn.fileno(), message)  # send_bytes' bytes
        except (OSError, ValueError):
            # The worker is dying; its end of file (read by the monitor) puts the task, which
            # never started, back in the queue.
            log.debug("task %d: worker pid %d gone before the send", task.id, worker.pid)

    def _fork(self, task: Task) -> None:
        assert task.calls is not None
        worker = WorkerHandle("fork", b"", self.roster.new_capture_path())
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
            self.roster.workers.add(worker)
            self.roster.conns[conn] = worker
        self.memory.start_pending()
        log.debug("task %d on the fork path, child pid %d", task.id, pid)
        self.wake()

    # -- kills ---------------------------------------------------------------------------------

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
                if live and task.kill_order is None and worker is not None:
                    task.kill_order = KillOrder("killed", now, detail)
                    victims.append((task, worker))
        pids = {w.pid for _, w in victims if w.pid}  # a task sent ahead shares its worker's
        threads = [
            threading.Thread(target=_process.kill_group, args=(pid, grace_s), daemon=True)
            for pid in pids
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=grace_s + 10)
        return [t for t, _ in victims]

    def _memory_exceeded(self, task: Task, pid: int, peak: int) -> None:
        """The memory watcher saw ``task``'s group past its limit: order its kill and kill the
        group at once, no grace (the machine's memory is at stake); its end of file makes the
        reaper report :class:`TaskMemoryError`. Watcher thread, no lock held."""
        with self.lock:
            worker = task.worker
            if task.state is not TaskState.STARTED or task.kill_order is not None:
                return
            if worker is None or worker.pid != pid:
                return
            task.kill_order = KillOrder("memory", time.monotonic())
            task.memory_peak = peak
        log.debug("task %d: process group %d past its memory limit, killed", task.id, pid)
        kill_now(pid)
        self.submit_job(_process.kill_group, pid, 0.0)  # waits for them; catches stragglers

    def _repump(self, scheduler: Any) -> None:
        """Memory may have freed: let ``scheduler``'s queue go on (memory watcher, no lock)."""
        with self.lock:
            actions = scheduler.pump()
        self.run(actions)

    # -- what the monitor reports (the monitor thread; see _monitor.py) ------------------------

    def watch_list(self) -> dict[Any, int | None]:
        """What the monitor waits on (``lock`` held): :meth:`WorkerRoster.watch_list`."""
        return self.roster.watch_list()

    def dispatch(self, conn: Connection, message: Any) -> None:
        """A message read from ``conn`` (the monitor thread)."""
        if isinstance(message, Started):
            self._started(conn, message)
        elif isinstance(message, Done):
            self._done(conn, message)
        elif isinstance(message, Hello):
            self._hello(conn, message)
        elif isinstance(message, (Forked, ForkRefused, Exited)):
            with self.lock:
                template = self.roster.conns.get(conn)
                if template is None or template.kind != "template":
                    return
                decisions = self.templates.message(template, message, self.roster.starting)
                self.changed.notify_all()  # an exit code exit_code_of() may wait for
            self.launcher.carry_out(decisions)

    def eof(self, conn: Connection) -> None:
        """``conn`` ended: its worker is dead (:meth:`Reaper.eof`)."""
        self.reaper.eof(conn)

    def died_starting(self, worker: WorkerHandle) -> None:
        """A starting worker's process sentinel fired before its hello."""
        self.reaper.died_starting(worker)

    def _started(self, conn: Connection, message: Started) -> None:
        doomed = 0
        with self.lock:
            worker = self.roster.conns.get(conn)
            task = worker.task if worker is not None else None
            if task is not None and task.id == message.task_id and task.state is TaskState.SENT:
                task.start(time.monotonic())
                if task.memory_limit is not None and worker is not None:
                    self.memory.watch(task, worker.pid, task.memory_limit)
                if task.kill_order is not None and worker is not None:
                    doomed = worker.pid  # killed while it waited ahead (Scheduler.kill)
        self.memory.start_pending()
        if doomed:
            self.submit_job(_process.kill_group, doomed, 0.0)

    def _done(self, conn: Connection, message: Done) -> None:
        actions: list[Action] = []
        with self.lock:
            worker = self.roster.conns.get(conn)
            task = worker.task if worker is not None else None
            if worker is None or task is None or task.id != message.task_id:
                return
            if task.state is not TaskState.STARTED or task.kill_order is not None:
                return  # being killed: the reaper reports it
            if message.retire:
                # A sticky CUDA error: this process is done for; replace it like a crashed one.
                log.debug("worker pid %d retires after a sticky CUDA error", worker.pid)
                self.roster.forget(worker)
            elif message.recycle:
                # max_tasks_per_child reached: the worker leaves on its own; a new one replaces
                # it at once (from the warm template: milliseconds).
                self.roster.forget(worker)
            actions += task.owner.task_returned(task, (message, worker.pid))
            if (message.retire or message.recycle) and worker.owner is not None:
                actions += worker.owner.worker_gone(
                    worker, expected=False, recycled=message.recycle
                )
        if message.retire:
            actions.append(StopWorker(worker, kill=True))
        self.run(actions)

    def _hello(self, conn: Connection, message: Hello) -> None:
        actions: list[Action] = []
        with self.lock:
            if conn in self.monitor.unknown:
                self.monitor.unknown.remove(conn)
            worker = self.roster.starting.pop(message.token, None)
            if worker is None or worker.state != "starting":
                conn.close()  # stopped while starting: its serve loop sees EOF and returns
                return
            worker.pid = message.pid
            worker.conn = conn
            self.roster.conns[conn] = worker
            decisions: list[Decision] = []
            if message.failure is None:
                worker.ready(time.monotonic())
                if worker.kind == "template":
                    decisions = self.templates.hello(worker)
                elif worker.owner is not None:
                    actions = worker.owner.worker_ready(worker)
                else:
                    self.roster.put_pooled(worker, worker.since)
                self.changed.notify_all()
        self.guardian.watch(message.pid)
        if message.failure is not None:
            failure = message.failure
            error = WorkerStartError(
                f"the initializer raised in worker pid {message.pid}: "
                f"{failure.exc_type}: {failure.message}"
            )
            error.__cause__ = proxy_from_record(failure)
            if worker.kind == "template":  # the initializer fails: in every worker of the kind
                with self.lock:
                    decisions = self.templates.init_failed(worker, error)
                self.launcher.carry_out(decisions)
            self.reaper.start_failed(worker, error)
            return
        log.debug("%s pid %d ready", worker.kind, message.pid)
        self.launcher.carry_out(decisions)
        self.run(actions)

    # -- deadlines and idle limits -----------------------------------------------------------

    def next_timer(self) -> float | None:
        """Seconds until the next deadline or idle expiry (``lock`` held)."""
        soonest: float | None = None
        for worker in self.roster.workers:
            when: float | None = None
            task = worker.task
            if worker.state == "busy":
                if task is not None and task.deadline is not None and task.kill_order is None:
                    when = task.deadline
            elif self.templates.holds(worker):
                pass  # a template lives while a worker it forked does
            elif worker.state == "idle" and worker.idle_timeout_s is not None:
                when = worker.since + worker.idle_timeout_s
            elif worker.state == "starting":
                when = worker.since + WORKER_START_TIMEOUT_S
            if when is not None and (soonest is None or when < soonest):
                soonest = when
        return None if soonest is None else max(0.0, soonest - time.monotonic())

    def check_timers(self) -> None:
        now = time.monotonic()
        kills: list[WorkerHandle] = []
        stuck: list[WorkerHandle] = []
        actions: list[Action] = []
        with self.lock:
            for worker in list(self.roster.workers):
                task = worker.task
                if worker.state == "busy" and task is not None:
                    due = task.deadline is not None and now >= task.deadline
                    if due and task.kill_order is None:
                        task.kill_order = KillOrder("timeout", now)
                        kills.append(worker)
                elif worker.idle_expired(now) and not self.templates.holds(worker):
                    # Taken out of every idle list in this same step: no dispatch can pick it.
                    owner = worker.owner
                    self.roster.forget(worker)
                    if owner is not None:
                        actions += owner.worker_gone(worker, expected=True)
                    actions.append(StopWorker(worker, kill=False))
                elif worker.state == "starting" and now >= worker.since + WORKER_START_TIMEOUT_S:
                    stuck.append(worker)
        for worker in kills:
            # The kill ends the process; its end of file makes the reaper report the timeout.
            self.submit_job(_process.kill_group, worker.pid)
        self.run(actions)
        for worker in stuck:
            self.reaper.start_failed(
                worker, TimeoutError(f"worker did not start within {WORKER_START_TIMEOUT_S:g}s")
            )

    # -- exit ----------------------------------------------------------------------------------

    def _at_exit(self) -> None:
        """At interpreter exit: refuse new tasks, let every submitted task finish (as the
        stdlib pools do), then stop every worker. Ctrl-C while waiting kills the running ones."""
        global _exiting
        if os.getpid() != self._pid:
            return  # a forked child exiting: not ours
        _exiting = True
        with self.lock:
            self.exiting = True
            schedulers = list(self.schedulers)
        try:
            for scheduler in schedulers:
                scheduler.drain_at_exit()
        except BaseException:  # noqa: BLE001 - Ctrl-C: kill what runs, then close
            for scheduler in schedulers:
                scheduler.abort("the interpreter exited")
        self.close()

    def close(self) -> None:
        """Stop every worker now: idle ones cleanly, busy and starting ones killed; tasks still
        queued or running fail. Used at exit and by tests."""
        if os.getpid() != self._pid:
            return
        with self.lock:
            if self.closed:
                return
            self.closed = True
            workers = list(self.roster.workers)
            for worker in workers:
                worker.die(time.monotonic())
            schedulers = list(self.schedulers)
        self.monitor.stop()  # no reads in flight from here on
        for scheduler in schedulers:
            scheduler.abort("the executor's process is closing its workers")
        for worker in workers:
            if worker.state == "busy" or worker.conn is None or worker.kind == "fork":
                if worker.pid:
                    _process.kill_group(worker.pid, grace_s=0)
            else:
                with worker.send_lock, contextlib.suppress(OSError, ValueError):
                    worker.conn.send_bytes(encode(Stop()))
        for worker in workers:
            if worker.kind == "fork":
                reap_child(worker.pid)
            self.reaper.retire(worker)
        self._jobs.shutdown(wait=True)
        self._settlers.shutdown(wait=True, timeout_s=10.0)
        self.guardian.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


_hub: Hub | None = None
_hub_lock = threading.Lock()
_exiting = False


def get_hub() -> Hub:
    """The process's hub, created on first use (and again in a forked child).

    Raises:
        RuntimeError: the interpreter is exiting (as the stdlib pools do).
    """
    global _hub
    with _hub_lock:
        if _exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if _hub is None or _hub.closed:
            _hub = Hub()
        return _hub


def current_hub() -> Hub | None:
    """The process's hub if one exists (never creates one)."""
    return _hub


def _forget_hub_in_child() -> None:
    global _hub, _hub_lock, _exiting
    _hub = None
    _hub_lock = threading.Lock()
    _exiting = False


os.register_at_fork(after_in_child=_forget_hub_in_child)
