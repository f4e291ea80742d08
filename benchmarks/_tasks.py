"""Module-level task functions every pool can run (stdlib pickle finds them by name).

This module imports neither torch nor triton: a no-op task must not pay for them. The
initializer :func:`import_torch_triton` is what a real autotuner's workers would run.
``time.monotonic`` is the system-wide CLOCK_MONOTONIC on Linux: the parent compares a task's
stamps with its own clock.
"""

from __future__ import annotations

import ctypes
import faulthandler
import fcntl
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
    """Return ``x``: a pool's per-task overhead is the time this takes end to end."""
    return x


def getpid(delay_s: float = 0.0) -> int:
    """Sleep ``delay_s``, then return this process's pid (which worker ran a task)."""
    time.sleep(delay_s)
    return os.getpid()


def now() -> float:
    """``time.monotonic()`` as this task starts in its worker."""
    return time.monotonic()


def stamp_then_sigkill(path: str) -> None:
    """Write ``time.monotonic()`` to ``path``, then SIGKILL this worker (as the OOM killer)."""
    with open(path, "w") as f:
        f.write(repr(time.monotonic()))
    crash("sigkill")


def imported_then(module: str, fn: Any, *args: Any) -> Any:
    """Import ``module``, then return ``fn(*args)``: a task from a module the worker had not
    imported yet (unpickling it imports that module first, in every new worker)."""
    importlib.import_module(module)
    return fn(*args)


def import_torch_triton(label: str = "") -> None:
    """Worker initializer: import what an autotuner's compile worker needs. ``label`` only makes
    the initializer arguments differ, so an executor gets workers of its own, not pooled ones."""
    import torch  # noqa: F401
    import triton  # noqa: F401


def import_torch_triton_pinned(counter_path: str) -> None:
    """Worker initializer: pin this worker to the next usable core (round robin, counted in
    ``counter_path`` under a file lock; ptxas inherits it), then import torch and triton."""
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


def crash(how: str = "abort") -> None:
    """Kill this process: ``"abort"`` (SIGABRT, like a failed assert in C) or ``"sigkill"``;
    no core file, no stack dump in the benchmark's output."""
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):
        pass
    faulthandler.disable()
    if how == "abort":
        os.abort()
    os.kill(os.getpid(), signal.SIGKILL)


def hang(how: str = "c") -> None:
    """Never return: ``"python"``, a busy loop; ``"c"``, ``sleep()`` in C with the GIL held
    (``ctypes.PyDLL``: no Python timer or signal handler runs); ``"ignore-term"``, ignore
    SIGTERM, then sleep (only SIGKILL ends it, as with a stubborn compiler)."""
    if how == "python":
        while True:
            pass
    if how == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1.0)
    ctypes.PyDLL(None).sleep(FOREVER_S)


def hang_with_grandchild(how: str, info_path: str) -> None:
    """Start a ``sleep`` grandchild in this process's group (as ptxas would be), write
    ``{"start", "pid", "grandchild"}`` to ``info_path``, then :func:`hang`."""
    start = time.monotonic()
    child = subprocess.Popen(["sleep", str(FOREVER_S)], stdin=subprocess.DEVNULL)
    with open(f"{info_path}.tmp", "w") as f:
        json.dump({"start": start, "pid": os.getpid(), "grandchild": child.pid}, f)
    os.replace(f"{info_path}.tmp", info_path)
    hang(how)
