"""Where a task's future is set: plain results with no user callback on the monitor thread (no
hand-off), anything that may run user code or import on a settle thread (docs/design.md,
"Threads: who owns what"). Real workers throughout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from precompile_executor import PrecompileExecutor
from precompile_executor._stdlib import done_callbacks, user_callbacks

pytestmark = pytest.mark.timeout(120)


class Point:
    """A result whose pickle names its class: decoding it imports, so never on the monitor."""

    def __init__(self, x: int) -> None:
        self.x = x


def make_point(x: int) -> Point:
    return Point(x)


@pytest.fixture(scope="module")
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(max_workers=2) as ex:
        ex.warm_up(timeout=60)
        yield ex


def _settled_on(future: Future[Any]) -> str:
    """Attach a done-callback and return the name of the thread it ran on."""
    seen: list[str] = []
    ran = threading.Event()

    def note(_: Future[Any]) -> None:
        seen.append(threading.current_thread().name)
        ran.set()

    future.add_done_callback(note)
    assert ran.wait(60)
    return seen[0]


def test_the_executor_and_its_views_attach_only_their_own_callbacks(
    executor: PrecompileExecutor,
) -> None:
    """settle_now() takes a future whose callbacks are all marked the library's own (the
    executor's, and the GIL hand-off's count of tasks in flight); a view adds one more (its
    shutdown's bookkeeping), marked too — and a user's is seen as a user's."""
    view = executor.options(timeout=60)
    counts = []
    for ex in (executor, view):
        with ex.batch():  # nothing is dispatched in the block: the future cannot finish yet
            future = ex.submit(abs, -1)
            counts.append(len(done_callbacks(future)))
            assert not user_callbacks(future), done_callbacks(future)
        assert future.result(timeout=60) == 1
    assert counts == [2, 3]  # the executor's and the hand-off's; a view's future: the view's too
    future = Future[Any]()
    future.add_done_callback(lambda _: None)
    assert user_callbacks(future)


def test_a_task_dispatched_at_once_carries_no_cancel_watch(executor: PrecompileExecutor) -> None:
    """Sent to an idle worker by submit() itself, the future is running before the caller has
    it and can never be cancelled: it carries the hand-off's count only, one callback fewer for
    the monitor to call as it sets each result. A queued one (above) keeps its watch."""
    executor.warm_up(timeout=60)
    future = executor.submit(time.sleep, 0.5)
    assert future.running()
    assert len(done_callbacks(future)) == 1, done_callbacks(future)
    assert not future.cancel()
    assert future.result(timeout=60) is None


def test_a_views_plain_results_are_settled_on_the_monitor(
    executor: PrecompileExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hand-off to a settle thread for a view's plain result with no user callback."""
    hub = executor._backend.hub
    handed_off: list[int] = []
    original = hub._settle

    def settle(settle: Any) -> None:
        handed_off.append(settle.task.id)
        original(settle)

    monkeypatch.setattr(hub, "_settle", settle)
    view = executor.options(timeout=60)
    assert [view.submit(abs, -i).result(timeout=60) for i in range(10)] == list(range(10))
    assert handed_off == []
    assert view.submit(make_point, 2).result(timeout=60).x == 2  # imports: handed off
    assert len(handed_off) == 1


@pytest.mark.parametrize(
    ("fn", "arg", "expected"),
    [(abs, -3, 3), (str, 5, "5"), (bytes, 2, b"\0\0")],
)
def test_plain_results_arrive_whatever_thread_settles_them(
    executor: PrecompileExecutor, fn: Any, arg: Any, expected: Any
) -> None:
    assert [f.result(timeout=60) for f in [executor.submit(fn, arg) for _ in range(20)]] == [
        expected
    ] * 20
    assert list(executor.map(fn, [arg] * 50, chunksize=7)) == [expected] * 50


def test_a_user_callback_never_runs_on_the_monitor(executor: PrecompileExecutor) -> None:
    """The callback is attached while the task runs: its future is set on a settle thread (or,
    attached after the set, the callback runs on the attaching thread) — never the monitor."""
    names = set()
    for _ in range(30):
        future = executor.submit(abs, -1)
        names.add(_settled_on(future))
    me = threading.current_thread().name
    assert all(name == me or name.startswith("precompile-settle") for name in names), names


def test_results_that_import_are_settled_off_the_monitor(executor: PrecompileExecutor) -> None:
    future = executor.submit(make_point, 4)
    assert _settled_on(future) != "precompile-monitor"
    assert future.result(timeout=60).x == 4


def test_timeline_records_every_settled_task(executor: PrecompileExecutor) -> None:
    before = len(executor.timeline())
    futures = [executor.submit(abs, -i) for i in range(10)]
    assert [f.result(timeout=60) for f in futures] == list(range(10))
    records = executor.timeline()[before:]
    assert len(records) == 10
    assert all(r.ok and r.path == "spawn" for r in records)
    assert all(r.queued <= r.sent <= r.started <= r.done <= r.settled for r in records)  # type: ignore[operator]
    assert {r.future for r in records} == set(futures)
