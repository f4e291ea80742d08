"""A busy worker whose task is predicted short gets its next task ahead (docs/design.md,
"Sending ahead"): the worker starts it without waiting for the caller's monitor thread, which
under a caller that holds the GIL answers a ``Done`` only tens of milliseconds later
(``benchmarks/gil_probe.py``).

What must stay true with a task sent ahead: it is counted, its future is RUNNING (a dispatched
task, as in the stdlib's call queue: ``cancel()`` is refused and it runs); when the task before
it crashes, hangs past its timeout or is killed, it never started, so it runs elsewhere without
being counted against it; and nothing is sent ahead where the worker would leave before reading
it (``max_tasks_per_child``), to a task with a memory limit, or behind a task of unknown length.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError, wait
from typing import Any

import crashers
import pytest

from precompile_executor import (
    PrecompileExecutor,
    TaskTimeoutError,
    WorkerCrashedError,
    kill_running_futures,
)
from precompile_executor._processes import TaskState

pytestmark = pytest.mark.timeout(90)

QUICK_S = 0.02


@pytest.fixture
def one_worker() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(1) as ex:
        yield ex


def _teach(ex: PrecompileExecutor, n: int = 3) -> None:
    """Run ``nap`` a few times so the cost model knows it is short."""
    assert ex.submit(crashers.nap, QUICK_S).result(timeout=30) == QUICK_S  # the worker starts
    for _ in range(n):
        assert ex.submit(crashers.nap, QUICK_S).result(timeout=30) == QUICK_S


def test_the_next_task_is_on_its_way_before_the_short_one_ahead_of_it_is_done(
    one_worker: PrecompileExecutor,
) -> None:
    _teach(one_worker)
    before = one_worker.statistics().sent_ahead
    assert list(one_worker.map(crashers.nap, [QUICK_S] * 8, timeout=60)) == [QUICK_S] * 8
    rows = one_worker.timeline()[-8:]
    assert one_worker.statistics().sent_ahead - before >= 6
    # One worker: each task sent ahead was sent before the task before it was done.
    pairs = zip(rows, rows[1:], strict=False)
    ahead = [b for a, b in pairs if b.sent is not None and a.done is not None and b.sent < a.done]
    assert len(ahead) >= 6, [(r.sent, r.started, r.done) for r in rows]
    assert one_worker.statistics().running == 0


def test_nothing_is_sent_ahead_behind_a_task_of_unknown_length(
    one_worker: PrecompileExecutor,
) -> None:
    futures = [one_worker.submit(crashers.square, i, 0.05) for i in range(4)]
    assert [f.result(timeout=30) for f in futures] == [0, 1, 4, 9]
    # The first square's length was unknown when the second was queued behind it; once known
    # (50 ms), it is short enough: later ones may go ahead. The first is never sent ahead.
    rows = one_worker.timeline()
    assert rows[1].sent is not None and rows[1].sent >= rows[0].done


def test_a_task_sent_ahead_of_a_crash_runs_on_another_worker(
    one_worker: PrecompileExecutor,
) -> None:
    _teach(one_worker)
    crash = one_worker.submit(crashers.nap, 0.2, "sigkill")
    behind = [one_worker.submit(crashers.nap, QUICK_S) for _ in range(3)]
    with pytest.raises(WorkerCrashedError):
        crash.result(timeout=30)
    assert [f.result(timeout=30) for f in behind] == [QUICK_S] * 3
    stats = one_worker.statistics()
    assert stats.sent_ahead >= 1
    assert stats.crashed == 1 and stats.completed == 4 + 3


def test_a_task_sent_ahead_of_a_hang_runs_after_the_timeout_kill(
    one_worker: PrecompileExecutor,
) -> None:
    _teach(one_worker)
    timed = one_worker.options(timeout=1.0)
    hang = timed.submit(crashers.nap, QUICK_S, "hang")
    behind = timed.submit(crashers.nap, QUICK_S)
    with pytest.raises(TaskTimeoutError):
        hang.result(timeout=30)
    assert behind.result(timeout=30) == QUICK_S
    assert one_worker.statistics().sent_ahead >= 1


def test_a_task_sent_ahead_is_running_and_cannot_be_cancelled(
    one_worker: PrecompileExecutor,
) -> None:
    _teach(one_worker)
    first = one_worker.submit(crashers.nap, 0.3)
    second = one_worker.submit(crashers.nap, QUICK_S)
    third = one_worker.submit(crashers.nap, QUICK_S)
    assert one_worker.statistics().sent_ahead >= 1
    assert second.running() and not second.cancel()  # on its way: it runs, as stdlib's would
    assert third.cancel()  # still queued: one task ahead per worker, no more
    assert first.result(timeout=30) == 0.3 and second.result(timeout=30) == QUICK_S
    assert third.cancelled()


def _wait_until_started(ex: PrecompileExecutor, n: int, timeout_s: float = 30.0) -> None:
    """Until ``n`` of ``ex``'s tasks are STARTED (their workers' ``Started`` read)."""
    scheduler = ex._backend
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with scheduler.lock:
            if sum(t.state is TaskState.STARTED for t in scheduler.in_flight) >= n:
                return
        time.sleep(0.005)
    raise AssertionError(f"fewer than {n} tasks started within {timeout_s} s")


def test_terminate_workers_fails_a_task_sent_ahead_as_cancelled() -> None:
    with PrecompileExecutor(1) as ex:
        _teach(ex)
        running = ex.submit(crashers.nap, 30.0)
        ex_ahead_guard = ex.submit(crashers.nap, QUICK_S)
        # The 30 s nap was predicted short (nap's history): the next one went ahead of it.
        assert ex.statistics().sent_ahead >= 1 and ex_ahead_guard.running()
        _wait_until_started(ex, 1)  # its worker's Started read: it ran, so it crashes, not cancels
        ex.terminate_workers()
        done, not_done = wait([running, ex_ahead_guard], timeout=30)
        assert not not_done
        assert isinstance(running.exception(), WorkerCrashedError)
        with pytest.raises(CancelledError):
            ex_ahead_guard.result(timeout=0)


def test_a_task_sent_ahead_killed_alone_does_not_run_and_its_worker_s_task_ends_as_it_would(
    one_worker: PrecompileExecutor,
) -> None:
    """``kill_running_futures`` of a task sent ahead, without the task its worker runs: that
    task ends as it would, and the one ahead is killed when it starts, never run to its end
    (a cluster's node kills a withdrawn task this way: ``NodePool.kill``)."""
    _teach(one_worker)
    first = one_worker.submit(crashers.nap, 0.5)
    ahead = one_worker.submit(crashers.nap, 20.0)
    assert one_worker.statistics().sent_ahead >= 1 and ahead.running()
    assert kill_running_futures([ahead]) is None
    assert first.result(timeout=30) == 0.5
    error = ahead.exception(timeout=30)
    assert isinstance(error, (CancelledError, WorkerCrashedError)), error
    assert one_worker.submit(crashers.nap, QUICK_S).result(timeout=30) == QUICK_S


def test_no_task_is_sent_ahead_to_a_worker_that_leaves_after_its_task() -> None:
    with PrecompileExecutor(1, max_tasks_per_child=2) as ex:
        _teach(ex)
        assert list(ex.map(crashers.nap, [QUICK_S] * 6, timeout=60)) == [QUICK_S] * 6
        stats = ex.statistics()
        assert stats.sent_ahead == 0 and stats.completed == 4 + 6


def test_no_task_with_a_memory_limit_is_sent_ahead(one_worker: PrecompileExecutor) -> None:
    _teach(one_worker)
    limited = one_worker.options(memory_limit=2 << 30)
    assert list(limited.map(crashers.nap, [QUICK_S] * 4, timeout=60)) == [QUICK_S] * 4
    assert one_worker.statistics().sent_ahead == 0


def test_runs_reach_a_worker_in_the_order_they_were_decided_whichever_thread_writes_them(
    one_worker: PrecompileExecutor,
) -> None:
    # The caller's thread decides a task ahead of a running one, then is slow to write it; the
    # running one ends meanwhile, and the monitor decides the next task ahead and writes at
    # once. Written in that order the worker would run the later task first, and the parent,
    # expecting the earlier one, would ignore its Started and Done: a lost task, a hung batch.
    _teach(one_worker)
    hub = one_worker._backend.hub
    send = hub.send
    main_calls = [0]

    def slow_on_the_callers_thread(worker: object) -> None:
        if threading.current_thread() is threading.main_thread():
            main_calls[0] += 1
            if main_calls[0] == 2:  # the task sent ahead of the first
                time.sleep(0.5)
        send(worker)

    hub.send = slow_on_the_callers_thread
    try:
        with one_worker.batch():
            futures = [one_worker.submit(crashers.nap, x) for x in (0.05, 0.01, 0.01, 0.01)]
        _, not_done = wait(futures, timeout=20)
        if not_done:
            one_worker.terminate_workers()  # a lost task would keep shutdown() waiting
        assert not not_done
        assert [f.result(timeout=0) for f in futures] == [0.05, 0.01, 0.01, 0.01]
    finally:
        del hub.send
    assert main_calls[0] >= 2


def test_no_ops_go_several_ahead_and_reach_their_worker_in_fewer_writes(
    one_worker: PrecompileExecutor,
) -> None:
    """Tasks predicted far shorter than the monitor's answer to a ``Done`` wait several ahead of
    a worker, and the ones decided in one monitor round go in one write; each still runs once,
    in order, and gets its own result."""
    assert list(one_worker.map(crashers.square, range(50), timeout=60)) == [
        x * x for x in range(50)
    ]  # the cost model learns that square is a no-op
    hub = one_worker._backend.hub
    write = hub._write_runs
    sizes: list[int] = []

    def noted_write(worker: object, tasks: list[object]) -> None:
        sizes.append(len(tasks))
        write(worker, tasks)

    hub._write_runs = noted_write
    try:
        results = list(one_worker.map(crashers.square, range(400), timeout=60))
    finally:
        del hub._write_runs
    assert results == [x * x for x in range(400)]
    assert sum(sizes) == 400
    assert max(sizes) > 1 and len(sizes) < 400, sizes
    assert one_worker.statistics().running == 0


def test_every_no_op_sent_ahead_of_a_crash_runs_again_and_the_crash_fails_alone(
    one_worker: PrecompileExecutor,
) -> None:
    """Several tasks wait ahead of one short task that kills its worker: none of them started,
    so each runs on the replacement, none counted against its requeue limit."""
    for _ in range(20):  # the cost model learns that nap(0) takes microseconds
        assert one_worker.submit(crashers.nap, 0.0).result(timeout=30) == 0.0
    before = one_worker.statistics().sent_ahead
    with one_worker.batch():
        crash = one_worker.submit(crashers.nap, 0.0, "sigkill")
        behind = [one_worker.submit(crashers.nap, 0.0) for _ in range(6)]
    with pytest.raises(WorkerCrashedError):
        crash.result(timeout=30)
    assert [f.result(timeout=30) for f in behind] == [0.0] * 6
    stats = one_worker.statistics()
    assert stats.sent_ahead - before >= 2
    assert stats.crashed == 1 and stats.running == 0


def test_a_run_says_whether_anything_was_queued_behind_it_when_it_was_sent(
    one_worker: PrecompileExecutor,
) -> None:
    """``Run.lone``: nothing of its executor was queued when it was sent, so its caller may be
    waiting for its result before submitting more, and the worker polls for the next ``Run`` a
    moment after it (docs/design.md, "Per-task overhead"). Tasks sent from a queue say no, the
    last one sent yes."""
    hub = one_worker._backend.hub
    write = hub._write_runs
    flags: list[bool] = []

    def noted_write(worker: object, tasks: list[Any]) -> None:
        flags.extend(task.lone for task in tasks)
        write(worker, tasks)

    hub._write_runs = noted_write
    try:
        assert one_worker.submit(crashers.square, 3).result(timeout=30) == 9
        assert flags == [True]
        flags.clear()
        with one_worker.batch():
            futures = [one_worker.submit(crashers.square, x) for x in range(4)]
        assert [f.result(timeout=30) for f in futures] == [0, 1, 4, 9]
    finally:
        del hub._write_runs
    assert flags == [False, False, False, True]
