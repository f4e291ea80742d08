"""Processes: the process-wide hub, its worker processes and sockets, the monitor thread, jobs.

One hub per parent process owns every worker, so workers outlive the executor that started
them: an executor returns its idle workers to the hub's pool when it shuts down, and the next
executor with the same initializer takes them back (same pids, imports already paid).

The :class:`Hub` holds its parts, each with one concern, and is the one place the schedulers'
actions run (:meth:`Hub.run`: send a task, fork one, launch a worker, settle, stop):

* :class:`WorkerRoster` — who is alive, reachable, starting or pooled;
* :class:`Launcher` — process starts: a fork from the kind's warm template (whose
  lifecycle rules are :class:`TemplateLifecycle`) or a fresh interpreter;
* :class:`Monitor` — the monitor thread: reads every socket and hands the hub each
  message (:meth:`Hub.dispatch`), end of file and due timer;
* :class:`Reaper` — a worker's end: end of file, reaping, a failed start, retiring;
* :class:`._memory.MemoryGuard` — the memory watcher of tasks with a ``memory_limit``.

The parts hold the hub (``self._hub``) and call it directly; the hub alone holds them. The file
reads top down: first what the schedulers (:mod:`._scheduling`) and the hub share — a
:class:`Task` and a :class:`WorkerHandle` with explicit states and guarded transitions, the
actions a scheduler decides, the :class:`Owner` protocol the hub reports to (so this module
never imports the scheduler) —, then the template lifecycle, the roster, the monitor, the
launcher, the reaper, and the :class:`Hub` last.

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
  callback, which it settles itself (``Settler.settle_now``, :mod:`._scheduling`). It alone
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

import collections
import contextlib
import dataclasses
import enum
import itertools
import logging
import os
import secrets
import selectors
import shutil
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import CancelledError, Future
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from loky.backend import get_context

from . import _process, _stdlib
from ._errors import (
    TaskMemoryError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
    proxy_from_record,
)
from ._fork import fork_task
from ._fork_server import serve_template
from ._jobs import JobPool
from ._memory import MemoryGuard, anon_bytes, kill_now
from ._wire import (
    Done,
    Exited,
    Forked,
    ForkRefused,
    ForkWorker,
    Hello,
    Run,
    Started,
    Stop,
    decode,
    encode,
    read_frames,
    read_now,
    send_frames,
    write_now,
)
from ._worker import Startup, read_capture_file, serve_interpreter

if TYPE_CHECKING:
    from ._costs import CostKey, CostModel
    from ._worker import Call


# Tasks and worker handles: explicit states, guarded transitions, and the actions they lead to.
#
# Every field here is read and written with the hub's lock held (one lock for the hub and every
# executor scheduler: a task's state and its worker's state always change together).
#
# Task states::
#
#     QUEUED ──dispatch──► SENT ──worker's Started──► STARTED ──Done / death / kill──► DONE
#       │  ▲                 │                                                        ▲
#       │  └──worker died before Started (never ran: queued again under its first key) │
#       └──cancelled, or the executor broke ─────────────────────────────────────────┘
#
# A task reaches DONE exactly once, in :meth:`Task.close` — whoever closes it settles its future;
# nobody else touches the future (``future.cancel()`` of a queued task by the user is the one
# exception, which the stdlib owns). A forked task is STARTED as soon as ``fork()`` returns.
#
# Worker states::
#
#     starting ──Hello──► idle ◄──► busy      any state ──► dead
#
# A busy spawn worker may also hold tasks sent *ahead* (``WorkerHandle.ahead``, SENT, in order):
# written to its socket behind its task, the first becomes the worker's task when that task's
# ``Done`` arrives.
#
# Only :class:`WorkerHandle`'s methods change a worker's state, and each checks where it comes
# from; an illegal transition raises :class:`InvalidTransition` (a bug, never a user error).
class InvalidTransition(RuntimeError):
    """A task or worker was asked to move to a state it cannot reach from where it is."""


class TaskState(enum.Enum):
    QUEUED = "queued"
    SENT = "sent"
    STARTED = "started"
    DONE = "done"


class KillOrder(NamedTuple):
    """Why a task is being killed, and when that was decided: a task with one is the reaper's to
    report (its ``Done``, if one still comes, is ignored)."""

    cause: Literal["timeout", "killed", "memory"]
    at: float
    detail: str = ""


class Settling(Protocol):
    """What sets a resolved task's future (``_scheduling.Settler``)."""

    def settle(self, task: Task, outcome: Any) -> None:
        """Decode ``outcome`` and set the future (a settle thread; may run user code)."""
        ...

    def settle_now(self, task: Task, outcome: Any) -> bool:
        """Set the future here if that imports nothing and runs no user code (the monitor);
        ``False`` leaves it for :meth:`settle`."""
        ...


class Owner(Protocol):
    """What the hub asks of the executor scheduler that owns tasks and workers: its reports (lock
    held), and at interpreter exit :meth:`drain_at_exit` and :meth:`abort` (no lock held)."""

    def task_returned(self, task: Task, outcome: Any, *, pump: bool = True) -> list[Action]: ...

    def pump(self) -> list[Action]: ...

    def task_lost(self, task: Task, *, counted: bool = True) -> list[Action]: ...

    def task_failed(self, task: Task, error: BaseException) -> list[Action]: ...

    def worker_ready(self, worker: WorkerHandle) -> list[Action]: ...

    def worker_gone(
        self, worker: WorkerHandle, *, expected: bool, recycled: bool = False
    ) -> list[Action]: ...

    def worker_failed_to_start(
        self, worker: WorkerHandle, error: BaseException
    ) -> list[Action]: ...

    def drain_at_exit(self) -> None: ...

    def abort(self, reason: str) -> None: ...


