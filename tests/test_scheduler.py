"""The scheduler's rules (:mod:`precompile_executor._policy`) and the state machines, without any
process (pure functions)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from precompile_executor import _policy as policy
from precompile_executor._processes import InvalidTransition, Task, TaskState, WorkerHandle
from precompile_executor._wire import Done, Hello, Run, Started, Stop, decode, encode

pytestmark = pytest.mark.timeout(10)


def test_capacity_counts_tasks_in_flight() -> None:
    assert policy.free_slots(4, 0) == 4
    assert policy.free_slots(4, 3) == 1
    assert policy.free_slots(4, 4) == 0
    assert policy.free_slots(4, 5) == 0  # never negative


@pytest.mark.parametrize(
    ("predicted", "remaining", "expected"),
    [
        ([], [], None),
        ([0.0], [0.0], None),  # unknown length: nothing goes ahead of it
        ([1.0], [0.01], None),  # long: a task ahead would wait behind a wrong prediction
        ([0.02], [0.015], 0),
        ([0.02, 0.1], [0.015, 0.001], 1),  # the one predicted to end first
        ([0.02, 0.1], [-0.5, 0.001], 0),  # overdue counts as ending first
        ([policy.AHEAD_BELOW_S, 0.0], [0.2, 0.0], 0),  # the bound is inclusive
    ],
)
def test_a_task_goes_ahead_only_of_a_short_task_the_one_predicted_to_end_first(
    predicted: list[float], remaining: list[float], expected: int | None
) -> None:
    assert policy.ahead_of(predicted, remaining) == expected


@pytest.mark.parametrize(
    ("ahead_s", "ahead_n", "head_s", "expected"),
    [
        ([0.0, 0.0], [0, 0], 0.0, 1),  # none ahead: the one predicted to end first
        ([0.0005, 0.0], [1, 0], 0.0005, 1),  # one free of tasks ahead is free sooner
        ([0.0003, 0.0005], [1, 1], 0.0005, 0),  # both short enough: the one free first
        ([0.0005, 0.0005], [1, 1], 0.0, None),  # the head's length unknown: only one ahead
        ([float("inf"), 0.0005], [1, 1], 0.0005, 1),  # one ahead of unknown length
        ([0.0015, 0.0015], [1, 1], 0.0005, None),  # past AHEAD_BATCH_S in all
        ([0.0005, 0.0], [policy.AHEAD_MAX_TASKS, 1], 0.0001, 1),  # at most AHEAD_MAX_TASKS
    ],
)
def test_more_than_one_task_goes_ahead_only_of_tasks_that_short_together(
    ahead_s: list[float], ahead_n: list[int], head_s: float, expected: int | None
) -> None:
    predicted, remaining = [0.0002, 0.0001], [0.0001, 0.00005]
    assert policy.ahead_of(predicted, remaining, ahead_s, ahead_n, head_s) == expected


def test_a_long_task_takes_one_task_ahead_and_no_more() -> None:
    assert policy.ahead_of([0.02], [0.01], [0.0], [0], 0.02) == 0
    assert policy.ahead_of([0.02], [0.01], [0.02], [1], 0.02) is None


@pytest.mark.parametrize(
    ("spawn", "fork", "idle", "expected"),
    [
        (None, None, True, None),
        ((0.0, 1), None, True, "spawn"),
        ((0.0, 1), None, False, None),  # a spawn task waits for an idle worker
        (None, (0.0, 2), False, "fork"),
        ((0.0, 1), (0.0, 2), True, "spawn"),  # older first
        ((0.0, 3), (0.0, 2), True, "fork"),
        ((-5.0, 3), (0.0, 2), True, "spawn"),  # higher priority first
        ((-5.0, 3), (0.0, 2), False, "fork"),  # the fork task passes a waiting spawn task
        ((0.0, -2.0, 3), (0.0, -1.0, 2), True, "spawn"),  # longer predicted first
        ((-1.0, -0.1, 3), (0.0, -9.0, 2), True, "spawn"),  # priority beats predicted cost
    ],
)
def test_next_path(spawn: object, fork: object, idle: bool, expected: str | None) -> None:
    assert policy.next_path(spawn, fork, idle) == expected


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (dict(waiting=5, idle=0, starting=0, spawn_workers=0, in_flight=0, max_workers=4), 4),
        (dict(waiting=2, idle=0, starting=0, spawn_workers=0, in_flight=0, max_workers=4), 2),
        (dict(waiting=5, idle=1, starting=1, spawn_workers=2, in_flight=0, max_workers=4), 2),
        (dict(waiting=5, idle=0, starting=0, spawn_workers=4, in_flight=4, max_workers=4), 0),
        # fork tasks hold slots: no worker would have a task to take
        (dict(waiting=5, idle=0, starting=0, spawn_workers=0, in_flight=3, max_workers=4), 1),
        (dict(waiting=0, idle=0, starting=0, spawn_workers=0, in_flight=0, max_workers=4), 0),
        # never beyond max_workers spawn workers, even if some are busy with stuck tasks
        (dict(waiting=9, idle=0, starting=0, spawn_workers=3, in_flight=1, max_workers=4), 1),
    ],
)
def test_workers_to_start(kw: dict[str, int], expected: int) -> None:
    assert policy.workers_to_start(**kw) == expected


def test_devices_balance() -> None:
    assert policy.least_loaded(["0", "1"], {"0": 2, "1": 1}) == "1"
    assert policy.least_loaded(["0", "1"], {}) == "0"  # ties: list order
    # the warmest idle worker (last) unless another device is less busy
    assert policy.pick_idle([None, None, None], {}) == 2
    assert policy.pick_idle(["0", "1", "0"], {"0": 3, "1": 1}) == 1
    with pytest.raises(ValueError):
        policy.pick_idle([], {})


def _task() -> Task:
    return Task(Future(), None, "spawn", None, b"", 1, False, None, 0.0, False)  # type: ignore[arg-type]


def test_task_state_machine_is_guarded() -> None:
    task = _task()
    worker = WorkerHandle("spawn", b"", "/nonexistent")
    with pytest.raises(InvalidTransition):
        task.start(0.0)  # not sent yet
    task.send_to(worker, 0.0)
    task.back_to_queue()  # its worker died before it started
    assert task.state is TaskState.QUEUED and task.requeues == 1 and task.worker is None
    task.send_to(worker, 1.0)
    worker.state = "busy"
    worker.task = task
    task.timeout = 2.0
    task.start(5.0)
    assert task.deadline == 7.0
    with pytest.raises(InvalidTransition):
        task.back_to_queue()  # a started task never runs again
    assert task.close() is True
    assert worker.task is None and task.worker is None
    assert task.close() is False  # resolved exactly once


def test_worker_transitions_are_guarded() -> None:
    worker = WorkerHandle("spawn", b"", "/nonexistent", idle_timeout_s=1.0)
    with pytest.raises(InvalidTransition):
        worker.take(_task(), 0.0)  # still starting
    worker.ready(10.0)
    assert not worker.idle_expired(10.5) and worker.idle_expired(11.0)
    worker.take(_task(), 11.0)
    assert not worker.idle_expired(100.0)  # busy workers never expire
    with pytest.raises(InvalidTransition):
        worker.ready(12.0)
    worker.free(12.0)
    assert worker.die(13.0) is True and worker.die(14.0) is False
    with pytest.raises(InvalidTransition):
        worker.free(15.0)


@pytest.mark.parametrize(
    "message",
    [
        Run(3, 2, True, b"blob"),
        Stop(),
        Hello("tok", 42, None),
        Started(7),
        Done(7, [(True, b"x")], None, True),
    ],
)
def test_messages_round_trip(message: object) -> None:
    assert decode(encode(message)) == message  # type: ignore[arg-type]
    assert type(decode(encode(message))) is type(message)  # type: ignore[arg-type]


def test_foreign_bytes_are_not_a_message() -> None:
    import pickle

    with pytest.raises(ValueError):
        decode(pickle.dumps(("done", 1, [], None)))
    with pytest.raises(ValueError):
        decode(b"garbage")


def test_task_sort_key_is_priority_then_longest_predicted_then_oldest() -> None:
    def task(priority: float, predicted: float) -> Task:
        t = Task(Future(), None, "spawn", None, b"", 1, False, None, priority, False)  # type: ignore[arg-type]
        t.predicted_s = predicted
        return t

    a, b, c, d = task(0, 1.0), task(0, 5.0), task(1, 0.0), task(0, 5.0)
    assert sorted([a, b, c, d], key=Task.sort_key) == [c, b, d, a]
