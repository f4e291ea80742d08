"""Shared fixtures: every test must leave no stray process behind."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

# Long-lived helpers that belong to the process, not to one test.
_HELPER_MARKERS = ("resource_tracker", "signal.SIG_IGN")


# Long-lived process trees a fixture started on purpose (a dask cluster's worker processes): each
# callable returns the roots' pids now; the roots and everything under them are not leaks.
_process_roots: list[Callable[[], set[int]]] = []


def _allowed_trees() -> set[int]:
    pids: set[int] = set()
    for roots in _process_roots:
        for pid in roots():
            pids.add(pid)
            with contextlib.suppress(psutil.Error):
                pids.update(p.pid for p in psutil.Process(pid).children(recursive=True))
    return pids


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
        return {
            w.pid
            for w in hub.workers
            if (w.kind == "spawn" and w.state in ("idle", "starting")) or w.kind == "template"
        }


def stray_processes(timeout_s: float = 10.0) -> list[psutil.Process]:
    """Children of this process that are neither helpers nor idle pooled workers.

    Waits up to ``timeout_s`` for processes that are on their way out (a killed group is
    reaped asynchronously).
    """
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + timeout_s
    while True:
        allowed = _pooled_worker_pids() | _allowed_trees()
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


NODE_THREADS = 2
"""Threads per dask worker in the test cluster: each node runs 2 tasks at once."""


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two dask workers (nodes) on 127.0.0.1, each with its own ``TRITON_CACHE_DIR``.

    Module-scoped: closed, with every process it started, when the module's tests are done. Its
    worker processes (and the node pools under them) are registered as allowed process trees.
    Yields ``(cluster, client, cache_dirs)``.
    """
    pytest.importorskip("distributed")
    import dask
    from distributed import Client, Nanny, Scheduler, SpecCluster

    base = tmp_path_factory.mktemp("nodes")
    cache_dirs = [base / f"node-{i}-triton-cache" for i in range(2)]
    workers = {
        f"node-{i}": {
            "cls": Nanny,
            "options": {
                "nthreads": NODE_THREADS,
                "host": "127.0.0.1",
                "env": {"TRITON_CACHE_DIR": str(cache_dirs[i])},
                "local_directory": str(base / f"node-{i}"),
            },
        }
        for i in range(2)
    }
    scheduler = {
        "cls": Scheduler,
        "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
    }
    # The nanny reads this when it (re)starts a worker process: keep it set for the lifetime.
    with dask.config.set({"distributed.worker.daemon": False}):
        cluster = SpecCluster(workers=workers, scheduler=scheduler, silence_logs=False)
        client = Client(cluster)

        def roots() -> set[int]:
            return {n.pid for n in list(cluster.workers.values()) if getattr(n, "pid", None)}

        _process_roots.append(roots)
        try:
            client.wait_for_workers(2, timeout=60)
            yield cluster, client, cache_dirs
        finally:
            pids = roots()
            client.close()
            cluster.close(timeout=30)
            _process_roots.remove(roots)
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).wait(timeout=10)


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