_task_ids = itertools.count(1)


@dataclasses.dataclass(eq=False, slots=True, weakref_slot=True)
class Task:
    """One submitted call (or chunk of calls) and where it is.

    Slotted: one is made per task, and a 35-key instance dict (built by ``__init__``, traced by
    every garbage collection while the task lives) was the largest object of a task's warm path.
    """

    future: Future[Any]
    owner: Owner
    path: Literal["spawn", "fork"]
    calls: list[Call] | None  # fork path: run as they are in memory
    blob: bytes | None  # spawn path: pickled (fn, args)
    n: int
    chunked: bool
    timeout: float | None
    priority: float
    want_output: bool
    id: int = dataclasses.field(default_factory=lambda: next(_task_ids))
    state: TaskState = TaskState.QUEUED
    future_running: bool = False  # set_running_or_notify_cancel() done (the task was dispatched)
    cancel_notified: bool = False  # cancelled by the user, waiters notified (Scheduler.claim)
    requeues: int = 0
    worker: WorkerHandle | None = None
    sent_at: float | None = None
    started_at: float | None = None
    deadline: float | None = None
    kill_order: KillOrder | None = None
    cost_key: CostKey | None = None  # what its duration is predicted and recorded under
    cost_model: CostModel | None = None  # where its duration is recorded
    predicted_s: float = 0.0  # the model's estimate when it was submitted (whole chunk)
    ahead_s: float = 0.0  # sent ahead: the model's estimate then (0: unknown)
    memory_limit: int | None = None  # bytes its process group may hold (options(memory_limit=))
    lone: bool = False  # sent with nothing of its executor queued (Run.lone)
    memory_peak: int = (
        0  # the charge that passed memory_limit (set when its kill is ordered for it)
    )
    # Its timeline (time.monotonic()): sent_at and started_at above, and
    queued_at: float | None = None  # first enqueued
    done_at: float | None = None  # its Done message handled (the worker's result is here)
    decoded_at: float | None = None  # its outcome decoded, about to set the future
    settled_at: float | None = None  # about to set the future (callbacks run after)
    worker_pid: int = 0  # the process that returned its Done

    def sort_key(self) -> tuple[float, float, int]:
        """Higher priority first, then the longest predicted, then the oldest."""
        return (-self.priority, -self.predicted_s, self.id)

    def send_to(self, worker: WorkerHandle, now: float) -> None:
        self._move(TaskState.QUEUED, TaskState.SENT)
        self.worker = worker
        self.sent_at = now
        worker.outbox.append(self)  # written in this order, whichever thread writes

    def start(self, now: float) -> None:
        self._move(TaskState.SENT, TaskState.STARTED)
        self.started_at = now
        self.deadline = None if self.timeout is None else now + self.timeout

    def back_to_queue(self, *, counted: bool = True) -> None:
        """The worker died before the task started: it never ran. Not ``counted`` against
        the task: it was sent ahead, and the task before it ended the worker."""
        self._move(TaskState.SENT, TaskState.QUEUED)
        worker, self.worker = self.worker, None
        if worker is not None and self in worker.ahead:
            worker.ahead.remove(self)
        self.requeues += counted

    def close(self) -> bool:
        """Move to DONE and detach from the worker; ``False`` if it was DONE already."""
        if self.state is TaskState.DONE:
            return False
        self.state = TaskState.DONE
        worker, self.worker = self.worker, None
        if worker is not None and worker.task is self:
            worker.task = None
        if worker is not None and self in worker.ahead:
            worker.ahead.remove(self)
        return True

    def _move(self, frm: TaskState, to: TaskState) -> None:
        if self.state is not frm:
            raise InvalidTransition(f"task {self.id}: {self.state.value} -> {to.value}")
        self.state = to


WorkerState = Literal["starting", "idle", "busy", "dead"]


