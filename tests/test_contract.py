"""The concurrent.futures contract, the honest queue, reuse of warm workers, and bad input.

Tests that take ``make`` run against every backend: ``PrecompileExecutor`` on this machine,
``DaskPrecompileExecutor`` on a 2-node local dask cluster (skipped without ``distributed``) and
``RayPrecompileExecutor`` on a 2-node local Ray cluster in a loopback-only network namespace
(skipped without ``ray``, or without the root that the namespace needs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import crashers
import pytest

from precompile_executor import (
    ExecutorStatistics,
    PrecompileExecutor,
    SerializationError,
    WorkerCrashedError,
    WorkerStartError,
)
from precompile_executor._errors import proxy_from_record, record_from_exception

pytestmark = pytest.mark.timeout(60)

Make = Callable[..., Any]


@pytest.fixture(
    # The Ray cluster starts inside the first Ray test's time (5 s on an idle 2-core machine,
    # most of a minute on a loaded one).
    params=["local", "dask", pytest.param("ray", marks=pytest.mark.timeout(240))]
)
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    """``make(n)``: an executor of this backend that runs ``n`` tasks at once."""
    if request.param == "local":
        yield PrecompileExecutor
        return
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")  # skips without ray (or without root)
        from conftest import ray_node_resource

        from precompile_executor.ray import RayPrecompileExecutor

        def make_ray(n: int, **kwargs: Any) -> RayPrecompileExecutor:
            # n == 1: one node with one slot; else n // 2 slots on each of the two nodes.
            if n == 1:
                kwargs["resources"] = {ray_node_resource(0): 1}
            return RayPrecompileExecutor(max_workers_per_node=max(1, n // 2), **kwargs)

        yield make_ray
        return
    from precompile_executor.dask import DaskPrecompileExecutor

    _, client, _ = request.getfixturevalue("dask_cluster")
    nodes = sorted(client.nthreads())

    def make_dask(n: int, **kwargs: Any) -> DaskPrecompileExecutor:
        # n == 1: one node with one slot; else n // 2 slots on each of the two nodes.
        if n == 1:
            kwargs["workers"] = nodes[:1]
        return DaskPrecompileExecutor(client, max_workers_per_node=max(1, n // 2), **kwargs)

    yield make_dask


def _accounted(stats: Any) -> int:
    return stats.queued + getattr(stats, "dispatched", 0) + stats.running + stats.completed


def test_is_an_executor_and_returns_stdlib_futures(make: Make) -> None:
    with make(1) as executor:
        assert isinstance(executor, cf.Executor)
        future = executor.submit(crashers.square, 6)
        assert type(future) is cf.Future
        assert future.result(timeout=30) == 36


def test_lambdas_closures_and_main_style_functions(make: Make) -> None:
    offset = 10

    def closure(x: int) -> int:
        return x + offset

    with make(2) as executor:
        assert executor.submit(lambda x: x * 3, 4).result(timeout=30) == 12
        assert executor.submit(closure, 5).result(timeout=30) == 15
        assert executor.submit(crashers.square, x=3).result(timeout=30) == 9
        # Runs in another process.
        assert executor.submit(os.getpid).result(timeout=30) != os.getpid()


def test_map_order_several_iterables_and_chunksize(make: Make) -> None:
    with make(2) as executor:
        for chunksize in (1, 3, 7):
            got = list(
                executor.map(lambda a, b: a * 10 + b, range(10), range(20, 30), chunksize=chunksize)
            )
            assert got == [a * 10 + b for a, b in zip(range(10), range(20, 30), strict=False)]
        # stops at the shortest iterable, like zip
        assert list(executor.map(pow, [2, 3, 4], [2, 2])) == [4, 9]


def test_map_raises_a_task_exception_at_its_position(make: Make) -> None:
    def invert(x: int) -> float:
        return 1 / x

    with make(2) as executor:
        for chunksize in (1, 2):
            results = executor.map(invert, [1, 2, 0, 4], chunksize=chunksize)
            assert next(results) == 1.0
            assert next(results) == 0.5
            with pytest.raises(ZeroDivisionError):
                next(results)


def test_map_timeout_counts_from_the_call(make: Make) -> None:
    with make(2) as executor:
        executor.warm_up(timeout=30)
        start = time.monotonic()
        results = executor.map(time.sleep, [0.0, 3.0, 3.0], timeout=1.0)
        assert next(results) is None
        with pytest.raises(TimeoutError):
            next(results)
        assert time.monotonic() - start < 2.5
        with pytest.raises(ValueError, match="chunksize"):
            executor.map(abs, [1], chunksize=0)


def test_map_is_lazy_about_results_but_submits_at_once(make: Make) -> None:
    with make(2) as executor:
        results = executor.map(crashers.square, range(4))
        time.sleep(0.1)
        assert _accounted(executor.statistics()) == 4
        assert list(results) == [0, 1, 4, 9]


def test_map_buffersize_submits_a_window_ahead_of_the_consumer(make: Make) -> None:
    """Python 3.14's ``Executor.map(buffersize=)``, on every Python: at most ``buffersize``
    tasks (chunks) are submitted ahead of the result being waited for, so an endless iterable
    works; closing the iterator cancels what was submitted ahead."""
    pulled: list[int] = []

    def counting() -> Iterator[int]:
        for i in itertools.count():
            pulled.append(i)
            yield i

    with make(2) as executor:
        results = executor.map(crashers.square, counting(), buffersize=3)
        assert len(pulled) == 3  # the first window, submitted at the call
        assert [next(results) for _ in range(5)] == [0, 1, 4, 9, 16]
        assert len(pulled) <= 5 + 3 + 1, pulled  # the stdlib refills one before each wait
        results.close()
        pulled_at_close = len(pulled)
        assert list(executor.map(crashers.square, range(7), buffersize=2, chunksize=3)) == [
            i * i for i in range(7)
        ]
        assert list(executor.map(pow, [2, 3, 4], [2, 2], buffersize=1)) == [4, 9]
        for bad, error in ((0, ValueError), (-1, ValueError), ("2", TypeError), (True, TypeError)):
            with pytest.raises(error, match="buffersize"):
                executor.map(abs, [1], buffersize=bad)
    assert len(pulled) == pulled_at_close  # nothing more was pulled from the endless input


def test_as_completed_and_wait(make: Make) -> None:
    with make(2) as executor:
        futures = [executor.submit(crashers.square, i, 0.05 * (5 - i)) for i in range(5)]
        assert sorted(f.result() for f in cf.as_completed(futures, timeout=30)) == [0, 1, 4, 9, 16]
        done, not_done = cf.wait(futures, timeout=30)
        assert len(done) == 5 and not not_done


def test_asyncio_run_in_executor_and_wrap_future(make: Make) -> None:
    async def main(executor: PrecompileExecutor) -> list[int]:
        loop = asyncio.get_running_loop()
        a = loop.run_in_executor(executor, crashers.square, 7)
        b = asyncio.wrap_future(executor.submit(crashers.square, 8))
        return list(await asyncio.wait_for(asyncio.gather(a, b), timeout=30))

    with make(2) as executor:
        assert asyncio.run(main(executor)) == [49, 64]


def test_queued_futures_stay_pending_and_cancellable(make: Make) -> None:
    with make(1) as executor:
        executor.warm_up(timeout=30)
        busy = executor.submit(time.sleep, 1.0)
        queued = [executor.submit(crashers.square, i) for i in range(3)]
        time.sleep(0.3)
        assert busy.running()
        assert all(not f.running() and not f.done() for f in queued)
        stats = executor.statistics()
        assert (stats.running, stats.queued) == (1, 3)
        assert queued[1].cancel()
        assert not busy.cancel()  # running: too late
        assert queued[0].result(timeout=30) == 0
        assert queued[2].result(timeout=30) == 4
        assert queued[1].cancelled()
        assert executor.statistics().cancelled == 1


def test_shutdown_cancel_futures_cancels_exactly_the_unstarted(make: Make) -> None:
    executor = make(1)
    executor.warm_up(timeout=30)
    running = executor.submit(time.sleep, 0.5)
    time.sleep(0.2)
    queued = [executor.submit(crashers.square, i) for i in range(4)]
    executor.shutdown(wait=True, cancel_futures=True)
    assert running.result(timeout=1) is None
    assert all(f.cancelled() for f in queued)
    assert executor.statistics().cancelled == 4
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(crashers.square, 1)


@pytest.mark.parametrize("stop", ["shutdown", "terminate_workers"])
def test_a_warm_up_waiting_for_workers_ends_when_the_executor_is_shut_down(stop: str) -> None:
    """A background ``warm_up()`` must not outlive its executor: once it is shut down no task
    can use the workers, and its starting workers are stopped."""
    executor = PrecompileExecutor(1, initializer=time.sleep, initargs=(20,))
    outcome: list[BaseException | list[int]] = []

    def warm() -> None:
        try:
            outcome.append(executor.warm_up())  # no timeout: only the shutdown can end it
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome.append(error)

    thread = threading.Thread(target=warm, daemon=True)
    thread.start()
    time.sleep(0.5)  # waiting for its worker's initializer by now
    if stop == "shutdown":
        executor.shutdown(wait=False)
    else:
        executor.terminate_workers()
    thread.join(10)
    assert not thread.is_alive(), "warm_up() still waits after the executor was shut down"
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError)
    assert "after shutdown" in str(outcome[0])
    executor.terminate_workers()


def test_shutdown_without_wait_still_runs_queued_tasks(make: Make) -> None:
    executor = make(1)
    futures = [executor.submit(crashers.square, i, 0.1) for i in range(3)]
    executor.shutdown(wait=False)
    assert [f.result(timeout=30) for f in futures] == [0, 1, 4]


def test_second_executor_reuses_the_same_worker_processes() -> None:
    with PrecompileExecutor(2) as first:
        pids = set(first.warm_up(timeout=60))
        assert (
            pids
            == set(f.result(timeout=30) for f in [first.submit(os.getpid) for _ in range(2)]) | pids
        )
    with PrecompileExecutor(2) as second:
        got = second.submit(os.getpid).result(timeout=30)
        assert got in pids  # a process that already existed: no interpreter start, no imports
        assert set(second.warm_up(timeout=30)) == pids
        assert second.statistics().worker_restarts == 0


@pytest.mark.parametrize("start", ["interpreter", "template"])
def test_initializer_runs_once_per_worker_kind_and_keys_the_pool(
    tmp_path: os.PathLike[str], start: str
) -> None:
    marker = os.path.join(str(tmp_path), "inits")

    def init(path: str) -> None:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        os.environ["PRECOMPILE_TEST_INIT"] = "yes"

    with PrecompileExecutor(2, initializer=init, initargs=(marker,), start=start) as executor:
        pids = executor.warm_up(timeout=60)
        assert (
            executor.submit(lambda: os.environ.get("PRECOMPILE_TEST_INIT")).result(timeout=30)
            == "yes"
        )
        assert executor.statistics().start == start
    with open(marker) as f:
        ran_in = sorted(int(line) for line in f)
    if start == "interpreter":
        assert ran_in == sorted(pids)  # once in each worker
    else:
        # once, in the template; the workers forked from it inherit what it did
        assert len(ran_in) == 1 and ran_in[0] not in pids
    with PrecompileExecutor(2) as plain:  # another initializer: other workers
        assert (
            plain.submit(lambda: os.environ.get("PRECOMPILE_TEST_INIT")).result(timeout=30) is None
        )
    from precompile_executor import stop_idle_workers

    assert stop_idle_workers() >= 2


def test_initializer_failure_breaks_the_executor_with_a_clear_error(make: Make) -> None:
    def bad_init() -> None:
        raise ImportError("no module named 'triton_nightly'")

    executor = make(1, initializer=bad_init)
    queued = executor.submit(crashers.square, 2)  # waits for the worker that will not start
    error = queued.exception(timeout=60)
    assert isinstance(error, WorkerStartError)
    assert "triton_nightly" in str(error)
    # Broken, as the stdlib pools are after an initializer fails: every later call says so.
    with pytest.raises(WorkerStartError, match="triton_nightly"):
        executor.warm_up(timeout=60)
    with pytest.raises(cf.BrokenExecutor, match="triton_nightly"):
        executor.submit(crashers.square, 2)
    executor.shutdown()


def test_only_an_unusable_executor_raises_broken_executor(make: Make) -> None:
    """``BrokenExecutor`` means the executor cannot run tasks any more (the stdlib's and loky's
    meaning: callers rebuild the pool). A crashed worker fails its task only: its error is a
    ``WorkerCrashedError`` and not a ``BrokenExecutor``, and the executor goes on."""
    with make(1) as executor:
        error = executor.submit(crashers.self_sigkill).exception(timeout=60)
        assert isinstance(error, WorkerCrashedError)
        assert not isinstance(error, cf.BrokenExecutor)
        assert executor.submit(crashers.square, 3).result(timeout=60) == 9


def test_proxies_keep_the_meaning_of_broken_executor() -> None:
    # A record of this library's errors (a task that used an executor of its own and re-raised
    # its error) comes back as a proxy of the same class: a crash stays a plain task failure.
    crash = proxy_from_record(record_from_exception(WorkerCrashedError(7, -9), "", "", 7))
    assert isinstance(crash, WorkerCrashedError) and not isinstance(crash, cf.BrokenExecutor)
    start = proxy_from_record(record_from_exception(WorkerStartError("init"), "", "", 7))
    assert isinstance(start, WorkerStartError) and isinstance(start, cf.BrokenExecutor)


def test_statistics_is_an_immutable_snapshot(make: Make) -> None:
    with make(2) as executor:
        executor.submit(crashers.square, 2).result(timeout=30)
        stats = executor.statistics()
    assert stats.completed == 1 and stats.failed == 0
    if isinstance(stats, ExecutorStatistics):
        assert stats.spawn_tasks == 1
    with pytest.raises(AttributeError):
        stats.completed = 5  # type: ignore[misc]


def test_idle_timeout_stops_idle_workers() -> None:
    with PrecompileExecutor(1, idle_timeout=0.5) as executor:
        pid = executor.submit(os.getpid).result(timeout=30)
        deadline = time.monotonic() + 10
        import psutil

        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        assert time.monotonic() < deadline, "idle worker outlived its idle_timeout"
        assert executor.submit(os.getpid).result(timeout=30) != pid  # a new one starts on demand


def test_priority_orders_queued_tasks(make: Make) -> None:
    order: list[int] = []
    with make(1) as executor:
        executor.warm_up(timeout=30)
        blocker = executor.submit(time.sleep, 0.5)
        futures = [executor.options(priority=p).submit(crashers.square, p) for p in (1, 5, 3)]
        for f in cf.as_completed(futures, timeout=30):
            order.append(f.result())
        blocker.result(timeout=30)
    assert order == [25, 9, 1]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_workers": 0}, ValueError, "max_workers must be >= 1"),
        ({"max_workers": -3}, ValueError, "max_workers"),
        ({"max_workers": 2.5}, TypeError, "max_workers must be an int"),
        ({"max_workers": True}, TypeError, "max_workers"),
        ({"timeout": 0}, ValueError, "timeout must be > 0"),
        ({"timeout": "5"}, TypeError, "timeout must be a number"),
        ({"timeout": float("inf")}, ValueError, "timeout must be a finite.*None for no limit"),
        ({"idle_timeout": float("nan")}, ValueError, "idle_timeout must be a finite"),
        ({"path": "thread"}, ValueError, "path must be one of"),
        ({"initializer": 3}, TypeError, "initializer must be callable"),
        ({"initargs": [1]}, TypeError, "initargs must be a tuple"),
        ({"idle_timeout": -1}, ValueError, "idle_timeout"),
        ({"classify": "warn"}, TypeError, "classify must be callable"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PrecompileExecutor(**kwargs)


@pytest.mark.timeout(60)
def test_a_timeout_of_years_runs_its_task_and_the_monitor_keeps_its_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The monitor waits until the next deadline: ~31 years does not fit epoll's milliseconds.
    with (
        caplog.at_level(logging.ERROR, logger="precompile_executor"),
        PrecompileExecutor(1, timeout=1e9) as executor,
    ):
        assert executor.submit(crashers.square, 5).result(timeout=30) == 25
        assert executor.options(timeout=1e12).submit(crashers.square, 6).result(timeout=30) == 36
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_bad_submit_input(make: Make) -> None:
    with make(1) as executor:
        with pytest.raises(TypeError, match="fn must be callable"):
            executor.submit(42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="path"):
            executor.options(path="nope")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="priority must be a number, not NaN"):
            executor.options(priority=float("nan"))  # it would unorder the queue's heap
        lock = threading.Lock()
        future = executor.submit(lambda l: 1, lock)
        error = future.exception(timeout=30)
        assert isinstance(error, SerializationError)
        assert isinstance(error, TypeError)
        assert "positional argument 0" in str(error) and "lock" in str(error)
        if isinstance(executor, PrecompileExecutor):
            assert "path='fork'" in str(error)  # the local fallback; a node cannot fork
        bad_fn = executor.submit(lambda: lock.locked())
        assert "the callable" in str(bad_fn.exception(timeout=30))
        # nothing else broke
        assert executor.submit(crashers.square, 4).result(timeout=30) == 16
        assert executor.statistics().failed == 2


def test_with_output_returns_the_captured_output_of_a_success(make: Make) -> None:
    from precompile_executor import TaskResult

    with make(1) as executor:
        result = (
            executor.options(with_output=True)
            .submit(crashers.print_and_return, "hi")
            .result(timeout=30)
        )
    assert isinstance(result, TaskResult)
    assert result.value == "HI"
    assert "hi\n" in result.output and "fd2 line" in result.output
    assert result.worker_pid != os.getpid()


def test_large_output_does_not_deadlock(make: Make) -> None:
    def flood() -> int:
        chunk = b"x" * 65536
        for _ in range(64):  # 4 MiB through fd 1
            os.write(1, chunk)
        return 1

    with make(1) as executor:
        result = executor.options(with_output=True).submit(flood).result(timeout=60)
    assert result.value == 1
    assert "earlier bytes cut" in result.output  # kept the last 1 MiB


def test_import_does_not_import_torch_or_triton() -> None:
    import subprocess
    import sys

    code = "import sys, precompile_executor; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_dropped_executor_returns_its_workers_to_the_pool() -> None:
    import gc

    executor = PrecompileExecutor(1)
    pid = executor.options(timeout=30).submit(os.getpid).result(timeout=30)
    del executor
    gc.collect()
    with PrecompileExecutor(1) as again:
        assert again.submit(os.getpid).result(timeout=30) == pid


@pytest.mark.timeout(60)
def test_a_dropped_executor_is_shut_down_off_the_thread_that_collects_it() -> None:
    """The garbage collector runs an executor's finalizer on whatever thread allocates: one that
    waited there for the hub's lock deadlocked a thread being started by the lock's holder (the
    monitor starting the memory guard's thread, whose start a collection interrupted). The
    finalizer only hands the executor on; a thread of the library shuts it down, and what was
    submitted still runs."""
    import gc

    executor = PrecompileExecutor(1)
    future = executor.submit(crashers.square, 3)
    backend = executor._backend  # the scheduler outlives its executor: we watch it
    held, release = threading.Event(), threading.Event()

    def hold_the_hubs_lock() -> None:
        with backend.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_hubs_lock)
    holder.start()
    try:
        assert held.wait(10)
        owner = [executor]  # the collector drops the last reference (a cycle would do too)
        del executor
        collector = threading.Thread(target=lambda: (owner.clear(), gc.collect()))
        collector.start()
        collector.join(10)
        assert not collector.is_alive(), "the finalizer waited for the hub's lock"
    finally:
        release.set()
        holder.join(10)
    deadline = time.monotonic() + 30
    while not backend.shutdown and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.shutdown, "the dropped executor was never shut down"
    assert future.result(timeout=30) == 9


def test_batch_lets_priority_order_the_first_wave_too(make: Make) -> None:
    order: list[int] = []
    with make(1) as executor:
        executor.warm_up(timeout=30)
        with executor.batch():
            futures = [executor.options(priority=p).submit(crashers.square, p) for p in (1, 5, 3)]
            time.sleep(0.2)
            assert all(not f.running() and not f.done() for f in futures)  # held back
        for f in cf.as_completed(futures, timeout=30):
            order.append(f.result())
    assert order == [25, 9, 1]


def test_a_views_shutdown_closes_the_view_only(make: Make) -> None:
    """``options()`` returns a view: its shutdown refuses new tasks through it, waits for (or with
    ``cancel_futures`` cancels) the tasks submitted through it, and leaves the executor and its
    other views running."""
    with make(1) as executor:
        executor.warm_up(timeout=30)
        view = executor.options(timeout=30)
        other = executor.options(priority=1)
        blocker = view.submit(crashers.square, 2, 1.0)
        deadline = time.monotonic() + 30
        while not blocker.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert blocker.running()
        queued = view.submit(crashers.square, 3)
        theirs = other.submit(crashers.square, 4)
        view.shutdown(wait=True, cancel_futures=True)
        assert blocker.done() and blocker.result() == 4  # started: waited for
        assert queued.cancelled()  # the view's own task, not started: cancelled
        assert theirs.result(timeout=30) == 16  # another view's task: untouched
        with pytest.raises(RuntimeError):
            view.submit(crashers.square, 5)
        assert other.submit(crashers.square, 6).result(timeout=30) == 36
        assert executor.submit(crashers.square, 7).result(timeout=30) == 49


def test_a_cancelled_queued_future_is_seen_by_wait_and_as_completed_at_once(make: Make) -> None:
    """Not only when the queue reaches it (the stdlib pools notify then): behind a task that runs
    for 20 s, ``wait()`` on the cancelled future returns at once."""
    with make(1) as executor:
        executor.warm_up(timeout=30)
        blocker = executor.submit(crashers.square, 2, 20.0)
        deadline = time.monotonic() + 30
        while not blocker.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        queued = executor.submit(crashers.square, 3)
        assert queued.cancel()
        done, not_done = cf.wait([queued], timeout=5)
        assert done == {queued} and not not_done
        assert list(cf.as_completed([queued], timeout=5)) == [queued]
        assert executor.statistics().cancelled == 1
        executor.interrupt()
        assert blocker.exception(timeout=30) is not None  # killed: the test need not wait 20 s


def _start_a_thread() -> None:
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


def test_an_initializer_that_leaves_a_thread_gets_interpreters_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="precompile_executor"):
        with PrecompileExecutor(2, initializer=_start_a_thread) as executor:
            executor.warm_up(timeout=120)
            assert executor.submit(crashers.square, 3).result(timeout=30) == 9
            stats = executor.statistics()
            assert stats.start == "interpreter"
            assert stats.start_note is not None and "threads running" in stats.start_note
    said = [r.getMessage() for r in caplog.records if "warm template" in r.getMessage()]
    assert len(said) == 1, said  # once, with the reason and the threads' kernel names
    assert "the initializer left 2 threads running (" in said[0]


def _start_a_native_thread(name: str) -> None:
    """A thread Python's ``threading`` does not know of, under a kernel name of its own — as
    the CUDA driver's thread after a device count (``cuda00001800007`` on the H200)."""
    import _thread

    ready = threading.Event()
    forever = _thread.allocate_lock()
    forever.acquire()

    def run() -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name)
        ready.set()
        forever.acquire()  # blocks for the process's life, holding nothing

    _thread.start_new_thread(run, ())
    assert ready.wait(10)


