"""Settling: a closed task's outcome decoded, classified, recorded and set on its future.

:meth:`Settling.settle` runs on a settle-pool thread; :meth:`Settling.settle_now` on the monitor,
when every call returned plain data and no callback but the library's own is attached
(:func:`own_callback`): nothing it runs can block the monitor (docs/design.md, "Threads: who owns
what"). Nothing else sets a task's future. Each settled task leaves a row in its executor's
:class:`Timeline`; when the executor has nothing left to do, the settle that noticed writes the
cost models' history files (on a job thread when it settled on the monitor).

:class:`Settling` is the settle half of :class:`._core.Core`: its attributes are the core's,
set by ``Core.__init__`` and guarded by the hub's lock.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import cloudpickle

from ._costs import CostModel
from ._errors import (
    Classification,
    RemoteError,
    TaskMemoryError,
    proxy_from_record,
    unpickle_error,
)
from ._messages import Done
from ._records import ExecutorStatistics, TaskResult, TaskTimeline, count_outcome
from ._staff import Staffing
from ._state import Task

log = logging.getLogger("precompile_executor")

TIMELINE_LIMIT = 10_000
"""Timeline records an executor keeps (about 200 bytes each); older ones are dropped."""

OWN_CALLBACK = "_precompile_executor_own"
"""The attribute that marks a done-callback as the library's own (:func:`own_callback`)."""

_F = TypeVar("_F", bound=Callable[..., Any])


def own_callback(fn: _F) -> _F:
    """Mark ``fn`` as a done-callback the library attaches itself: quick, takes no lock held
    across a wait, runs no user code — so a future carrying only such callbacks may be set on
    the monitor (:meth:`Settling.settle_now`; tests/test_settle.py pins which ones a future
    carries). Marks the function; its bound methods and ``functools.partial`` of it count too."""
    setattr(fn, OWN_CALLBACK, True)
    return fn


def user_callbacks(future: Future[Any]) -> bool:
    """Whether ``future`` carries a done-callback that is not the library's own."""
    # ``_done_callbacks`` is the stdlib Future's list (3.11-3.14); read, never changed here.
    for callback in future._done_callbacks:  # type: ignore[attr-defined]
        fn = callback.func if isinstance(callback, functools.partial) else callback
        if not getattr(fn, OWN_CALLBACK, False):
            return True
    return False


def classification(
    exc: BaseException,
    hook: Callable[[BaseException], Classification] | None,
    ignore_errors: bool,
    default: Classification = "raise",
) -> Classification:
    """The one classification rule: ``"debug"`` under ``ignore_errors``; else the ``classify``
    hook's verdict (``"raise"`` if it raises or answers something else); ``default`` without
    a hook."""
    if ignore_errors:
        return "debug"
    if hook is None:
        return default
    try:
        verdict = hook(exc)
    except Exception:  # noqa: BLE001 - a broken hook must not lose the task's error
        log.exception("the classify hook raised; treating the error as 'raise'")
        return "raise"
    return verdict if verdict in ("raise", "warn", "debug") else "raise"


