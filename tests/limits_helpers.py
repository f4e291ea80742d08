"""Tasks and fresh-interpreter scenarios for tests/test_limits.py.

Scenarios that count the process's threads or stop its resource tracker run in a fresh
interpreter (``python -c "import limits_helpers as h; h.<scenario>(...)"``), so nothing the test
session started before counts; each prints one ``RESULT <json>`` line for the test to check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

import psutil

MIB = 1 << 20


def private_bytes() -> int:
    """This process's private resident memory now (USS, from ``smaps_rollup``)."""
    total = 0
    with open("/proc/self/smaps_rollup", "rb") as f:
        for line in f.read().splitlines():
            if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def allocate(total_bytes: int, step_bytes: int = 8 * MIB, hold_s: float = 30.0) -> int:
    """Allocate ``total_bytes`` in steps, touching every page; print this process's private
    memory before, then a wall-clock stamp and the total after each step (so a test can tell
    when a limit was crossed), then hold it."""
    print(f"BASELINE {private_bytes()}", flush=True)
    chunks = []
    done = 0
    while done < total_bytes:
        chunks.append(b"\x01" * step_bytes)  # written, so resident: not a lazily-zeroed mapping
        done += step_bytes
        print(f"ALLOCATED {time.time():.6f} {done}", flush=True)
    time.sleep(hold_s)
    return done


def allocate_in_grandchild(total_bytes: int) -> int:
    """Allocate ``total_bytes`` in a fresh interpreter this task starts (a compiler would)."""
    print(f"BASELINE {private_bytes()}", flush=True)
    code = "import sys, limits_helpers as h; h.allocate(int(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    subprocess.run([sys.executable, "-c", code, str(total_bytes)], env=env, check=True)
    return total_bytes


def hold_memory(n_bytes: int, seconds: float) -> tuple[int, float, float]:
    """Hold ``n_bytes`` of written memory for ``seconds``; return this worker's pid and when
    the task started and ended (wall clock)."""
    start = time.time()
    block = b"\x01" * n_bytes
    time.sleep(seconds)
    del block
    return os.getpid(), start, time.time()


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def _result(value: Any) -> None:
    print("RESULT " + json.dumps(value), flush=True)


def _executor_processes(me: psutil.Process) -> list[str]:
    """This process's children that are the executor's (not the guardian, not a tracker)."""
    alive = []
    for proc in me.children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "signal.SIG_IGN" in cmd:
            continue
        alive.append(f"{proc.pid} {proc.name()} {cmd[:60]}")
    return alive


def terminate_leaves_nothing(start: str) -> None:
    """Faults on two workers, then ``terminate_workers()``: report the executor's processes and
    the thread count (``threading`` and the kernel's) seen within the kill path's own bound after
    it returns (``_process.KILL_GRACE_S`` + 10 s), and the stacks of executor threads left."""
    from precompile_executor import PrecompileExecutor
    from precompile_executor._process import KILL_GRACE_S

    baseline = threading.active_count()
    native_baseline = len(os.listdir("/proc/self/task"))
    me = psutil.Process()
    ex = PrecompileExecutor(2, start=start)  # type: ignore[arg-type]
    futures = [ex.submit(abs, -i) for i in range(40)]
    futures.append(ex.submit(segfault))
    futures.append(ex.options(timeout=0.5).submit(time.sleep, 30))
    futures += [ex.submit(abs, -i) for i in range(40)]
    futures.append(ex.options(path="fork").submit(abs, -1))
    # a memory kill, and the memory watcher's thread, which must end too
    futures.append(ex.options(memory_limit=64 * MIB).submit(allocate, 256 * MIB))
    for future in futures:
        future.exception(timeout=60)
    # a replacement worker still starting when terminate_workers() runs must not survive it
    futures.append(ex.submit(segfault))
    futures[-1].exception(timeout=60)
    ex.terminate_workers()
    # A kill job may run KILL_GRACE_S plus kill_group's 5 s wait for a SIGKILLed member that is
    # slow to die (a task still faulting in memory); leftovers past that are leaks.
    end = time.monotonic() + KILL_GRACE_S + 10.0
    while True:
        procs = _executor_processes(me)
        threads = threading.active_count() - baseline
        native = len(os.listdir("/proc/self/task")) - native_baseline
        # the two that live for the process's life: the monitor and the dropped executors'
        if (not procs and threads <= 2 and native <= 2) or time.monotonic() > end:
            break
        time.sleep(0.05)
    names = sorted(t.name for t in threading.enumerate())
    frames = sys._current_frames()
    stacks = {  # what a thread that did not end was doing
        t.name: "".join(traceback.format_stack(frames[t.ident])[-4:])
        for t in threading.enumerate()
        if t.ident in frames and t.name.startswith("precompile-job")
    }
    _result(
        {"processes": procs, "threads": threads, "native": native, "names": names, "stacks": stacks}
    )
    os._exit(0)


def resource_tracker_sequence(start: str) -> None:
    """CPython's test-harness sequence: start the stdlib resource tracker, run a task, then stop the
    tracker (as CPython's test harness does at teardown); report whether the stop returned."""
    import multiprocessing.resource_tracker as rt

    from precompile_executor import PrecompileExecutor

    rt.ensure_running()
    with PrecompileExecutor(2, start=start) as ex:  # type: ignore[arg-type]
        value = ex.submit(abs, -3).result(timeout=60)
    stopper = threading.Thread(target=rt._resource_tracker._stop, daemon=True)
    stopper.start()
    stopper.join(30)
    _result({"value": value, "stopped": not stopper.is_alive()})
    os._exit(0)