class WorkerHandle:
    """The parent's handle on one worker process (a loky worker, or a forked child)."""

    _ids = itertools.count(1)

    def __init__(
        self,
        kind: Literal["spawn", "fork", "template"],
        key: bytes,
        capture_path: str,
        *,
        device: str | None = None,
        idle_timeout_s: float | None = None,
        start: Literal["template", "interpreter"] = "interpreter",
        template_key: bytes = b"",
    ) -> None:
        self.id = next(self._ids)
        self.kind = kind
        self.key = key
        self.start = start  # spawn workers: forked from the warm template, or a fresh interpreter
        self.template_key = template_key  # the template that serves this kind (initializer)
        self.pending: list[WorkerHandle] = []  # templates: workers asked for, not yet forked
        self.children = 0  # templates: forked workers still alive
        self.forked_by: WorkerHandle | None = None  # spawn workers: the template that forked it
        self.capture_path = capture_path
        self.device = device
        self.idle_timeout_s = idle_timeout_s
        self.token = secrets.token_hex(8)
        self.state: WorkerState = "starting"
        self.since = time.monotonic()  # when it entered its state
        self.pid = 0
        self.conn: Any = None
        self.task: Task | None = None
        # Spawn workers: the tasks written to its socket behind ``task``, in the order it runs
        # them (docs/design.md, "Sending ahead"); the first becomes ``task`` when its Done
        # arrives.
        self.ahead: collections.deque[Task] = collections.deque()
        self.owner: Owner | None = None
        self.process: Any = None  # its loky Process (spawn workers): exit code, sentinel
        self.max_tasks: int | None = None  # spawn workers: max_tasks_per_child (it leaves after)
        self.tasks_run = 0  # spawn workers: tasks that returned a Done
        self.send_lock = threading.Lock()  # a send and the close of ``conn`` never overlap
        # Spawn workers: tasks decided for it (under the hub's lock) and not yet written. A task
        # sent ahead is decided by whichever thread pumps, and the one it goes behind may end
        # before that thread writes it; the monitor may then decide and write the next one
        # first. Each writer empties this in order (Hub.send), so the wire keeps the decided
        # order (tests/test_send_ahead.py).
        self.outbox: collections.deque[Task] = collections.deque()

    def __repr__(self) -> str:
        return f"<Worker {self.kind} #{self.id} pid={self.pid} {self.state}>"

    def ready(self, now: float) -> None:
        self._move(("starting",), "idle", now)

    def take(self, task: Task, now: float) -> None:
        self._move(("idle",), "busy", now)
        self.task = task

    def free(self, now: float) -> None:
        self._move(("busy",), "idle", now)
        self.task = None

    def die(self, now: float) -> bool:
        """Mark dead (from any state); ``False`` if it already was."""
        if self.state == "dead":
            return False
        self.state = "dead"
        self.since = now
        return True

    def is_dead(self) -> bool:
        return self.state == "dead"

    def idle_expired(self, now: float) -> bool:
        return (
            self.state == "idle"
            and self.idle_timeout_s is not None
            and now >= self.since + self.idle_timeout_s
        )

    def _move(self, frm: tuple[WorkerState, ...], to: WorkerState, now: float) -> None:
        if self.state not in frm:
            raise InvalidTransition(f"worker {self.id}: {self.state} -> {to}")
        self.state = to
        self.since = now


class Send(NamedTuple):
    """Write task ``task`` into the socket of ``worker`` (already marked busy with it)."""

    worker: WorkerHandle
    task: Task


class Fork(NamedTuple):
    """Fork a child for ``task`` (its slot is already counted)."""

    task: Task


class Launch(NamedTuple):
    """Start a process for ``worker`` (registered in state ``starting``)."""

    worker: WorkerHandle
    init_blob: bytes | None


class Settle(NamedTuple):
    """Decode ``outcome`` and set ``task``'s future, by ``settler`` (its scheduler's): on a
    settle thread, or where it is cheap and runs no user code, right away (``settle_now``)."""

    settler: Settling
    task: Task
    outcome: Any


class StopWorker(NamedTuple):
    """Ask a worker already marked dead to exit (``kill``: kill its process group)."""

    worker: WorkerHandle
    kill: bool


Action = Send | Fork | Launch | Settle | StopWorker


# ----------------------------------------------------------------------------------------------
# The warm templates' lifecycle, as decisions: which template serves a worker, when one starts,
# what its messages mean, when a kind falls back to fresh interpreters. (The template process
# itself, which runs the initializer and forks workers, is :mod:`._fork_server`.)
#
# A :class:`TemplateLifecycle` holds no socket and starts no process: the hub calls it with the
# hub's lock held, on whatever thread saw the event (a launch job, the monitor reading a
# template's message, the reaper), and the launcher (:class:`Launcher`) carries out the decisions
# it returns (:data:`Decision`) after the lock is released — start a process, send
# ``ForkWorker`` requests, watch a pid, fail a start. So every rule here can be tested by feeding
# it events (``tests/test_templates.py``).
#
# Lifecycle of the template of one worker kind (the key is the kind's pickled initializer)::
#
#     route(worker) ── none alive ──► new template, state starting: StartTemplate
#         │                           the worker waits in template.pending
#         ├── template starting ────► the worker waits in template.pending
#         └── template idle ────────► AskFork(template, [worker])
#     hello(template)          ──► AskFork(template, every worker pending)
#     init_failed(template)    ──► FailStart for every worker pending (the initializer fails in
#                                  every worker of the kind)
#     Forked(token, pid)       ──► the worker leaves pending, gets its pid: Watch(pid)
#     ForkRefused(token, why)  ──► the kind falls back for good: StartInterpreter for it and every
#                                  worker pending (Refused(why) the first time, to be logged)
#     Exited(pid, code)        ──► exit code kept for exit_code_of(); a worker still starting with
#                                  that pid died before hello: DiedStarting
#     gone(template)           ──► its pending workers are routed again (a new template); after
#                                  TEMPLATE_FAILURES_BEFORE_FALLBACK deaths with work pending (or
#                                  before its hello) the kind falls back to interpreters
#
# Timer rule: a template never idles out while a worker it forked lives or one waits for a fork
# (:meth:`TemplateLifecycle.holds`); otherwise it expires like any idle worker.

TEMPLATE_FAILURES_BEFORE_FALLBACK = 2
"""A template that dies this many times without serving a fork is given up for its kind:
workers of that kind then start as fresh interpreters."""

EXIT_CODES_KEPT = 10_000
"""Exit codes of template-forked workers kept until asked for; nobody asks for those of workers
stopped on purpose, so the oldest are dropped beyond this many."""


class StartTemplate(NamedTuple):
    """Register ``template`` (state starting) and start its interpreter."""

    template: WorkerHandle


class AskFork(NamedTuple):
    """Send ``template`` one ``ForkWorker`` request per worker of ``workers``."""

    template: WorkerHandle
    workers: list[WorkerHandle]


class StartInterpreter(NamedTuple):
    """Start ``worker`` as a fresh interpreter: its kind has no template."""

    worker: WorkerHandle


class Watch(NamedTuple):
    """A template forked process ``pid``: the guardian must kill it if the parent dies."""

    pid: int


