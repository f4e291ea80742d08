"""Resource limits and stdlib parity (issue 24): memory limits and admission against memory,
``max_tasks_per_child``, warm workers that hold none of the caller's descriptors, and background
threads and processes that end.

CPython's own ``max_tasks_per_child`` tests, adapted, are in tests/test_limits_cpython.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from precompile_executor import PrecompileExecutor
from precompile_executor._jobs import JobPool

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent
STARTS = ["template", "interpreter"]


def _fresh(scenario: str, *args: Any, timeout_s: float = 90.0) -> Any:
    """Run ``limits_helpers.<scenario>(*args)`` in a fresh interpreter; return its RESULT."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    call = f"import limits_helpers as h; h.{scenario}(*{args!r})"
    proc = subprocess.run(
        [sys.executable, "-c", call],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


# -- fix 1: warm processes hold no descriptor of the caller's -----------------------------------


@pytest.mark.parametrize("start", STARTS)
def test_warm_workers_do_not_hold_the_callers_resource_tracker(start: str) -> None:
    """Stopping the stdlib resource tracker returns while warm workers are still pooled (it
    blocked until their idle timeout: loky hands every child the tracker's pipe)."""
    result = _fresh("resource_tracker_sequence", start)
    assert result == {"value": 3, "stopped": True}


# -- fixes 2 and 3: terminate_workers() leaves no process and no idle thread ---------------------


@pytest.mark.parametrize("start", STARTS)
def test_terminate_workers_leaves_no_process_and_only_the_monitor(start: str) -> None:
    """After faults and ``terminate_workers()``, within 5 s: no process of the executor (the
    warm template included) and no thread beyond the baseline and the monitor."""
    result = _fresh("terminate_leaves_nothing", start)
    assert result["processes"] == [], result
    assert result["threads"] <= 1, result["names"]
    assert result["native"] <= 1, result["names"]
    assert "precompile-monitor" in result["names"]


def test_job_pool_threads_end_when_idle_and_come_back() -> None:
    pool = JobPool(4, "test-pool", idle_s=0.2)
    done = threading.Barrier(5, timeout=30)
    for _ in range(4):
        pool.submit(done.wait)  # four at once: each needs its own thread
    done.wait()
    assert pool.threads() == 4
    end = time.monotonic() + 30
    while pool.threads() and time.monotonic() < end:
        time.sleep(0.02)
    assert pool.threads() == 0
    ran = threading.Event()
    pool.submit(ran.set)
    assert ran.wait(30)
    pool.shutdown(wait=True)
    assert pool.threads() == 0
    with pytest.raises(RuntimeError):
        pool.submit(ran.set)


def test_job_pool_caps_threads_and_queues_the_rest() -> None:
    pool = JobPool(2, "test-pool", idle_s=0.2)
    gate = threading.Event()
    seen: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        gate.wait(30)
        with lock:
            seen.append(i)

    for i in range(6):
        pool.submit(job, i)
    assert pool.threads() == 2
    gate.set()
    pool.shutdown(wait=True)
    assert sorted(seen) == list(range(6))


def test_job_pool_survives_a_raising_job(caplog: pytest.LogCaptureFixture) -> None:
    pool = JobPool(1, "test-pool", idle_s=0.2)
    ran = threading.Event()
    pool.submit(lambda: 1 / 0)
    pool.submit(ran.set)
    assert ran.wait(30)
    pool.shutdown(wait=True)
    assert "ZeroDivisionError" in caplog.text


# -- max_tasks_per_child ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-1, ValueError), ("3", TypeError), (True, TypeError)]
)
def test_max_tasks_per_child_validation(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_tasks_per_child"):
        PrecompileExecutor(1, max_tasks_per_child=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("start", STARTS)
def test_max_tasks_per_child_recycles_and_replaces(start: str) -> None:
    with PrecompileExecutor(2, start=start, max_tasks_per_child=2) as ex:  # type: ignore[arg-type]
        pids = [ex.submit(os.getpid).result(timeout=60) for _ in range(6)]
        stats = ex.statistics()
    # one worker at a time here: each pid serves exactly two tasks
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [2, 2, 2]
    assert stats.worker_restarts == 0  # a recycled worker is not a crash
    assert stats.failed == 0


def test_max_tasks_per_child_workers_are_not_shared_with_other_settings() -> None:
    with PrecompileExecutor(1, max_tasks_per_child=1) as ex:
        recycled = ex.submit(os.getpid).result(timeout=60)
    with PrecompileExecutor(1) as plain:
        pid = plain.submit(os.getpid).result(timeout=60)
        assert plain.submit(os.getpid).result(timeout=60) == pid
    assert pid != recycled
