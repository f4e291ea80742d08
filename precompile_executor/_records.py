"""The immutable records an executor hands back: a task's value with its output, a task's
timeline, and a snapshot of the executor's counters. Plain frozen dataclasses, no behaviour, so
every layer (the scheduler that fills them, the facades that return them) can import them; and the
:class:`Settings` an executor is built with."""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal, Protocol

from ._errors import Classification, TaskTimeoutError, WorkerCrashedError

DEFAULT_IDLE_TIMEOUT_S = 600.0
"""Idle workers stay warm this long: an autotuner benchmarks for minutes between compile
batches, and a restart costs an interpreter plus its imports (docs/design.md, "Process
lifecycle")."""

DEFAULT_START: Literal["template", "interpreter"] = "template"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one executor was built with, validated by the facade (``PrecompileExecutor``).

    Attributes:
        max_workers: most tasks in flight at once, both paths together.
        init_blob: cloudpickled ``(initializer, initargs)``, or ``None``; also the pool key.
        idle_timeout_s: seconds an idle worker stays; ``None``: until exit.
        classify: maps a task's exception to its classification.
        ignore_errors: classify every failure as ``"debug"``.
        devices: GPUs to pin spawn workers to (``CUDA_VISIBLE_DEVICES``), or ``None``.
        spare_workers: extra started workers kept idle in the hub's pool.
        start: ``"template"`` or ``"interpreter"``.
        cost_history: the JSON file of observed durations, or ``None`` (in memory only).
        max_tasks_per_child: a spawn worker leaves after this many tasks; ``None``: never.
    """

    max_workers: int
    init_blob: bytes | None = None
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S
    classify: Callable[[BaseException], Classification] | None = None
    ignore_errors: bool = False
    devices: tuple[str, ...] | None = None
    spare_workers: int = 0
    start: Literal["template", "interpreter"] = DEFAULT_START
    cost_history: str | os.PathLike[str] | None = None
    max_tasks_per_child: int | None = None


TIMELINE_LIMIT = 10_000
"""Timeline records an executor keeps (about 200 bytes each); older ones are dropped."""


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """What a task returns under ``executor.options(with_output=True)``.

    Attributes:
        value: the task's return value.
        output: what it wrote to stdout and stderr (fd level, so C code too).
        worker_pid: the process that ran it.
        elapsed_s: seconds from its start on the worker to its result.
    """

    value: Any
    output: str
    worker_pid: int
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class TaskTimeline:
    """When one settled task passed each step, from :meth:`PrecompileExecutor.timeline`.

    Times are ``time.monotonic()`` seconds in the caller's process; a step the task never
    reached (a task that failed before it started) is ``None``.

    Attributes:
        task_id: the executor's id of the task (submission order).
        function: what its cost is recorded under (``module:qualname``, ``triton:<kernel>``).
        features: what described the call (its history key; ``""``: nothing).
        path: ``"spawn"`` or ``"fork"``.
        worker_pid: the process that ran it (0 if none returned it).
        calls: calls in the task (``map(chunksize=n)`` sends n).
        predicted_s: its predicted duration when it was queued (0: nothing was known).
        ok: whether its future got a value (not an exception).
        queued: submitted to the queue.
        sent: written to a worker (or forked).
        started: the worker's ``Started`` arrived; the in-worker clock starts.
        done: the worker's ``Done`` was handled (its result is in this process).
        decoded: the result was unpickled (or the error rebuilt).
        settled: the future was set (its done-callbacks run right after: for a Triton compile,
            installing the artifacts, see ``CompileJob.installed_at``).
        future: the task's future (to join with other records) while the caller still holds it,
            else ``None``: the timeline holds it weakly, so it never keeps a result alive.
    """

    task_id: int
    function: str
    features: str
    path: str
    worker_pid: int
    calls: int
    predicted_s: float
    ok: bool
    queued: float | None
    sent: float | None
    started: float | None
    done: float | None
    decoded: float | None
    settled: float | None
    future_ref: weakref.ref[Future[Any]] = dataclasses.field(repr=False, compare=False)

    @property
    def future(self) -> Future[Any] | None:
        return self.future_ref()

    @property
    def run_s(self) -> float | None:
        """Seconds in the worker (``started`` to ``done``): what the cost model records."""
        if self.started is None or self.done is None:
            return None
        return self.done - self.started


@dataclasses.dataclass(frozen=True)
class TaskCounts:
    """What every backend's ``statistics()`` snapshot says about its tasks; each backend's
    snapshot adds its own fields (workers, nodes).

    Attributes:
        queued: tasks waiting to be sent (their futures are PENDING).
        running: tasks on a worker now (on the dask backend: started on a node).
        completed: tasks that returned a value.
        failed: tasks that raised, timed out or crashed.
        cancelled: tasks cancelled before they started.
        timed_out: failed tasks that ran past their timeout.
        crashed: failed tasks whose worker died (on the dask backend: or whose node was lost).
    """

    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int
    timed_out: int
    crashed: int


@dataclasses.dataclass(frozen=True)
class ExecutorStatistics(TaskCounts):
    """An immutable snapshot of one executor's state, from :meth:`PrecompileExecutor.statistics`:
    the :class:`TaskCounts`, and

    Attributes:
        workers_alive: worker processes this executor holds (warm spawn workers and live forks).
        worker_restarts: workers replaced after a crash or a timeout kill.
        spawn_tasks: tasks started on the spawn path (warm pool).
        fork_tasks: tasks started on the fork path.
        start: how this executor's spawn workers start: ``"template"`` or ``"interpreter"``
            (``"interpreter"`` also when the template was found unsafe to fork).
        start_note: why workers asked to start from a template start as interpreters (the
            template's refusal: e.g. the threads the initializer left running), else ``None``.
        memory_killed: failed tasks whose process group passed their ``memory_limit``.
        waiting_for_memory: queued tasks that would run now (a slot is free) but wait for
            memory: the running tasks with limits, counted at their limits, leave too little.
        memory_reserved: bytes reserved by the running tasks with limits of every executor in
            the process (Σ limit), what admission counts against.
        sent_ahead: tasks written to a busy worker behind a task predicted to end soon, so
            that it starts them without waiting for this process (docs/design.md, "Sending
            ahead"); each counts as ``queued`` until its worker takes it, then as ``running``
            (which never exceeds ``max_workers``).
    """

    workers_alive: int
    worker_restarts: int
    spawn_tasks: int
    fork_tasks: int
    start: str = "template"
    start_note: str | None = None
    memory_killed: int = 0
    waiting_for_memory: int = 0
    memory_reserved: int = 0
    sent_ahead: int = 0


class OutcomeCounters(Protocol):
    """A backend's outcome counters (the mutable side of :class:`TaskCounts`)."""

    completed: int
    failed: int
    timed_out: int
    crashed: int


def count_outcome(counts: OutcomeCounters, error: BaseException | None) -> None:
    """Count one resolved task, by the one rule every backend's statistics use (lock held)."""
    if error is None:
        counts.completed += 1
        return
    counts.failed += 1
    if isinstance(error, TaskTimeoutError):
        counts.timed_out += 1
    elif isinstance(error, WorkerCrashedError):
        counts.crashed += 1
