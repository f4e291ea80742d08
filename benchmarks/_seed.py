"""Helion's two precompile modes, re-implemented minimally (their behaviour, not their code).

* **fork mode** (:func:`run_forked`): one ``os.fork()`` child per task, at most ``jobs`` at once.
  The child leads a new session, runs the task, writes its result to a file (temp file, fsync,
  ``os.replace``) and leaves with ``os._exit``; the parent waits for it and reads the file.
* **spawn mode** (:func:`run_spawned`): one fresh interpreter per task (``python -c``) that
  imports torch and triton, loads the task from a file, runs it and writes the result the same
  way.

Both count a task's timeout from its start, and on timeout send SIGTERM to the child's process
group, wait :data:`KILL_GRACE_S`, then SIGKILL the group — as Helion does since it learnt that
compiler grandchildren survive a plain kill.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
import os, pickle, sys
request, result = sys.argv[1], sys.argv[2]
for name in sys.argv[3:]:
    __import__(name)
with open(request, "rb") as f:
    fn, args = pickle.load(f)
from benchmarks._seed import run_and_write
run_and_write(fn, args, result)
"""


@dataclasses.dataclass
class Outcome:
    """How one task ended.

    Attributes:
        ok: it returned a value.
        value: that value.
        error: ``"TypeName: message"`` of its exception, or why there was no result.
        timed_out: it was killed at its deadline.
        exit_code: the child's exit status (negative: killed by that signal).
        started: ``time.monotonic()`` when the child was started.
        ended: ``time.monotonic()`` when the parent had the outcome.
    """

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


def write_result(path: str, message: tuple[str, Any]) -> None:
    """Write ``message`` to ``path`` atomically: a reader sees all of it or nothing."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(message, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_and_write(fn: Callable[..., Any], args: tuple[Any, ...], result_path: str) -> None:
    """Child side: run ``fn(*args)``, write its outcome, and leave without cleanup."""
    status = 0
    try:
        try:
            message: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - report any failure as a result
            status = 1
            message = ("error", f"{type(exc).__name__}: {exc}")
        write_result(result_path, message)
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
    if pid == 0:  # the child
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


def _open_pidfd(child: _Child) -> None:
    with contextlib.suppress(AttributeError, OSError):  # no pidfd: fall back to polling
        child.pidfd = os.pidfd_open(child.pid)


def _exited(child: _Child) -> int | None:
    """The child's exit status if it has exited (reaping it), else ``None``."""
    if child.popen is not None:
        return child.popen.poll()
    try:
        pid, status = os.waitpid(child.pid, os.WNOHANG)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status) if pid else None


def _reap(child: _Child) -> int | None:
    if child.popen is not None:
        return child.popen.wait()
    try:
        _, status = os.waitpid(child.pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)


def _kill_group(child: _Child, grace_s: float) -> int | None:
    """SIGTERM the child's group, wait ``grace_s``, SIGKILL the group; reap; return its status."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        code = _exited(child)
        if code is not None:
            # The leader is gone; grandchildren in its group may not be.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            return code
        time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    return _reap(child)


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
    calls: Sequence[Call],
    jobs: int,
    timeout: float | None,
    start: Callable[[Call, str], _Child],
) -> list[Outcome]:
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    scratch = tempfile.mkdtemp(prefix="bench-seed-")
    queue = deque(enumerate(calls))
    running: dict[int, _Child] = {}
    outcomes: list[Outcome | None] = [None] * len(calls)

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
                child = start(call, os.path.join(scratch, f"{i}.result"))
                _open_pidfd(child)
                running[i] = child
            now = time.monotonic()
            wait_s = 0.002
            if timeout is not None:
                wait_s = max(0.0, min(c.started + timeout for c in running.values()) - now)
            fds = [c.pidfd for c in running.values() if c.pidfd is not None]
            if len(fds) == len(running):
                select.select(fds, [], [], None if timeout is None else wait_s)
            else:
                time.sleep(min(wait_s, 0.002))
            now = time.monotonic()
            for i, child in list(running.items()):
                code = _exited(child)
                if code is not None:
                    finish(i, _read_result(child, code))
                elif timeout is not None and now >= child.started + timeout:
                    code = _kill_group(child, KILL_GRACE_S)
                    finish(i, Outcome(False, error="timeout", timed_out=True, exit_code=code))
    finally:
        for i in list(running):  # an exception or Ctrl-C: leave nothing behind
            _kill_group(running[i], 0)
            finish(i, Outcome(False, error="interrupted"))
        shutil.rmtree(scratch, ignore_errors=True)
    return [o if o is not None else Outcome(False, error="never ran") for o in outcomes]


def run_forked(calls: Sequence[Call], jobs: int, timeout: float | None = None) -> list[Outcome]:
    """Run each call in its own forked child, at most ``jobs`` at once (Helion's fork mode)."""
    return _run(calls, jobs, timeout, _start_fork)


def run_spawned(
    calls: Sequence[Call],
    jobs: int,
    timeout: float | None = None,
    imports: Sequence[str] = ("torch", "triton"),
) -> list[Outcome]:
    """Run each call in a fresh interpreter that first imports ``imports`` (Helion's spawn mode).

    The calls must be picklable by reference (module-level functions of an importable module).
    """
    return _run(calls, jobs, timeout, lambda call, path: _start_spawn(call, path, imports))
