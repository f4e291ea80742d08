"""Shared fixtures: every test must leave no stray process behind."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import psutil
import pytest

# Long-lived helpers that belong to the process, not to one test.
_HELPER_MARKERS = ("resource_tracker", "signal.SIG_IGN")


def _is_helper(proc: psutil.Process) -> bool:
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True  # gone already
    return any(marker in cmdline for marker in _HELPER_MARKERS)


def _pooled_worker_pids() -> set[int]:
    from precompile_executor import _hub

    hub = _hub.current_hub()
    if hub is None:
        return set()
    with hub.lock:
        return {w.pid for w in hub.workers if w.kind == "spawn" and w.state in ("idle", "starting")}


def stray_processes(timeout_s: float = 10.0) -> list[psutil.Process]:
    """Children of this process that are neither helpers nor idle pooled workers.

    Waits up to ``timeout_s`` for processes that are on their way out (a killed group is
    reaped asynchronously).
    """
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + timeout_s
    while True:
        allowed = _pooled_worker_pids()
        strays = []
        for proc in me.children(recursive=True):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            if proc.pid in allowed or _is_helper(proc):
                continue
            # a child of a pooled worker would be a leaked grandchild: not allowed
            strays.append(proc)
        if not strays or time.monotonic() > deadline:
            return strays
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail a test that leaves a process behind (beyond warm pooled workers and helpers)."""
    yield
    strays = stray_processes()
    if strays:
        details = []
        for proc in strays:
            try:
                details.append(f"{proc.pid}: {' '.join(proc.cmdline())[:120]}")
            except psutil.Error:
                details.append(str(proc.pid))
        for proc in strays:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        pytest.fail("processes leaked by this test:\n" + "\n".join(details))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """At the end, stop every pooled worker and check that nothing at all is left."""
    from precompile_executor import _hub

    hub = _hub.current_hub()
    if hub is not None:
        hub.close()
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [p for p in me.children(recursive=True) if not _is_helper(p)]
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            return
        time.sleep(0.1)
    print(f"\nprocesses left after the session: {[p.pid for p in left]}")
    session.exitstatus = 1