class Settling(Staffing):
    """The settle path of an executor's core (no lock held on entry; see the module doc), and
    the snapshots of what it recorded."""

    # Set by ``Core.__init__``; guarded by ``lock`` (the hub's).
    classify: Callable[[BaseException], Classification] | None
    ignore_errors: bool
    timeline: Timeline
    learned: set[CostModel]
    saving: int
    unsettled: int
    memory_killed: int
    completed: int
    failed: int
    timed_out: int
    crashed: int
    cancelled: int
    spawn_tasks: int
    fork_tasks: int
    memory_blocked: bool

    def busy(self) -> bool:
        raise NotImplementedError  # Core's: anything queued, in flight, unsettled or saving

    def settle(self, task: Task, outcome: Any) -> None:
        """Decode ``outcome`` and set ``task``'s future; never raises (a settle thread)."""
        ok, value = self._decoded(task, outcome)
        self._recorded(task, ok, value)
        self._set_and_finish(task, ok, value)

    def settle_now(self, task: Task, outcome: Any) -> bool:
        """Settle ``task`` on this thread (the monitor's) when that imports nothing and runs no
        user code: every call returned plain data (``Done.plain``), no output was asked for,
        and the future has no done-callback but the executor's own. ``False``: nothing done,
        the caller hands it to a settle thread (docs/design.md, "Threads: who owns what")."""
        done = outcome[0] if isinstance(outcome, tuple) else None
        future = task.future
        if not (isinstance(done, Done) and done.plain) or task.want_output:
            return False
        if user_callbacks(future):
            return False
        ok, value = self._decoded(task, outcome)
        self._recorded(task, ok, value)
        # Under the future's own lock (an RLock; set_result takes it again): a done-callback
        # added meanwhile waits for it, then sees the future done and runs on its adder's
        # thread. Only the executor's own callback (no lock, nothing slow) runs here.
        with future._condition:
            late = user_callbacks(future)
            if not late:
                self._set(task, ok, value)
        if late:  # added between the two checks: its callback must not run on the monitor
            self.hub.submit_job(self._set_and_finish, task, ok, value)
            return True
        save = self._finished(task)
        if save:
            self.hub.submit_job(self._save, save)
        return True

    def _decoded(self, task: Task, outcome: Any) -> tuple[bool, Any]:
        try:
            ok, value = self._decode(task, outcome)
        except BaseException as exc:  # noqa: BLE001 - e.g. SystemExit from a result's __reduce__
            ok, value = False, self._error(unpickle_error(exc))
        task.decoded_at = time.monotonic()
        return ok, value

    def _recorded(self, task: Task, ok: bool, value: Any) -> None:
        with self.lock:
            # Recorded before the future is set, so whoever waited on it finds its record.
            task.settled_at = time.monotonic()
            self.timeline.add(task, ok)
            count_outcome(self, None if ok else value)
            if not ok and isinstance(value, TaskMemoryError):
                self.memory_killed += 1

    @staticmethod
    def _set(task: Task, ok: bool, value: Any) -> None:
        try:
            if ok:
                task.future.set_result(value)
            else:
                task.future.set_exception(value)
        except BaseException:  # noqa: BLE001 - a done-callback's error is the stdlib's to log
            log.exception("setting a future raised")

    def _set_and_finish(self, task: Task, ok: bool, value: Any) -> None:
        try:
            self._set(task, ok, value)
        finally:
            save = self._finished(task)
            if save:
                self._save(save)

    def _finished(self, task: Task) -> list[CostModel]:
        """The future is set: count it settled; the cost models to save if the executor has
        nothing left to do (lock taken here)."""
        with self.lock:
            self.unsettled -= 1
            save: list[CostModel] = []
            if self.learned and not self.busy():
                # A model without a history file has nothing to write: no job for it.
                save = [model for model in self.learned if model.path is not None]
                self.learned = set()
                if save:
                    self.saving += 1
            self.changed.notify_all()
        return save

    def _save(self, models: list[CostModel]) -> None:
        """The batch is over: keep what it taught for the next run (a settle thread, no lock).
        Counted as busy meanwhile, so ``shutdown(wait=True)`` returns with the files written."""
        try:
            for model in models:
                model.save()
        finally:
            with self.lock:
                self.saving -= 1
                self.changed.notify_all()

    def _decode(self, task: Task, outcome: Any) -> tuple[bool, Any]:
        if isinstance(outcome, BaseException):
            return False, self._error(outcome)
        done, pid = outcome
        assert isinstance(done, Done)
        results = [self._decode_one(ok, payload, task, pid) for ok, payload in done.outcomes]
        if task.chunked:
            return True, results
        ok, value = results[0]
        if ok and task.want_output:
            elapsed = time.monotonic() - (task.started_at or time.monotonic())
            value = TaskResult(value, done.output or "", pid, elapsed)
        return ok, value

    def _decode_one(self, ok: bool, payload: Any, task: Task, pid: int) -> tuple[bool, Any]:
        if not ok:
            return False, self._error(proxy_from_record(payload))
        try:
            return True, cloudpickle.loads(payload)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: it fails this task only
            error = unpickle_error(exc)
            error.worker_pid = pid
            return False, self._error(error)

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, RemoteError):
            exc.classification = self._classify(exc)
        return exc

    def _classify(self, exc: BaseException) -> Classification:
        return classification(exc, self.classify, self.ignore_errors)

    def statistics(self) -> ExecutorStatistics:
        """An immutable snapshot of the counters, the queue and the workers."""
        with self.lock:
            queued = [t for q in self.queues.values() for _, t in q]
            return ExecutorStatistics(
                queued=sum(1 for t in queued if t.future_running or not t.future.cancelled()),
                running=len(self.in_flight),
                completed=self.completed,
                failed=self.failed,
                cancelled=self.cancelled
                + sum(1 for t in queued if not t.future_running and t.future.cancelled()),
                timed_out=self.timed_out,
                crashed=self.crashed,
                workers_alive=sum(1 for w in self.workers if w.state != "dead"),
                worker_restarts=self.restarts,
                spawn_tasks=self.spawn_tasks,
                fork_tasks=self.fork_tasks,
                start=self.effective_start(),
                start_note=self.start_note(),
                memory_killed=self.memory_killed,
                waiting_for_memory=(
                    min(
                        sum(1 for t in queued if t.future_running or not t.future.cancelled()),
                        max(0, self.max_workers - len(self.in_flight)),
                    )
                    if self.memory_blocked
                    else 0
                ),
                memory_reserved=self.hub.memory.reserved(),
            )

    def timelines(self) -> tuple[TaskTimeline, ...]:
        """The settled tasks' timelines, oldest first."""
        with self.lock:
            return tuple(self.timeline)


class Timeline:
    """The :class:`TaskTimeline` records of an executor's settled tasks, the newest
    :data:`TIMELINE_LIMIT`: kept as plain tuples, one per settle, and made records only when
    read (``tuple(core.timeline)``, lock held) — a frozen dataclass per task costs more on the
    settle path than the rest of the record keeping."""

    def __init__(self) -> None:
        self._rows: deque[tuple[Any, ...]] = deque(maxlen=TIMELINE_LIMIT)

    def add(self, task: Task, ok: bool) -> None:
        self._rows.append(
            (
                task.id,
                task.cost,
                task.path,
                task.worker_pid,
                task.n,
                task.predicted_s,
                ok,
                task.queued_at,
                task.sent_at,
                task.started_at,
                task.done_at,
                task.decoded_at,
                task.settled_at,
                weakref.ref(task.future),
            )
        )

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[TaskTimeline]:
        for row in list(self._rows):
            (task_id, cost, path, pid, calls, predicted_s, ok, *times, future_ref) = row
            queued, sent, started, done, decoded, settled = times
            yield TaskTimeline(
                task_id=task_id,
                function=cost.function if cost is not None else "",
                features=cost.features if cost is not None else "",
                path=path,
                worker_pid=pid,
                calls=calls,
                predicted_s=predicted_s,
                ok=ok,
                queued=queued,
                sent=sent,
                started=started,
                done=done,
                decoded=decoded,
                settled=settled,
                future_ref=future_ref,
            )