class FailStart(NamedTuple):
    """``worker`` cannot start: ``error`` says why."""

    worker: WorkerHandle
    error: BaseException


class DiedStarting(NamedTuple):
    """``worker`` exited with ``code`` before it said hello."""

    worker: WorkerHandle
    code: int


class Refused(NamedTuple):
    """A kind fell back to interpreters for the first time, for ``reason`` (to be logged)."""

    reason: str


Decision = StartTemplate | AskFork | StartInterpreter | Watch | FailStart | DiedStarting | Refused


class TemplateLifecycle:
    """The warm template of each worker kind and the rules of their lifecycle (hub lock held)."""

    def __init__(self, new_capture_path: Callable[[], str]) -> None:
        self._new_capture_path = new_capture_path
        self.by_key: dict[bytes, WorkerHandle] = {}  # the live template of each kind
        self._refusals: dict[bytes, str] = {}  # kinds that start as interpreters, and why
        self._deaths: dict[bytes, int] = {}  # template deaths in a row, by kind
        self._exit_codes: dict[int, int] = {}  # template-forked workers' exit codes, by pid

    def refusal(self, key: bytes) -> str | None:
        """Why workers of kind ``key`` start as interpreters, or ``None``."""
        return self._refusals.get(key)

    def route(self, worker: WorkerHandle) -> list[Decision]:
        """How to start ``worker`` (``start="template"``): from its kind's template, starting
        one if none is alive, or as an interpreter once the kind has fallen back."""
        if worker.is_dead():
            return []
        key = worker.template_key
        if key in self._refusals:
            return [StartInterpreter(worker)]
        template = self.by_key.get(key)
        if template is not None and not template.is_dead():
            template.pending.append(worker)
            return [AskFork(template, [worker])] if template.state == "idle" else []
        template = WorkerHandle(
            "template",
            key,
            self._new_capture_path(),
            idle_timeout_s=worker.idle_timeout_s,
            template_key=key,
        )
        self.by_key[key] = template
        template.pending.append(worker)
        return [StartTemplate(template)]

    def hello(self, template: WorkerHandle) -> list[Decision]:
        """``template`` is ready: ask it for every worker waiting on it."""
        return [AskFork(template, list(template.pending))] if template.pending else []

    def init_failed(self, template: WorkerHandle, error: BaseException) -> list[Decision]:
        """``template``'s initializer raised: it would in every worker of the kind."""
        waiting, template.pending = template.pending, []
        return [FailStart(worker, error) for worker in waiting]

    def message(
        self,
        template: WorkerHandle,
        message: Forked | ForkRefused | Exited,
        starting: Mapping[str, WorkerHandle],
    ) -> list[Decision]:
        """A message from ``template``; ``starting``: the hub's workers not yet ready, by
        token."""
        if isinstance(message, Exited):
            return self._exited(template, message, starting)
        worker = starting.get(message.token)
        if worker is not None and worker in template.pending:
            template.pending.remove(worker)
        if isinstance(message, Forked):
            template.children += 1
            self._deaths.pop(template.key, None)
            if worker is not None:
                worker.pid = message.pid
                worker.forked_by = template
            return [Watch(message.pid)]
        first = template.key not in self._refusals
        self._refusals[template.key] = message.reason
        pending, template.pending = template.pending, []
        decisions: list[Decision] = [Refused(message.reason)] if first else []
        others = [w for w in (worker, *pending) if w is not None]
        return decisions + [StartInterpreter(w) for w in others]

    def _exited(
        self, template: WorkerHandle, message: Exited, starting: Mapping[str, WorkerHandle]
    ) -> list[Decision]:
        self._exit_codes[message.pid] = message.code
        if len(self._exit_codes) > EXIT_CODES_KEPT:
            self._exit_codes.pop(next(iter(self._exit_codes)))
        template.children = max(0, template.children - 1)
        return [DiedStarting(w, message.code) for w in starting.values() if w.pid == message.pid]

    def take_exit_code(self, pid: int) -> int | None:
        """The exit code its template reported for worker ``pid`` (once), if it did yet."""
        return self._exit_codes.pop(pid, None)

    def gone(self, template: WorkerHandle, *, said_hello: bool, relaunch: bool) -> list[Decision]:
        """``template`` ended (a forked worker never depends on it). Its pending workers are
        routed again when ``relaunch``; repeated deaths make the kind fall back."""
        self.forget(template)
        pending, template.pending = template.pending, []
        if not said_hello or pending:
            deaths = self._deaths.get(template.key, 0) + 1
            self._deaths[template.key] = deaths
            if deaths >= TEMPLATE_FAILURES_BEFORE_FALLBACK:
                self._refusals.setdefault(template.key, f"its warm template died {deaths} times")
        if not relaunch:
            return []
        return [decision for worker in pending for decision in self.route(worker)]

    def forget(self, template: WorkerHandle) -> None:
        """``template`` is dead: the next worker of its kind needs a new one."""
        if self.by_key.get(template.key) is template:
            del self.by_key[template.key]

    def drop_pending(self, worker: WorkerHandle) -> None:
        """``worker`` is dead before its template forked it: it never will be."""
        template = self.by_key.get(worker.template_key)
        if template is not None and worker in template.pending:
            template.pending.remove(worker)

    @staticmethod
    def holds(worker: WorkerHandle) -> bool:
        """The timer rule: a template lives while a worker it forked does, or one waits."""
        return worker.kind == "template" and bool(worker.children or worker.pending)

    def unused(self, in_use: set[bytes]) -> list[WorkerHandle]:
        """Templates of kinds no live worker came from, with nothing pending: only memory."""
        return [t for k, t in self.by_key.items() if k not in in_use and not t.pending]