@pytest.mark.parametrize(
    ("thread", "start"),
    [("cuda00001800007", "template"), ("cuda-EvtHandlr", "interpreter"), ("helper", "interpreter")],
)
def test_only_a_cuda_driver_thread_is_accepted_in_a_template(thread: str, start: str) -> None:
    """The CUDA driver's idle thread that ``torch.cuda.is_available()`` leaves (which
    ``import helion`` calls) does not stop the template forking (children use CUDA: measured on
    the H200); any other native thread does — a CUDA context's event thread too —, and the note
    names it."""
    with PrecompileExecutor(2, initializer=_start_a_native_thread, initargs=(thread,)) as ex:
        ex.warm_up(timeout=120)
        assert [f.result(timeout=30) for f in [ex.submit(crashers.square, i) for i in (2, 3)]] == [
            4,
            9,
        ]
        stats = ex.statistics()
    assert stats.start == start, stats.start_note
    if start == "template":
        assert stats.start_note is None
    else:
        assert stats.start_note is not None and f"{thread}" in stats.start_note


def _fake_torch_and_a_driver_thread(in_bad_fork: bool | None) -> None:
    """A stand-in for torch after a device count: the driver's thread, and torch's own answer,
    in a forked child, to "may this process use CUDA?" (``torch._C._cuda_isInBadFork``); with
    ``None`` the answer raises."""
    import types

    def answer() -> bool:
        if in_bad_fork is None:
            raise RuntimeError("torch could not say")
        return in_bad_fork

    fake = types.ModuleType("torch")
    fake._C = types.SimpleNamespace(_cuda_isInBadFork=answer)  # type: ignore[attr-defined]
    sys.modules["torch"] = fake
    _start_a_native_thread("cuda00001400006")


