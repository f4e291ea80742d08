"""The process-wide hub: worker processes, their sockets, the monitor thread, background jobs.

One hub per parent process owns every worker, so workers outlive the executor that started
them: an executor returns its idle workers to the hub's pool when it shuts down, and the next
executor with the same initializer takes them back (same pids, imports already paid).

The hub is the registry (workers, sockets, the idle pool) and the one place the cores' actions
run. Its parts, each with one concern: :class:`._starts.Starts` starts processes (a fork from
the kind's warm template, whose lifecycle rules are :class:`._templates.Templates`, or a fresh
interpreter by loky); :class:`._monitor.Monitor` is the monitor thread, which reads every socket
and hands the hub each message, end of file and due timer. Two bases of :class:`Hub` hold the
rest: :class:`._hub_tasks.TaskPath` a task's way (send, fork, ``Started``, ``Done``, settle
hand-off, kills, the memory watcher's hooks) and :class:`._hub_ends.WorkerEnds` a worker's end
(end of file, reaping, a failed start, retiring, stopping). Until a worker says hello, the
monitor also watches its process sentinel, so a worker that dies while starting is noticed at
once.

Threads and what they own:

* **monitor** (one): waits on every socket; turns wire messages into state changes under
  ``lock``; enforces deadlines and idle limits. It never blocks on a process and never runs user
  code: kills, reaps and starts go to the job pool, decoding results and setting futures (and so
  the user's done-callbacks) to the settle threads — except a plain result with no user
  callback, which it settles itself (``Settling.settle_now``, :mod:`._settle`). It alone closes
  worker sockets.
* **job pool** (bounded, :class:`._jobs.JobPool`): starts workers, kills process groups, reaps
  dead workers and reports their tasks, stops workers.
* **settle threads** (at most a few, a ``JobPool`` too): unpickle results and set futures.
* **memory watcher** (:mod:`._memory`, while a task with a ``memory_limit`` runs or waits):
  samples those tasks' process groups; one past its limit is doomed and killed by a job.
* callers' threads: submit, decide under ``lock`` and run the resulting actions.

Only the monitor lives for the process's life: idle job, settle and watcher threads end.

``lock`` guards every task, worker handle and executor core (one lock: a task's state and its
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
from typing import Any, Literal

from . import _process
from ._errors import (
    WorkerStartError,
    proxy_from_record,
)
from ._hub_ends import _reap_child
from ._hub_tasks import TaskPath
from ._jobs import JobPool
from ._memory import MemoryGuard
from ._messages import (
    Done,
    Exited,
    Forked,
    ForkRefused,
    Hello,
    Started,
    Stop,
    encode,
)
from ._monitor import Monitor
from ._starts import Starts
from ._state import (
    Action,
    Doom,
    Fork,
    Launch,
    Owner,
    Send,
    Settle,
    StopWorker,
    WorkerHandle,
)
from ._templates import (
    Decision,
)

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


class Hub(TaskPath):
    """Process-wide owner of workers, the listening socket, the monitor and the job pools."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # any task or worker changed state
        self._pid = os.getpid()
        self._dir = tempfile.mkdtemp(prefix="precompile-executor-")
        self.address = os.path.join(self._dir, "hub.sock")
        self.guardian = _process.Guardian()
        self.conns: dict[Connection, WorkerHandle] = {}
        self._starting: dict[str, WorkerHandle] = {}
        self.pool: dict[bytes, list[WorkerHandle]] = {}  # idle workers no executor holds
        self.starts = Starts(self, self.new_capture_path)
        self.templates = self.starts.templates  # the warm template of each kind
        self.workers: set[WorkerHandle] = set()  # every worker not yet dead
        self.cores: weakref.WeakSet[Owner] = weakref.WeakSet()  # drained and aborted at exit
        self.closed = False
        self.exiting = False  # the interpreter is exiting: no new tasks
        self._capture_ids = iter(range(1, 1 << 62))
        # Both pools start threads on demand and let idle ones end (tests/test_limits.py: a
        # burst of kills must not leave 64 idle threads for the process's life).
        self._jobs = JobPool(JOB_THREADS, "precompile-job")
        self._settlers = JobPool(SETTLE_THREADS, "precompile-settle")
        self.memory = MemoryGuard(self.lock, self._memory_exceeded, self._repump, self.submit_job)
        self.monitor = Monitor(self.address, self)
        # threading's exit hooks run last-registered first, before atexit's and before the
        # thread pools are joined: registered after the import of ThreadPoolExecutor, ours runs
        # while the job pools still take work.
        threading._register_atexit(self._at_exit)  # type: ignore[attr-defined]

    # -- small helpers -----------------------------------------------------------------------

    def new_capture_path(self) -> str:
        """A fresh file path for one worker's captured output."""
        return os.path.join(self._dir, f"out-{next(self._capture_ids)}.txt")

    def wake(self) -> None:
        """Make the monitor recompute its deadlines and the sockets it waits on."""
        self.monitor.wake()

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
        """Register a spawn worker in state ``starting`` (``lock`` held); launch it with
        a :class:`Launch` action."""
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

    def take_pooled(self, key: bytes) -> WorkerHandle | None:
        """Take an idle pooled worker of ``key`` (``lock`` held): one step, so an idle expiry
        can never take the same worker."""
        pool = self.pool.get(key)
        while pool:
            worker = pool.pop()
            if worker.state == "idle":
                return worker
        return None

    def put_pooled(self, worker: WorkerHandle, now: float) -> None:
        """Give an idle worker back to the pool (``lock`` held)."""
        worker.owner = None
        worker.since = now
        self.pool.setdefault(worker.key, []).append(worker)
        self.wake()

    def stop_idle(self, key: bytes | None = None) -> int:
        """Stop the idle pooled workers of kind ``key`` (all kinds: ``None``), and the warm
        templates no live worker came from (only memory now); return how many workers."""
        with self.lock:
            keys = [key] if key is not None else list(self.pool)
            victims = [w for k in keys for w in self.pool.pop(k, []) if w.state == "idle"]
            # Spares still starting (no executor holds them) would join the pool right after.
            victims += [
                w
                for w in self.workers
                if w.owner is None and w.kind == "spawn" and w.state == "starting" and w.key in keys
            ]
            for worker in victims:
                self.forget(worker)
            in_use = {w.template_key for w in self.workers if w.kind == "spawn"}
            templates = self.templates.unused(in_use)
            for template in templates:
                self.forget(template)
        self.run([StopWorker(w, kill=False) for w in victims + templates])
        return len(victims)

    def _unpool(self, worker: WorkerHandle) -> None:
        pool = self.pool.get(worker.key)
        if pool and worker in pool:
            pool.remove(worker)

    # -- running actions (no lock held) --------------------------------------------------------

    def run(self, actions: Iterable[Action]) -> None:
        """Carry out what the executor cores decided under the lock.

        Settles go last: a task's ``Done`` returns its worker, and the next task is on that
        worker's socket before its result is decoded and its future set, so the worker runs
        meanwhile; on the monitor, they wait for the end of its round (:meth:`Monitor.later`)
        (docs/design.md, "Per-task overhead")."""
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
                self.submit_job(self.starts.launch, action.worker, action.init_blob)
            elif isinstance(action, StopWorker):
                self.submit_job(self._stop, action.worker, action.kill)
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

    def submit_job(self, fn: Any, *args: Any) -> None:
        try:
            self._jobs.submit(fn, *args)
        except RuntimeError:  # the interpreter is past the point of new threads: do it here
            fn(*args)

    def register_starting(self, worker: WorkerHandle) -> None:
        """Register a new worker or template in state ``starting`` (``lock`` held)."""
        self._starting[worker.token] = worker
        self.workers.add(worker)

    def template_refused(self, key: bytes) -> str | None:
        """Why workers of kind ``key`` start as interpreters, or ``None`` (``lock`` held)."""
        return self.templates.refusal(key)

        # its end of file reaches the monitor, which retires it

    # -- worker ends ---------------------------------------------------------------------------

    # -- killing -------------------------------------------------------------------------------

    # -- what the monitor reports (the monitor thread; see _monitor.py) ------------------------

    def watch_list(self) -> dict[Any, int | None]:
        """What the monitor waits on (``lock`` held): every known socket, and the process
        sentinel of each worker still starting (fd looked up when first registered)."""
        live: dict[Any, int | None] = dict.fromkeys(self.conns)
        for worker in self._starting.values():
            if worker.process is not None and worker.state == "starting":
                live[worker] = worker.process.sentinel
        return live

    def dispatch(self, conn: Connection, message: Any) -> None:
        if isinstance(message, Started):
            self._started(conn, message)
        elif isinstance(message, Done):
            self._done(conn, message)
        elif isinstance(message, Hello):
            self._hello(conn, message)
        elif isinstance(message, (Forked, ForkRefused, Exited)):
            with self.lock:
                template = self.conns.get(conn)
                if template is None or template.kind != "template":
                    return
                decisions = self.templates.message(template, message, self._starting)
                self.changed.notify_all()  # an exit code exit_code_of() may wait for
            self.starts.carry(decisions)

    def _hello(self, conn: Connection, message: Hello) -> None:
        actions: list[Action] = []
        with self.lock:
            if conn in self.monitor.unknown:
                self.monitor.unknown.remove(conn)
            worker = self._starting.pop(message.token, None)
            if worker is None or worker.state != "starting":
                conn.close()  # stopped while starting: its serve loop sees EOF and returns
                return
            worker.pid = message.pid
            worker.conn = conn
            self.conns[conn] = worker
            decisions: list[Decision] = []
            if message.failure is None:
                worker.ready(time.monotonic())
                if worker.kind == "template":
                    decisions = self.templates.hello(worker)
                elif worker.owner is not None:
                    actions = worker.owner.worker_ready(worker)
                else:
                    self.put_pooled(worker, worker.since)
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
                self.starts.carry(decisions)
            self.start_failed(worker, error)
            return
        log.debug("%s pid %d ready", worker.kind, message.pid)
        self.starts.carry(decisions)
        self.run(actions)

    # -- deadlines and idle limits -----------------------------------------------------------

    def next_timer(self) -> float | None:
        """Seconds until the next deadline or idle expiry (``lock`` held)."""
        soonest: float | None = None
        for worker in self.workers:
            when: float | None = None
            task = worker.task
            if worker.state == "busy":
                if task is not None and task.deadline is not None and task.doom is None:
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
            for worker in list(self.workers):
                task = worker.task
                if worker.state == "busy" and task is not None:
                    if task.deadline is not None and task.doom is None and now >= task.deadline:
                        task.doom = Doom("timeout", now)
                        kills.append(worker)
                elif worker.idle_expired(now) and not self.templates.holds(worker):
                    # Taken out of every idle list in this same step: no dispatch can pick it.
                    owner = worker.owner
                    self.forget(worker)
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
            self.start_failed(
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
            cores = list(self.cores)
        try:
            for core in cores:
                core.drain_at_exit()
        except BaseException:  # noqa: BLE001 - Ctrl-C: kill what runs, then close
            for core in cores:
                core.abort("the interpreter exited")
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
            workers = list(self.workers)
            for worker in workers:
                worker.die(time.monotonic())
            cores = list(self.cores)
        self.monitor.stop()  # no reads in flight from here on
        for core in cores:
            core.abort("the executor's process is closing its workers")
        for worker in workers:
            if worker.state == "busy" or worker.conn is None or worker.kind == "fork":
                if worker.pid:
                    _process.kill_group(worker.pid, grace_s=0)
            else:
                with worker.send_lock, contextlib.suppress(OSError, ValueError):
                    worker.conn.send_bytes(encode(Stop()))
        for worker in workers:
            if worker.kind == "fork":
                _reap_child(worker.pid)
            self.retire(worker)
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
