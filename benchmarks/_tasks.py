"""Module-level task functions that every pool can run (stdlib pickle finds them by name).

This module imports neither torch nor triton: a no-op task must not pay for them. The
initializer :func:`import_torch_triton` is what a real autotuner's workers would run.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import resource
import signal
import subprocess
import time
from typing import Any

FOREVER_S = 100_000
"""How long a "hang" sleeps: longer than any benchmark, so only a kill ends it."""


def noop(x: Any = None) -> Any:
    """Return ``x``: the per-task overhead of a pool is the time this takes end to end."""
    return x


def getpid(delay_s: float = 0.0) -> int:
    """Sleep ``delay_s`` then return this process's pid (to see which worker ran a task)."""
    if delay_s:
        time.sleep(delay_s)
    return os.getpid()


def now() -> float:
    """Return ``time.monotonic()`` as this task starts: system-wide on Linux, so the parent can
    compare it with its own clock (when did the task start on its worker?)."""
    return time.monotonic()


def stamp_then_sigkill(path: str) -> None:
    """Write ``time.monotonic()`` to ``path``, then SIGKILL this worker (what the OOM killer
    does): the parent learns when the worker died."""
    with open(path, "w") as f:
        f.write(repr(time.monotonic()))
    crash("sigkill")


def imported_then(module: str, fn: Any, *args: Any) -> Any:
    """Import ``module``, then return ``fn(*args)``: a task whose own module the worker had not
    imported yet (unpickling it imports that module first, in every new worker)."""
    importlib.import_module(module)
    return fn(*args)


def import_torch_triton(label: str = "") -> None:
    """Worker initializer: import what an autotuner's compile worker needs.

    ``label`` only makes the initializer arguments differ, so that a PrecompileExecutor given
    ``initargs=("probe",)`` gets workers of its own instead of the pooled warm ones.
    """
    import torch  # noqa: F401
    import triton  # noqa: F401


def _no_core_dump() -> None:
    # A benchmark that aborts on purpose must not write a core file per crash.
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):
        pass


def crash(how: str = "abort") -> None:
    """Kill this process: ``"abort"`` (SIGABRT, like a failed assert in C) or ``"sigkill"``."""
    _no_core_dump()
    faulthandler.disable()  # a deliberate crash needs no stack dump in the benchmark's output
    if how == "abort":
        os.abort()
    os.kill(os.getpid(), signal.SIGKILL)


def hang(how: str = "c") -> None:
    """Never return.

    ``"python"``: a pure-Python busy loop. ``"c"``: ``sleep()`` in C with the GIL held (through
    ``ctypes.PyDLL``), so no Python-level timer or signal handler can run. ``"ignore-term"``:
    ignore SIGTERM first, then sleep — only SIGKILL ends it, as with a stubborn compiler.
    """
    if how == "python":
        while True:
            pass
    if how == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1.0)
    ctypes.PyDLL(None).sleep(FOREVER_S)


def hang_with_grandchild(how: str, info_path: str) -> None:
    """Start a ``sleep`` grandchild, record when this task started, then :func:`hang`.

    Writes ``{"start": time.monotonic(), "pid": ..., "grandchild": ...}`` to ``info_path``.
    ``time.monotonic`` is the system-wide CLOCK_MONOTONIC on Linux, so the parent can compare it
    with its own clock. The grandchild stays in this process's group, as ptxas would.
    """
    start = time.monotonic()
    child = subprocess.Popen(["sleep", str(FOREVER_S)], stdin=subprocess.DEVNULL)
    tmp = f"{info_path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"start": start, "pid": os.getpid(), "grandchild": child.pid}, f)
    os.replace(tmp, info_path)
    hang(how)


def import_torch_triton_pinned(counter_path: str) -> None:
    """Worker initializer: pin this worker to one core (the next one, round robin over the
    usable cores, counted in ``counter_path`` under a file lock), then import torch and triton.

    Compiler subprocesses (ptxas) inherit the pinning.
    """
    import fcntl

    cores = sorted(os.sched_getaffinity(0))
    with open(counter_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read() or 0)
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
    os.sched_setaffinity(0, {cores[n % len(cores)]})
    import_torch_triton()