@pytest.mark.parametrize(
    ("in_bad_fork", "start"), [(True, "interpreter"), (False, "template"), (None, "interpreter")]
)
def test_a_template_asks_a_throwaway_child_whether_torch_allows_cuda_after_a_fork(
    in_bad_fork: bool | None, start: str
) -> None:
    """After a device count through the CUDA runtime torch refuses CUDA in every forked child,
    which only a child can see: the template forks one to ask (once) and refuses if so — or if
    the child could not tell."""
    with PrecompileExecutor(
        2, initializer=_fake_torch_and_a_driver_thread, initargs=(in_bad_fork,)
    ) as ex:
        ex.warm_up(timeout=120)
        assert ex.submit(crashers.square, 5).result(timeout=30) == 25
        stats = ex.statistics()
    assert stats.start == start, stats.start_note
    if start == "interpreter":
        assert stats.start_note is not None and "CUDA runtime" in stats.start_note
    else:
        assert stats.start_note is None


def _import_pyarrow() -> None:
    import pyarrow  # noqa: F401


def test_an_initializer_importing_pyarrow_still_gets_a_template() -> None:
    """pyarrow starts a jemalloc background thread on import; workers and templates start with
    it turned off (``JE_ARROW_MALLOC_CONF``), so the template can still fork."""
    pytest.importorskip("pyarrow")
    with PrecompileExecutor(1, initializer=_import_pyarrow) as executor:
        executor.warm_up(timeout=120)
        assert executor.submit(crashers.square, 4).result(timeout=30) == 16
        assert executor.statistics().start == "template"
        assert executor.statistics().start_note is None


def test_an_options_cost_hint_orders_a_held_batch_longest_first(make: Make) -> None:
    """``options(cost=)`` is accepted by every backend: in a batch, the longest hint starts
    first (after ``priority``), so code written for one executor runs on the other."""
    order: list[int] = []
    with make(1) as executor:
        executor.warm_up(timeout=30)
        with executor.batch():
            futures = [executor.options(cost=c).submit(crashers.square, c) for c in (1, 3, 2)]
        for f in cf.as_completed(futures, timeout=30):
            order.append(f.result())
        with pytest.raises(ValueError, match="cost"):
            executor.options(cost=-1)
        with pytest.raises(TypeError, match="cost"):
            executor.options(cost="long")
    assert order == [9, 4, 1]
