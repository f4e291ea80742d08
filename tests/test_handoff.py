"""The GIL's hand-off while tasks are in flight (:mod:`precompile_executor._base`, docs/design.md
"A busy caller"): the process's switch interval is lowered from an executor's first task in
flight to its last one's end, and put back as it was."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest

import precompile_executor
from precompile_executor import PrecompileExecutor, _base

pytestmark = pytest.mark.timeout(120)

PYTHONS_DEFAULT_S = 0.005


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether ``check()`` holds within ``timeout_s`` (a future's done-callbacks run just after
    ``result()`` returns, on the thread that set it)."""
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture(autouse=True)
def pythons_interval() -> Iterator[None]:
    """Each test starts at Python's default interval and the library's default setting."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(PYTHONS_DEFAULT_S)
    try:
        yield
    finally:
        precompile_executor.set_busy_switch_interval(_base.BUSY_SWITCH_INTERVAL_S)
        sys.setswitchinterval(before)


@pytest.fixture(scope="module")
def ex() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2) as executor:
        executor.submit(nap, 0).result(timeout=60)  # workers up
        yield executor


def test_the_interval_is_lowered_while_a_task_is_in_flight_and_put_back_after(
    ex: PrecompileExecutor,
) -> None:
    assert _base.BUSY_SWITCH_INTERVAL_S < PYTHONS_DEFAULT_S
    future = ex.options(cost=3).submit(nap, 3)  # the cost: not a task to queue behind
    assert sys.getswitchinterval() == pytest.approx(_base.BUSY_SWITCH_INTERVAL_S)
    ex.submit(nap, 0.01).result(timeout=60)  # on the other worker
    # Another still in flight: still lowered.
    assert not future.done()
    assert sys.getswitchinterval() == pytest.approx(_base.BUSY_SWITCH_INTERVAL_S)
    future.result(timeout=60)
    assert eventually(lambda: sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S))


def test_a_map_a_view_a_failure_and_a_cancel_each_give_the_interval_back(
    ex: PrecompileExecutor,
) -> None:
    assert list(ex.map(nap, [0.01] * 6, chunksize=2)) == [0.01] * 6
    view = ex.options(timeout=30)
    assert view.submit(nap, 0.01).result(timeout=60) == 0.01
    with pytest.raises(ZeroDivisionError):
        ex.submit(divmod, 1, 0).result(timeout=60)
    with ex.batch():  # held: nothing starts, so the cancel wins
        held = ex.submit(nap, 10)
        assert held.cancel()
    assert eventually(lambda: sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S))
    assert _base.handoff.in_flight() == 0


def test_a_task_refused_at_submit_does_not_hold_the_interval() -> None:
    executor = PrecompileExecutor(1)
    executor.shutdown()
    with pytest.raises(RuntimeError, match="shutdown"):
        executor.submit(nap, 0)
    assert _base.handoff.in_flight() == 0
    assert sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S)


def test_an_interval_already_lower_and_one_the_program_sets_meanwhile_are_left_alone(
    ex: PrecompileExecutor,
) -> None:
    sys.setswitchinterval(0.0002)
    ex.submit(nap, 0.05).result(timeout=60)
    assert eventually(lambda: _base.handoff.in_flight() == 0)
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    sys.setswitchinterval(PYTHONS_DEFAULT_S)
    future = ex.submit(nap, 0.3)
    sys.setswitchinterval(0.002)  # the program's own choice, while ours is in force
    future.result(timeout=60)
    assert eventually(lambda: _base.handoff.in_flight() == 0)
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_none_leaves_the_interval_alone_and_a_bad_value_says_what_to_pass(
    ex: PrecompileExecutor,
) -> None:
    precompile_executor.set_busy_switch_interval(None)
    future = ex.submit(nap, 0.2)
    assert sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S)
    future.result(timeout=60)
    for bad in (0, -1.0, float("nan"), "1ms", True):
        with pytest.raises((TypeError, ValueError), match="seconds"):
            precompile_executor.set_busy_switch_interval(bad)  # type: ignore[arg-type]
    # Changed while tasks are in flight: the new value is in force, the old one comes back.
    precompile_executor.set_busy_switch_interval(0.002)
    future = ex.submit(nap, 0.3)
    assert sys.getswitchinterval() == pytest.approx(0.002)
    precompile_executor.set_busy_switch_interval(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.001)
    future.result(timeout=60)
    assert eventually(lambda: sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S))


def test_tasks_in_flight_on_several_threads_and_executors_share_one_count(
    ex: PrecompileExecutor,
) -> None:
    errors: list[BaseException] = []
    with PrecompileExecutor(1) as other:

        def submit_many(executor: PrecompileExecutor) -> None:
            try:
                futures: list[Future[float]] = [executor.submit(nap, 0.001) for _ in range(40)]
                for f in futures:
                    f.result(timeout=60)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=submit_many, args=(e,)) for e in (ex, ex, other, other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
    assert eventually(lambda: _base.handoff.in_flight() == 0)
    assert sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S)


def what_the_child_sees() -> tuple[float, int]:
    return sys.getswitchinterval(), _base.handoff.in_flight()


def test_a_forked_child_starts_at_the_programs_interval_and_counts_from_zero(
    ex: PrecompileExecutor,
) -> None:
    """A child of the fork path is forked from the caller while its own task (and others) are
    in flight: it neither keeps the lowered interval nor counts its parent's tasks."""
    other = ex.options(cost=3).submit(nap, 3)
    assert sys.getswitchinterval() == pytest.approx(_base.BUSY_SWITCH_INTERVAL_S)
    interval, in_flight = ex.options(path="fork").submit(what_the_child_sees).result(timeout=60)
    assert interval == pytest.approx(PYTHONS_DEFAULT_S)
    assert in_flight == 0
    other.result(timeout=60)
    assert eventually(lambda: sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S))


def test_the_interval_is_lowered_while_workers_start() -> None:
    """``warm_up()`` (an integration's background start of its default executor) counts as in
    flight: the workers' hellos reach a caller that may be busy."""
    with PrecompileExecutor(2) as fresh:
        backend = fresh._backend
        original = backend.warm_up
        seen: list[float] = []

        def warm_up(timeout: float | None) -> list[int]:
            seen.append(sys.getswitchinterval())
            return original(timeout)

        backend.warm_up = warm_up  # type: ignore[method-assign]
        assert len(fresh.warm_up(timeout=60)) == 2
        assert seen == [pytest.approx(_base.BUSY_SWITCH_INTERVAL_S)]
    assert _base.handoff.in_flight() == 0
    assert sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S)


def test_work_started_in_the_background_leaves_the_interval_alone(ex: PrecompileExecutor) -> None:
    # An integration whose caller works by itself until the workers answer (Inductor: it
    # compiles in the caller) warms up and probes in the background: nobody waits on that
    # work, and a lower interval would only take the GIL from the caller.
    with _base.in_background():
        background = ex.options(cost=3).submit(nap, 3)
        ex.warm_up(60)
        assert sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S)
    assert _base.handoff.in_flight() == 0
    foreground = ex.submit(nap, 0.5)  # the same thread, outside the block: counted again
    assert sys.getswitchinterval() == pytest.approx(_base.BUSY_SWITCH_INTERVAL_S)
    foreground.result(timeout=60)
    background.result(timeout=60)
    assert eventually(lambda: sys.getswitchinterval() == pytest.approx(PYTHONS_DEFAULT_S))
