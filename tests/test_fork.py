"""The fork path: unpicklable callables in forked children, with the pool's guarantees."""

from __future__ import annotations

import os
import threading
import time

import crashers
import pytest

from precompile_executor import CudaInForkError, PrecompileExecutor, RemoteError

pytestmark = pytest.mark.timeout(60)


def test_unpicklable_closure_over_a_lock_runs_on_the_fork_path() -> None:
    lock = threading.Lock()

    def uses_lock(x: int) -> tuple[int, int]:
        with lock:
            return x + 1, os.getpid()

    with PrecompileExecutor(2, path="fork") as executor:
        value, pid = executor.submit(uses_lock, 41).result(timeout=30)
        assert value == 42
        assert pid != os.getpid()
        stats = executor.statistics()
        assert stats.fork_tasks == 1 and stats.spawn_tasks == 0


def test_closure_over_a_triton_kernel_runs_on_the_fork_path() -> None:
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def add_one(ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(ptr + offs, tl.load(ptr + offs, mask=offs < n) + 1, mask=offs < n)

    def inspect_kernel() -> str:
        return add_one.fn.__name__ + ":" + str(len(add_one.src) > 0)

    with PrecompileExecutor(1) as executor:
        with pytest.raises(TypeError):
            import cloudpickle

            cloudpickle.dumps(add_one)  # why the fork path exists
        assert (
            executor.options(path="fork").submit(inspect_kernel).result(timeout=30)
            == "add_one:True"
        )


def test_auto_falls_back_to_fork_only_when_serialization_fails() -> None:
    lock = threading.Lock()
    with PrecompileExecutor(2, path="auto") as executor:
        assert executor.submit(crashers.square, 3).result(timeout=30) == 9
        assert executor.statistics().spawn_tasks == 1
        assert executor.submit(lambda l: l.locked(), lock).result(timeout=30) is False
        stats = executor.statistics()
        assert (stats.spawn_tasks, stats.fork_tasks) == (1, 1)


def test_concurrency_cap_holds_across_both_paths() -> None:
    def interval() -> tuple[float, float]:
        start = time.time()
        time.sleep(0.4)
        return start, time.time()

    with PrecompileExecutor(2) as executor:
        executor.warm_up(timeout=60)
        futures = [executor.submit(interval) for _ in range(3)]
        futures += [executor.options(path="fork").submit(interval) for _ in range(3)]
        spans = [f.result(timeout=60) for f in futures]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak <= 2


@pytest.mark.parametrize("path", ["spawn", "fork"])
def test_large_result_comes_back(path: str) -> None:
    size = 48 * 1024 * 1024
    with PrecompileExecutor(1, path=path) as executor:  # type: ignore[arg-type]
        data = executor.submit(os.urandom, size).result(timeout=60)
    assert isinstance(data, bytes) and len(data) == size


def test_cuda_initialization_in_a_forked_child_fails_clearly() -> None:
    torch = pytest.importorskip("torch")

    def touches_cuda() -> None:
        torch.cuda.init()

    with PrecompileExecutor(1, path="fork") as executor:
        error = executor.submit(touches_cuda).exception(timeout=30)
        assert isinstance(error, CudaInForkError)
        assert isinstance(error, RemoteError)
        assert "spawn" in str(error)
        lazy = executor.submit(lambda: torch.cuda._lazy_init()).exception(timeout=30)
        assert isinstance(lazy, CudaInForkError)
        # the parent's torch was not touched
        assert not torch.cuda.is_initialized()
        assert executor.submit(crashers.square, 5).result(timeout=30) == 25


def test_fork_child_sees_parent_state_at_submit_time() -> None:
    state = {"value": 1}
    with PrecompileExecutor(1, path="fork") as executor:
        state["value"] = 2
        assert executor.submit(lambda: state["value"]).result(timeout=30) == 2


def test_completed_future_costs_no_process() -> None:
    from precompile_executor import completed_future, wait_for_all

    with PrecompileExecutor(1) as executor:
        batch = [completed_future(True), executor.submit(crashers.square, 2)]
        assert wait_for_all(batch, progress=False) == [True, True]
        assert executor.statistics().spawn_tasks == 1
