"""Tasks and worker handles: explicit states, guarded transitions, and the actions they lead to.

Every field here is read and written with the hub's lock held (one lock for the hub and every
executor scheduler: a task's state and its worker's state always change together).

Task states::

    QUEUED ──dispatch──► SENT ──worker's Started──► STARTED ──Done / death / kill──► DONE
      │  ▲                 │                                                        ▲
      │  └──worker died before Started (never ran: queued again under its first key) │
      └──cancelled, or the executor broke ─────────────────────────────────────────┘

A task reaches DONE exactly once, in :meth:`Task.close` — whoever closes it settles its future;
nobody else touches the future (``future.cancel()`` of a queued task by the user is the one
exception, which the stdlib owns). A forked task is STARTED as soon as ``fork()`` returns.

Worker states::

    starting ──Hello──► idle ◄──► busy      any state ──► dead

A busy spawn worker may also hold one task sent *ahead* (``WorkerHandle.ahead``, SENT): written
to its socket behind its task, it becomes the worker's task when that task's ``Done`` arrives.

Only :class:`WorkerHandle`'s methods change a worker's state, and each checks where it comes
from; an illegal transition raises :class:`InvalidTransition` (a bug, never a user error).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import secrets
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

if TYPE_CHECKING:
    from ._costs import CostKey, CostModel
    from ._worker import Call


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


class Owner(Protocol):
    """What the hub asks of the executor scheduler that owns tasks and workers: its reports (lock
    held), and at interpreter exit :meth:`drain_at_exit` and :meth:`abort` (no lock held)."""

    def task_returned(self, task: Task, outcome: Any) -> list[Action]: ...

    def settle(self, task: Task, outcome: Any) -> None: ...

    def settle_now(self, task: Task, outcome: Any) -> bool: ...

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
    cost: CostKey | None = None  # what its duration is predicted and recorded under
    costs: CostModel | None = None  # where its duration is recorded
    predicted_s: float = 0.0  # the model's estimate when it was submitted (whole chunk)
    memory_limit: int | None = None  # bytes its process group may hold (options(memory_limit=))
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
        if worker is not None and worker.ahead is self:
            worker.ahead = None
        self.requeues += counted

    def close(self) -> bool:
        """Move to DONE and detach from the worker; ``False`` if it was DONE already."""
        if self.state is TaskState.DONE:
            return False
        self.state = TaskState.DONE
        worker, self.worker = self.worker, None
        if worker is not None and worker.task is self:
            worker.task = None
        if worker is not None and worker.ahead is self:
            worker.ahead = None
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
        # Spawn workers: the task written to its socket behind ``task``, to start when ``task``
        # is done (docs/design.md, "Sending ahead"); it becomes ``task`` when that Done arrives.
        self.ahead: Task | None = None
        self.owner: Owner | None = None
        self.process: Any = None  # its loky Process (spawn workers): exit code, sentinel
        self.max_tasks: int | None = None  # spawn workers: max_tasks_per_child (it leaves after)
        self.tasks_run = 0  # spawn workers: tasks that returned a Done
        self.send_lock = threading.Lock()  # a send and the close of ``conn`` never overlap
        # Spawn workers: tasks decided for it (under the hub's lock) and not yet written. A task
        # sent ahead is decided by whichever thread pumps, and the one it goes behind may end
        # before that thread writes it; the monitor may then decide and write the next one
        # first. Each writer empties this in order (Hub._send), so the wire keeps the decided
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
    """Decode ``outcome`` and set ``task``'s future: on a settle thread, or where it is cheap
    and runs no user code, right away (``Owner.settle_now``)."""

    task: Task
    outcome: Any


class StopWorker(NamedTuple):
    """Ask a worker already marked dead to exit (``kill``: kill its process group)."""

    worker: WorkerHandle
    kill: bool


Action = Send | Fork | Launch | Settle | StopWorker
