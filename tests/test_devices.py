"""Device pinning and sticky-error retirement, simulated without a GPU."""

from __future__ import annotations

import collections
import os
import time

import pytest

from precompile_executor import PrecompileExecutor, RemoteError, worker_device

pytestmark = pytest.mark.timeout(90)


def _visible(delay: float = 0.0) -> tuple[str | None, str | None, int]:
    time.sleep(delay)
    return os.environ.get("CUDA_VISIBLE_DEVICES"), worker_device(), os.getpid()


def test_workers_are_pinned_evenly_and_concurrent_tasks_spread() -> None:
    with PrecompileExecutor(4, devices=[0, 1]) as executor:
        executor.warm_up(timeout=60)
        seen = [f.result(timeout=30) for f in [executor.submit(_visible, 0.5) for _ in range(4)]]
        assert sorted(d for _, d, _ in seen) == ["0", "0", "1", "1"]
        seen += [executor.submit(_visible).result(timeout=30) for _ in range(6)]
    per_device = collections.defaultdict(set)
    for visible, device, pid in seen:
        assert visible == device
        per_device[device].add(pid)
    assert set(per_device) == {"0", "1"}
    assert all(len(pids) <= 2 for pids in per_device.values())


def test_unpinned_workers_see_the_parent_environment() -> None:
    with PrecompileExecutor(1) as executor:
        visible, device, _ = executor.submit(_visible).result(timeout=30)
    assert device is None
    assert visible == os.environ.get("CUDA_VISIBLE_DEVICES")


def _sticky() -> None:
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_sticky_cuda_error_retires_only_that_worker_and_keeps_balance() -> None:
    with PrecompileExecutor(2, devices=[0, 1]) as executor:
        before = executor.warm_up(timeout=60)
        error = executor.submit(_sticky).exception(timeout=30)
        assert isinstance(error, RuntimeError) and isinstance(error, RemoteError)
        assert "illegal memory access" in str(error)
        bad_pid = error.worker_pid
        after = executor.warm_up(timeout=60)
        assert bad_pid not in after
        assert len(set(before) & set(after)) == 1  # the other worker was untouched
        stats = executor.statistics()
        assert stats.worker_restarts == 1 and stats.crashed == 0 and stats.failed == 1
        devices = sorted(executor.submit(_visible).result(timeout=30)[1] for _ in range(1))
        assert devices[0] in {"0", "1"}
        pinned = {executor.submit(_visible).result(timeout=30)[1] for _ in range(8)}
        assert pinned <= {"0", "1"}


@pytest.mark.parametrize("bad", ["", [], [0, 0], [-1], "0", [1.5]])
def test_bad_devices(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="devices"):
        PrecompileExecutor(2, devices=bad)  # type: ignore[arg-type]


def _not_sticky() -> None:
    raise RuntimeError(
        "CUDA error: invalid device ordinal\nCompile with `TORCH_USE_CUDA_DSA` to enable "
        "device-side assertions."
    )


def test_a_non_sticky_cuda_error_keeps_its_worker() -> None:
    with PrecompileExecutor(1) as executor:
        (pid,) = executor.warm_up(timeout=60)
        error = executor.submit(_not_sticky).exception(timeout=30)
        assert isinstance(error, RuntimeError) and error.worker_pid == pid  # type: ignore[attr-defined]
        assert executor.submit(os.getpid).result(timeout=30) == pid
        assert executor.statistics().worker_restarts == 0


def _import_torch() -> None:
    import torch  # noqa: F401


def _cuda_state() -> tuple[str | None, bool, bool]:
    import torch

    return worker_device(), torch.cuda.is_available(), torch.cuda.is_initialized()


@pytest.mark.timeout(180)
def test_a_pinned_worker_without_a_usable_gpu_still_starts_and_serves() -> None:
    """Pinned workers open their CUDA context as they start; where CUDA cannot work (no GPU, a
    CPU build of torch) that attempt is dropped and the worker serves as usual."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks a machine without a GPU (tests/test_gpu.py covers the other)")
    with PrecompileExecutor(1, devices=[0], initializer=_import_torch, timeout=60) as ex:
        ex.warm_up(timeout=120)
        device, available, initialized = ex.submit(_cuda_state).result(timeout=60)
        assert ex.submit(os.getpid).result(timeout=60) > 0
    assert (device, available, initialized) == ("0", False, False)