# ----------------------------------------------------------------------------------------------
# The roster of worker processes: every worker of this process not yet dead, its socket, the
# ones still starting, and the idle pool of warm workers no executor holds.
#
# One :class:`WorkerRoster` per hub; every method runs with the hub's lock held. Taking a worker
# from the pool is one step (:meth:`WorkerRoster.take_pooled` pops it), so an idle expiry and a
# dispatch can never both have it; :meth:`WorkerRoster.forget` drops a worker from every list at
# once, also from the warm templates' lifecycle (:class:`TemplateLifecycle`).


class WorkerRoster:
    """Who is alive, reachable, starting or pooled (hub lock held; see the comment above the class).

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
        """Register a spawn worker in state ``starting``; a :class:`Launch` action
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


# ----------------------------------------------------------------------------------------------
# The monitor thread: one per process, it waits on the hub's listening socket, every worker
# socket, a wake pipe and the process sentinel of each worker still starting, and hands what it
# reads to the hub: messages (:meth:`Hub.dispatch`), ends of file and deaths before hello (its
# :class:`Reaper`), and the timers when one is due.
#
# Guarantees:
#
# * It is the only thread that closes worker sockets while it runs (:meth:`Monitor.close_conn`
#   queues a close for it from other threads; the socket's send lock keeps a send and a close
#   apart), so it never reads a socket whose fd was freed and reused under it.
# * One persistent ``poll`` set, synchronised with the live sockets each round and registered by
#   fd number. Not epoll: epoll watches open file descriptions, and a forked child holding a copy
#   of a socket the parent closed would keep firing events under an fd number that may belong to
#   a new socket by then.
# * A readable socket is read with one ``read`` for everything already in it (a quick task's
#   ``Started`` and ``Done`` arrive together), split into ``multiprocessing.connection`` frames
#   here; only a frame cut by the read is completed with blocking reads, as ``recv_bytes`` would.
#   (``Connection.poll()`` after each message would build a new selector each time.)
# * What the handlers leave for later (:meth:`Monitor.later`: the settles of a read's results)
#   runs once that read's messages are handled and its Runs written; a settle that woke a thread
#   then gives it the interpreter lock at once (``Settler.settle_now``), rather than after the
#   monitor's next round of bookkeeping. What is left for later outside a read runs just before
#   the next wait.
# * An error inside one round is logged and the loop goes on: the monitor never dies.

log = logging.getLogger("precompile_executor")

LONGEST_WAIT_S = 3600.0
"""The longest the monitor waits in one round: a task's deadline or an idle worker's expiry
years away would overflow the poll's timeout (epoll takes an int of milliseconds, ~24.8 days);
it wakes, finds nothing due, and waits again (``test_contract.py``,
``test_a_timeout_of_years_runs_its_task_and_the_monitor_keeps_its_round``)."""


