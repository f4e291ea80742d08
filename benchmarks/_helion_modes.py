"""Helion's two precompile modes, re-implemented minimally (their behaviour, not their code).

* fork mode (:func:`run_forked`): one ``os.fork()`` child per task, at most ``jobs`` at once; the
  child leads a new session, runs the task, writes its result to a file (temp file, fsync,
  ``os.replace``) and leaves with ``os._exit``; the parent reaps it and reads the file.
* spawn mode (:func:`run_spawned`): one fresh interpreter per task that imports torch and
  triton, loads the task from a file, runs it and writes the result the same way.

Both count a task's timeout from its start; on timeout they SIGTERM the child's group, wait
:data:`KILL_GRACE_S`, then SIGKILL the group, as Helion does (compiler grandchildren survive a
plain kill). ``python -m benchmarks._helion_modes JOBS CACHE_DIR CONFIGS_JSON`` runs the fork
mode on a compile batch from a parent that imported torch and triton but never compiled, and prints
``{"wall_s", "failed", "task_s"}`` as one JSON line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

KILL_GRACE_S = 1.0
"""Seconds between SIGTERM and SIGKILL of a timed-out child's group (the library's value)."""

Call = tuple[Callable[..., Any], tuple[Any, ...]]

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPAWN_CHILD = """
import pickle, sys
for name in sys.argv[3:]:
    __import__(name)
with open(sys.argv[1], "rb") as f:
    fn, args = pickle.load(f)
from benchmarks._helion_modes import run_and_write
run_and_write(fn, args, sys.argv[2])
"""


@dataclasses.dataclass
class Outcome:
    """How one task ended: ``error`` is ``"TypeName: message"`` or why there is no result;
    ``started``/``ended`` are ``time.monotonic()`` at the child's start and at the outcome."""

    ok: bool
    value: Any = None
    error: str = ""
    timed_out: bool = False
    exit_code: int | None = None
    started: float = 0.0
    ended: float = 0.0


@dataclasses.dataclass
class _Child:
    pid: int
    result_path: str
    started: float
    popen: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None


def run_and_write(fn: Callable[..., Any], args: tuple[Any, ...], result_path: str) -> None:
    """Child side: run ``fn(*args)``, write its outcome atomically, leave without cleanup."""
    status = 0
    try:
        try:
            message: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - report any failure as a result
            status, message = 1, ("error", f"{type(exc).__name__}: {exc}")
        with open(f"{result_path}.tmp", "wb") as f:
            pickle.dump(message, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f"{result_path}.tmp", result_path)
    except BaseException:  # noqa: BLE001
        status = 70
    finally:
        os._exit(status)


def _start_fork(call: Call, result_path: str) -> _Child:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()  # or the child would print the parent's buffered output again
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        with contextlib.suppress(OSError):
            os.setsid()
        run_and_write(call[0], call[1], result_path)
    return _Child(pid, result_path, started)