class Monitor:
    """The monitor thread, its listening socket and wake pipe, the sockets not yet known."""

    def __init__(self, address: str, hub: Hub) -> None:
        self._hub = hub
        self._lock = hub.lock
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address)
        self.listener.listen(256)
        self.listener.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.unknown: list[Connection] = []  # accepted, no hello yet (lock held)
        self._to_close: list[tuple[Connection, threading.Lock]] = []  # (lock held)
        self._stopping = False
        self._later: list[tuple[Callable[..., None], tuple[Any, ...]]] = []  # its own thread's
        # Workers with Runs decided while this thread dispatches one read's messages: written
        # once they are all dispatched, one write per worker (its own thread's; Hub.run).
        self._unsent: dict[WorkerHandle, None] | None = None
        self._unpumped: dict[Owner, None] = {}  # owners to pump at the end of that read
        self._thread = threading.Thread(target=self._run, name="precompile-monitor", daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        """Whether the caller is the monitor thread."""
        return threading.get_ident() == self._thread.ident

    def later(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at the end of this round, just before the next wait (the monitor
        thread only: see :meth:`on_thread`)."""
        self._later.append((fn, args))

    def send_later(self, worker: WorkerHandle) -> bool:
        """While this thread dispatches the messages of one read, defer writing ``worker``'s
        ``Run`` messages to the end of it, so the tasks decided for it meanwhile go in one write;
        ``False``: not now, write them at once (this thread only: see :meth:`on_thread`)."""
        if self._unsent is None:
            return False
        self._unsent[worker] = None
        return True

    def pump_later(self, owner: Owner) -> bool:
        """While this thread dispatches the messages of one read, let ``owner`` decide what
        starts next once, after the last of them; ``False``: not now (this thread only)."""
        if self._unsent is None:
            return False
        self._unpumped[owner] = None
        return True

    def _run_later(self) -> None:
        while self._later:
            batch, self._later = self._later, []
            for fn, args in batch:
                try:
                    fn(*args)
                except BaseException:  # noqa: BLE001 - the monitor must never die
                    log.exception("precompile_executor monitor: unexpected error (continuing)")

    def private_fds(self) -> list[int]:
        """Descriptors a forked child must close at once."""
        return [self.listener.fileno(), self._wake_r, self._wake_w]

    def wake(self) -> None:
        """Make the monitor recompute its deadlines and the sockets it waits on."""
        if write_now(self._wake_w, b"x") is None:  # full (a wake is pending), or no libc
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"x")

    def close_conn(self, conn: Connection, send_lock: threading.Lock) -> None:
        """Close a worker socket now on the monitor's own thread (or once it stopped), else
        queue it for the monitor: closing one it may be polling would free the fd number for
        reuse under its feet."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            with send_lock, contextlib.suppress(OSError):
                conn.close()
            return
        with self._lock:
            self._to_close.append((conn, send_lock))
        self.wake()

    def stop(self) -> None:
        """End the thread, then close what it left: sockets never known, queued closes, the
        listener."""
        self._stopping = True
        self.wake()
        self._thread.join(timeout=5.0)  # no reads in flight from here on
        with self._lock:
            unknown, self.unknown = self.unknown, []
            to_close, self._to_close = self._to_close, []
        for conn, send_lock in to_close:
            with send_lock, contextlib.suppress(OSError):
                conn.close()
        for conn in unknown:
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(OSError):
            self.listener.close()

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        selector = selectors.PollSelector()
        selector.register(self.listener.fileno(), selectors.EVENT_READ, "listener")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        watched: dict[Any, int] = {}  # a worker socket, or a starting worker (its sentinel)
        while not self._stopping:
            try:
                self._round(selector, watched)
            except BaseException:  # noqa: BLE001 - the monitor must never die: log and go on
                log.exception("precompile_executor monitor: unexpected error (continuing)")
                time.sleep(0.01)
        self._run_later()  # nothing left behind when it stops
        for fd in watched.values():
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(fd)
        selector.close()

    def _round(self, selector: selectors.BaseSelector, watched: dict[Any, int]) -> None:
        hub = self._hub
        with self._lock:
            live = hub.roster.watch_list()
            if self.unknown:
                live.update(dict.fromkeys(self.unknown))
            to_close, self._to_close = self._to_close, []
            timeout = hub.next_timer()
        if timeout is not None:  # a deadline years away: wake sooner and look again
            timeout = min(timeout, LONGEST_WAIT_S)
        due = None if timeout is None else time.monotonic() + timeout
        if live.keys() != watched.keys():  # most rounds: the same sockets as the last one
            self._resync(selector, watched, live)
        for conn, send_lock in to_close:  # unregistered by now (no longer live): safe to close
            with send_lock, contextlib.suppress(OSError):
                conn.close()
        self._run_later()  # the last thing before the wait (see above the class)
        for key, _ in selector.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "wake":
                if read_now(self._wake_r, 4096) is None:
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.read(self._wake_r, 4096)
            elif isinstance(key.data, WorkerHandle):
                hub.reaper.died_starting(key.data)
            else:
                self._readable(key.data, key.fd)
        # Nothing falls due before ``due`` (what is set meanwhile is timed next round).
        if due is not None and time.monotonic() >= due:
            hub.check_timers()

    @staticmethod
    def _resync(
        selector: selectors.BaseSelector, watched: dict[Any, int], live: dict[Any, int | None]
    ) -> None:
        """Make the poll set (``watched``) what ``live`` says."""
        for key in [k for k in watched if k not in live]:
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(watched[key])
            del watched[key]
        for key, fd in live.items():
            if key in watched:
                continue
            try:
                fd = key.fileno() if fd is None else fd
                selector.register(fd, selectors.EVENT_READ, key)
            except (KeyError, ValueError, OSError):
                continue  # closed meanwhile: its end is handled elsewhere
            watched[key] = fd

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, OSError):
                return
            sock.setblocking(True)
            with self._lock:
                self.unknown.append(Connection(sock.detach()))

    def _readable(self, conn: Connection, fd: int) -> None:
        try:
            frames, ended = read_frames(fd)
        except OSError:  # a closed socket: the end
            frames, ended = [], True
        self._unsent = {}
        try:
            for frame in frames:
                try:
                    message = decode(frame)
                except ValueError:  # a garbled stream: the end (what came before it counts)
                    ended = True
                    break
                self._hub.dispatch(conn, message)
                if conn.closed:
                    return  # a handler closed it (a worker stopped while it started)
        finally:
            while self._unpumped:
                owners, self._unpumped = self._unpumped, {}
                for owner in owners:
                    self._hub.pump(owner)
            unsent, self._unsent = self._unsent, None
            for worker in unsent:
                self._hub.send(worker)
        # This read's settles: after its Runs are written, before the next round's bookkeeping
        # (a settle that woke a thread then hands it the interpreter lock: Settler.settle_now).
        self._run_later()
        if ended:
            self._hub.reaper.eof(conn)


# ----------------------------------------------------------------------------------------------
# The launcher: starts worker processes — a spawn worker forked from its kind's warm template, or
# a fresh interpreter started by loky; the templates themselves — carries out what the templates'
# lifecycle decides (:class:`TemplateLifecycle`), and finds the exit codes of dead workers.
#
# Spawn workers are started by loky's process backend — one loky ``Process`` per worker, a fresh
# interpreter (fork + exec) fed with cloudpickle — not by a loky executor: an executor breaks as a
# whole, and kills its other workers, when any one dies (docs/design.md, "Why one loky Process per
# worker"). Each worker runs :func:`._worker.serve` (a template
# :func:`._fork_server.serve_template`), which connects back to the hub's Unix socket; a process
# loky started ends without the interpreter's teardown (:func:`._worker.end_interpreter`).
#
# :class:`Launcher` runs on the job pool (``launch``) and on the monitor thread (a template's
# messages, its end); it decides under the hub's lock and starts, sends and logs after releasing
# it.

_LOKY = get_context("loky")
"""loky's start method: a fresh interpreter (fork + exec), arguments pickled with cloudpickle."""

THREAD_LIMIT_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
"""Set to 1 in every worker (unless the caller set them): one worker per core should not start
a BLAS/OpenMP thread pool of its own (loky's executors limit them likewise), and an imported
numpy or torch then leaves a template single-threaded, so it can fork."""

FORK_FRIENDLY_ENV = {
    # torch.cuda.is_available() (which `import torch._inductor`, and so `import helion`, calls)
    # asks NVML instead of the CUDA runtime: PyTorch's documented way to keep a process
    # forkable. It still leaves the driver's idle thread, which fork_safety() accepts; after a
    # runtime count torch refuses CUDA in forked children (tests/test_gpu.py, docs/gpu-runs.md).
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    # pyarrow (imported by pandas, which some compile stacks import) starts a jemalloc
    # background thread on import unless told not to: this removes that thread
    # (tests/test_contract.py).
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}
"""Set in every worker and template (unless the caller set them), so that common imports leave
fewer native threads in a template that must fork (docs/design.md, "Warm templates")."""


class Launcher:
    """Starts spawn workers and templates for the hub (see the comment above)."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self.templates = hub.roster.templates

    def launch(self, worker: WorkerHandle, init_blob: bytes | None) -> None:
        """Start a spawn worker (job pool): forked from its kind's warm template, or as a
        fresh interpreter."""
        if worker.start != "template":
            self._start_process(worker, serve_interpreter, init_blob)
            return
        with self._hub.lock:
            if self._hub.closed:
                return
            decisions = self.register_new_templates(self.templates.route(worker))
        self.carry_out(decisions, inline=True)

    def register_new_templates(self, decisions: list[Decision]) -> list[Decision]:
        """Register the templates ``decisions`` start (lock held), in the same step that decided
        them; return ``decisions``."""
        for decision in decisions:
            if isinstance(decision, StartTemplate):
                self._hub.roster.register_starting(decision.template)
        return decisions

    def carry_out(self, decisions: list[Decision], *, inline: bool = False) -> None:
        """Carry out the templates' decisions (no lock held); process starts run here when
        ``inline`` (a job thread), else on the job pool."""
        hub = self._hub
        for decision in decisions:
            if isinstance(decision, StartTemplate):
                log.debug("starting a warm template for a worker kind")
                self._start(decision.template, serve_template, inline)
            elif isinstance(decision, StartInterpreter):
                self._start(decision.worker, serve_interpreter, inline)
            elif isinstance(decision, AskFork):
                self._ask_fork(decision.template, decision.workers)
            elif isinstance(decision, Watch):
                hub.guardian.watch(decision.pid)
            elif isinstance(decision, FailStart):
                hub.reaper.start_failed(decision.worker, decision.error)
            elif isinstance(decision, DiedStarting):
                hub.reaper.start_failed(decision.worker, died_early(decision.worker, decision.code))
            elif isinstance(decision, Refused):
                log.warning(
                    "workers of this kind start as fresh interpreters, not from a warm "
                    "template: %s",
                    decision.reason,
                )

    def template_gone(self, template: WorkerHandle, *, said_hello: bool) -> None:
        """A template ended: its pending workers start again (a new template, or after repeated
        deaths, fresh interpreters); a forked worker never depends on its template."""
        with self._hub.lock:
            decisions = self.templates.gone(
                template, said_hello=said_hello, relaunch=not self._hub.closed
            )
            self.register_new_templates(decisions)
        self.carry_out(decisions)

    def exit_code_of(self, worker: WorkerHandle, timeout_s: float = 5.0) -> int | None:
        """A dead spawn worker's exit code (negative: the signal), waiting ``timeout_s`` at most:
        from loky's process, or as its template reports it."""
        process = worker.process
        if process is not None:
            process.join(timeout_s)
            code: int | None = process.exitcode
            return code
        if worker.start != "template" or not worker.pid:
            return None
        end = time.monotonic() + timeout_s
        with self._hub.lock:
            while (code := self.templates.take_exit_code(worker.pid)) is None:
                left = end - time.monotonic()
                template = worker.forked_by
                # A template reports its children's ends before its own (one socket, in order):
                # once it is dead, nobody will report this one.
                if left <= 0 or (template is not None and template.is_dead()):
                    return None
                self._hub.changed.wait(left)
            return code

    def _start(self, worker: WorkerHandle, target: Any, inline: bool) -> None:
        init_blob = worker.template_key or None  # a kind's key is its pickled initializer
        if inline:
            self._start_process(worker, target, init_blob)
        else:
            self._hub.submit_job(self._start_process, worker, target, init_blob)

    def _ask_fork(self, template: WorkerHandle, workers: list[WorkerHandle]) -> None:
        with self._hub.lock:
            template.since = time.monotonic()
        with template.send_lock:
            conn = template.conn
            for worker in workers:
                try:
                    if conn is None or conn.closed:
                        raise OSError("template socket closed")
                    request = ForkWorker(
                        worker.token, worker.capture_path, worker.device, worker.max_tasks
                    )
                    conn.send_bytes(encode(request))
                except (OSError, ValueError):
                    pass  # the template is dying: its end of file relaunches what it held

    def _start_process(self, worker: WorkerHandle, target: Any, init_blob: bytes | None) -> None:
        """Start a fresh interpreter (loky) running ``target`` for ``worker``."""
        hub = self._hub
        try:
            with hub.lock:
                if hub.closed or worker.is_dead():
                    return
            env = {v: "1" for v in THREAD_LIMIT_VARS if v not in os.environ}
            env.update({k: v for k, v in FORK_FRIENDLY_ENV.items() if k not in os.environ})
            if worker.device is not None:
                # Set before the interpreter starts, so CUDA only ever sees this one device.
                env["CUDA_VISIBLE_DEVICES"] = env["PRECOMPILE_EXECUTOR_DEVICE"] = worker.device
            process = _LOKY.Process(
                target=target,
                args=(
                    Startup(
                        hub.address, worker.token, worker.capture_path, init_blob, worker.max_tasks
                    ),
                ),
                name=f"precompile-{worker.kind}-{worker.id}",
                env=env,
            )
            process.start()
            hub.guardian.watch(process.pid)  # from birth: a parent killed now leaves no orphan
            with hub.lock:
                worker.process = process
                worker.pid = process.pid
                gone = hub.closed or worker.is_dead()
        except BaseException as exc:  # noqa: BLE001 - report as a failed start
            hub.reaper.start_failed(worker, exc)
            return
        if gone:  # stopped (or the hub closed) while it was starting
            _process.kill_group(worker.pid, grace_s=0)
            hub.reaper.retire(worker)
            return
        hub.wake()  # watch its sentinel from now on


def died_early(worker: WorkerHandle, code: int | None) -> WorkerStartError:
    """The error of a worker that exited before it said hello."""
    return WorkerStartError(
        f"worker pid {worker.pid} exited (code {code}) before it was ready; its output:\n"
        f"{read_capture_file(worker.capture_path)[-2000:]}"
    )


# ----------------------------------------------------------------------------------------------
# The reaper: a worker's end — its socket's end of file, reaping the process and reporting the
# task it had started, a failed start, retiring a dead worker's resources, stopping a worker.
#
# :class:`Reaper` runs on the monitor thread (an end of file, a death before hello) and on the job
# pool (reaping, stopping); the module's docstring says which thread runs what. A dead worker's
# socket is closed only on the monitor's thread (:meth:`Monitor.close_conn`).


class Reaper:
    """How a worker's end is noticed and cleaned up (see the comment above)."""

    def __init__(self, hub: Hub) -> None:
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
            for ahead in list(worker.ahead):
                if ahead.state is TaskState.SENT:
                    # Sent behind the worker's task: the worker died of that task, not of these.
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


# ----------------------------------------------------------------------------------------------
# The hub: one per process, it holds the parts above and runs the schedulers' actions.

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
        meanwhile; on the monitor, they wait for the end of the read that brought them
        (:meth:`Monitor.later`) (docs/design.md, "Per-task overhead")."""
        if self.memory.pending:
            self.memory.start_pending()
        wake = False
        settles: list[Settle] = []
        on_monitor = None
        for action in actions:
            if isinstance(action, Send):
                if on_monitor is None:
                    on_monitor = self.monitor.on_thread()
                if not (on_monitor and self.monitor.send_later(action.worker)):
                    self.send(action.worker)
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
        if on_monitor if on_monitor is not None else self.monitor.on_thread():
            self.monitor.later(self._carry_settles, settles)
        else:
            self._carry_settles(settles)

    def _carry_settles(self, settles: list[Settle]) -> None:
        for settle in settles:
            # A plain result with no user callback is settled right here (on the monitor: no
            # hand-off); anything else on a settle thread.
            if not settle.settler.settle_now(settle.task, settle.outcome):
                self._settle(settle)

    def _settle(self, settle: Settle) -> None:
        try:
            self._settlers.submit(settle.settler.settle, settle.task, settle.outcome)
        except RuntimeError:  # the settle pool is shut down (or exit is near): do it here
            settle.settler.settle(settle.task, settle.outcome)

    def send(self, worker: WorkerHandle) -> None:
        """Write the ``Run`` of every task decided for ``worker`` and not yet written, in the
        order decided (``WorkerHandle.outbox``), in one write: another thread may hold the
        ``Send`` of an earlier one, and whoever takes the send lock first writes them all."""
        with worker.send_lock:
            outbox = worker.outbox
            if not outbox:
                return
            tasks = [outbox.popleft() for _ in range(len(outbox))]
            self._write_runs(worker, tasks)

    @staticmethod
    def _write_runs(worker: WorkerHandle, tasks: list[Task]) -> None:
        """``tasks``' ``Run`` messages on the socket (``worker.send_lock`` held)."""
        messages = []
        for task in tasks:
            assert task.blob is not None
            messages.append(encode(Run(task.id, task.n, task.want_output, task.blob, task.lone)))
        if log.isEnabledFor(logging.DEBUG):
            ids = [task.id for task in tasks]
            log.debug("tasks %s on the spawn path, worker pid %d", ids, worker.pid)
        conn = worker.conn
        try:
            if conn is None or conn.closed:
                raise OSError("socket closed")
            send_frames(conn.fileno(), messages)  # send_bytes' bytes
        except (OSError, ValueError):
            # The worker is dying; its end of file (read by the monitor) puts the tasks, which
            # never started, back in the queue.
            log.debug("worker pid %d gone before the send", worker.pid)

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
        if self.memory.pending:
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

    def pump(self, owner: Owner) -> None:
        """Let ``owner`` dispatch what may start now, and carry it out (no lock held)."""
        with self.lock:
            actions = owner.pump()
        self.run(actions)

    def _repump(self, scheduler: Any) -> None:
        """Memory may have freed: let ``scheduler``'s queue go on (memory watcher, no lock)."""
        self.pump(scheduler)

    # -- what the monitor reads (the monitor thread) -------------------------------------------

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
        if self.memory.pending:
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
            # On the monitor amid one read's messages, the owner pumps once after the last.
            later = self.monitor.pump_later(task.owner)
            actions += task.owner.task_returned(task, (message, worker.pid), pump=not later)
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