def _start_spawn(call: Call, result_path: str, imports: Sequence[str]) -> _Child:
    request = f"{result_path}.request"
    with open(request, "wb") as f:
        pickle.dump(call, f)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
    started = time.monotonic()
    popen = subprocess.Popen(
        [sys.executable, "-c", _SPAWN_CHILD, request, result_path, *imports],
        env=env,
        cwd=_REPO_ROOT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return _Child(popen.pid, result_path, started, popen=popen)


def _exited(child: _Child, block: bool = False) -> int | None:
    """The child's exit status if it has exited (reaping it), else ``None``."""
    if child.popen is not None:
        return child.popen.wait() if block else child.popen.poll()
    try:
        pid, status = os.waitpid(child.pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status) if pid else None


def _kill_group(child: _Child, grace_s: float) -> int | None:
    """SIGTERM the child's group, wait ``grace_s``, SIGKILL the group; reap; return its status."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    end = time.monotonic() + grace_s
    code = None
    while code is None and time.monotonic() < end:
        code = _exited(child)
        time.sleep(0 if code is not None else 0.005)
    # Even once the leader is gone, grandchildren in its group may not be.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    return code if code is not None else _exited(child, block=True)


def _read_result(child: _Child, code: int | None) -> Outcome:
    try:
        with open(child.result_path, "rb") as f:
            kind, payload = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return Outcome(
            False, error=f"no result from the child (exit status {code})", exit_code=code
        )
    if kind == "ok":
        return Outcome(True, payload, exit_code=code)
    return Outcome(False, error=payload, exit_code=code)


def _run(
    calls: Sequence[Call], jobs: int, timeout: float | None, start: Callable[[Call, str], _Child]
) -> list[Outcome]:
    scratch = tempfile.mkdtemp(prefix="bench-helion-mode-")
    queue = deque(enumerate(calls))
    running: dict[int, _Child] = {}
    outcomes = [Outcome(False, error="never ran") for _ in calls]

    def finish(i: int, outcome: Outcome) -> None:
        child = running.pop(i)
        if child.pidfd is not None:
            os.close(child.pidfd)
        outcome.started, outcome.ended = child.started, time.monotonic()
        outcomes[i] = outcome

    try:
        while queue or running:
            while queue and len(running) < jobs:
                i, call = queue.popleft()
                running[i] = child = start(call, os.path.join(scratch, f"{i}.result"))
                with contextlib.suppress(AttributeError, OSError):  # no pidfd: poll
                    child.pidfd = os.pidfd_open(child.pid)
            wait_s = 0.002
            if timeout is not None:
                next_deadline = min(c.started + timeout for c in running.values())
                wait_s = max(0.0, next_deadline - time.monotonic())
            fds = [c.pidfd for c in running.values() if c.pidfd is not None]
            if len(fds) == len(running):
                select.select(fds, [], [], None if timeout is None else wait_s)
            else:
                time.sleep(min(wait_s, 0.002))
            now = time.monotonic()
            for i, child in list(running.items()):
                if (code := _exited(child)) is not None:
                    finish(i, _read_result(child, code))
                elif timeout is not None and now >= child.started + timeout:
                    code = _kill_group(child, KILL_GRACE_S)
                    finish(i, Outcome(False, error="timeout", timed_out=True, exit_code=code))
    finally:
        for i in list(running):  # an exception or Ctrl-C: leave nothing behind
            _kill_group(running[i], 0)
            finish(i, Outcome(False, error="interrupted"))
        shutil.rmtree(scratch, ignore_errors=True)
    return outcomes


def run_forked(calls: Sequence[Call], jobs: int, timeout: float | None = None) -> list[Outcome]:
    """Run each call in its own forked child, at most ``jobs`` at once (Helion's fork mode)."""
    return _run(calls, jobs, timeout, _start_fork)


def run_spawned(
    calls: Sequence[Call],
    jobs: int,
    timeout: float | None = None,
    imports: Sequence[str] = ("torch", "triton"),
) -> list[Outcome]:
    """Run each call (picklable by reference) in a fresh interpreter that first imports
    ``imports``, at most ``jobs`` at once (Helion's spawn mode)."""
    return _run(calls, jobs, timeout, lambda call, path: _start_spawn(call, path, imports))


def main(argv: list[str]) -> int:
    """The cold parent: see the module docstring."""
    jobs, cache_dir, cfgs = int(argv[0]), argv[1], json.loads(argv[2])
    import torch  # noqa: F401 - the autotuner's parent has torch loaded
    import triton  # noqa: F401

    from ._kernels import compile_config

    start = time.perf_counter()
    outcomes = run_forked([(compile_config, (tuple(cfg), cache_dir)) for cfg in cfgs], jobs)
    wall = time.perf_counter() - start
    task_s = [o.value["elapsed_s"] for o in outcomes if o.ok]
    print(json.dumps({"wall_s": wall, "failed": sum(not o.ok for o in outcomes), "task_s": task_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
