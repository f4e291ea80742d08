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


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    """``proc.children(recursive=True)``, read again when psutil's parse fails.

    psutil parses ``/proc/<pid>/stat`` (of every process, for the pid → ppid map); in two full
    suite runs one read came back without its fields and psutil 7 raised ``IndexError`` — once
    for another process, once for this one — in the teardown of
    ``test_initializer_failure_breaks_the_executor_with_a_clear_error[local]``, which leaks
    nothing (it passes alone and in its file; cause not found). A failed read says nothing about
    leaks, so it is retried.
    """
    for attempt in range(5):
        try:
            return proc.children(recursive=True)
        except (IndexError, ValueError):
            if attempt == 4:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _allowed_trees() -> set[int]:
    pids: set[int] = set()
    for roots in _process_roots:
        for pid in roots():
            pids.add(pid)
            with contextlib.suppress(psutil.Error):
                pids.update(p.pid for p in _descendants(psutil.Process(pid)))
    return pids


def _is_helper(proc: psutil.Process) -> bool:
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True  # gone already
    return any(marker in cmdline for marker in _HELPER_MARKERS)


def _pooled_worker_pids() -> set[int]:
    from precompile_executor import _processes

    hub = _processes.current_hub()
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
    reaped asynchronously). A scan that psutil could not parse is made again (see
    :func:`_descendants`).
    """
    for attempt in range(20):
        try:
            return _stray_processes(timeout_s)
        except (IndexError, ValueError):
            if attempt == 19:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _stray_processes(timeout_s: float) -> list[psutil.Process]:
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + timeout_s
    while True:
        allowed = _pooled_worker_pids() | _allowed_trees()
        strays = []
        for proc in _descendants(me):
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


@pytest.fixture(scope="module")
def release_idle_workers() -> Iterator[None]:
    """After the module's tests, stop the warm workers left idle in the process's pool, so they
    end with the module that started them (``pytestmark = pytest.mark.usefixtures(...)``)."""
    yield
    from precompile_executor import stop_idle_workers

    stop_idle_workers()


@pytest.fixture
def triton_compiles_in_workers_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only the executor's workers compile a tune's configs: the tune's thread steals none from a
    cold queue (``STEALS``), and no import task joins the counts (``PREIMPORTS``); afterwards the
    Triton integration's state is reset: no block, installation or default executor is left."""
    from precompile_executor import triton as pe_triton
    from precompile_executor.triton import _autotune_tune, _preimport

    monkeypatch.setattr(_autotune_tune, "STEALS", False)
    monkeypatch.setattr(_preimport, "PREIMPORTS", False)
    yield
    pe_triton.state.reset()


@pytest.fixture
def fresh_helion_state() -> Iterator[None]:
    """The Helion integration's state as if it was never used (no default executor built, no
    caller warm-up started: ``state.reset()``); afterwards its default executor's workers and
    their warm template are stopped (``state.reset()`` ends them with ``terminate_workers()``),
    so they end within this test: left warm in the pool, they would end in whichever later test
    stops idle workers, and that test's leak check would meet them still exiting."""
    import precompile_executor.helion as peh

    peh.state.reset()
    try:
        yield
    finally:
        peh.state.reset()


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` in this process for the test, then the old handler.

    A test that interrupts the suite's own process (a timer thread's ``os.kill(os.getpid(),
    SIGINT)``, ``_thread.interrupt_main()``) needs Python's handler, which Python does not
    install when it starts with SIGINT ignored — as it does under ``pytest &``, ``nohup`` and
    some CI runners (https://docs.python.org/3/library/signal.html#note-on-signal-handlers-and-exceptions).
    """
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
    with dask_spec_cluster(tmp_path_factory.mktemp("nodes"), 2) as started:
        yield started


@contextlib.contextmanager
def dask_spec_cluster(
    base: Any, n_nodes: int, node_options: Callable[[int], dict[str, Any]] | None = None
) -> Iterator[Any]:
    """A ``SpecCluster`` of ``n_nodes`` dask workers (``node-0``…) and its scheduler, all on
    127.0.0.1, each worker with its own ``TRITON_CACHE_DIR`` under ``base`` and
    ``NODE_THREADS`` threads; ``node_options(i)`` adds to node ``i``'s ``Nanny`` options.
    Yields ``(cluster, client, cache_dirs)``; on exit every process it started is gone.
    """
    import dask
    from distributed import Client, Nanny, Scheduler, SpecCluster

    cache_dirs = [base / f"node-{i}-triton-cache" for i in range(n_nodes)]
    workers = {
        f"node-{i}": {
            "cls": Nanny,
            "options": {
                "nthreads": NODE_THREADS,
                "host": "127.0.0.1",
                "env": {"TRITON_CACHE_DIR": str(cache_dirs[i])},
                "local_directory": str(base / f"node-{i}"),
                **(node_options(i) if node_options is not None else {}),
            },
        }
        for i in range(n_nodes)
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
            client.wait_for_workers(n_nodes, timeout=60)
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
    from precompile_executor import _processes

    hub = _processes.current_hub()
    if hub is not None:
        hub.close()
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [p for p in _descendants(me) if not _is_helper(p)]
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            return
        time.sleep(0.1)
    print(f"\nprocesses left after the session: {[p.pid for p in left]}")
    session.exitstatus = 1


RAY_NODE_CPUS = 2
"""Ray CPUs per node of the test cluster: each node's window is 2 tasks."""

RAY_START_ATTEMPTS = 2
"""Starts of the test Ray cluster before its fixture errors (see ``ray_cluster``)."""

RAY_NODE_GPUS = 2
"""GPUs node 0 of the test Ray cluster reports (a logical count: no GPU is used)."""


def ray_node_resource(index: int) -> str:
    """The custom resource only node ``index`` of the test Ray cluster has (to aim at a node)."""
    return f"precompile-test-node-{index}"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two Ray nodes (``ray.cluster_utils.Cluster``) on 127.0.0.1 only, driver connected.

    The module's Ray tests run in a network namespace of their own with only loopback (see
    ``tests/loopback.py`` for why); the fixture checks that both nodes report 127.0.0.1 and that
    every socket of every Ray process is on 127.0.0.1 when the cluster is up and again at the
    end, and that every Ray process is gone after shutdown. Each node has its own
    ``TRITON_CACHE_DIR`` and a custom resource ``ray_node_resource(i)``; node 0 reports
    ``RAY_NODE_GPUS`` GPUs; both find the tests' helper modules (``PYTHONPATH``). Yields ``(cluster, cache_dirs, node_args)``;
    ``cluster.add_node(**node_args(1))`` starts a replacement for node 1.
    """
    pytest.importorskip("ray")
    import loopback
    import ray
    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("ray-nodes")
    cache_dirs = [base / f"node-{i}-triton-cache" for i in range(2)]
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    python_path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)

    def node_args(i: int) -> dict[str, Any]:
        return {
            "num_cpus": RAY_NODE_CPUS,
            # Node 0 says it has GPUs (Ray counts them as it is told; nothing here asks Ray for
            # one): devices_per_node="auto" and options(resources={"GPU": 1}) then have a GPU
            # node to find.
            "num_gpus": RAY_NODE_GPUS if i == 0 else 0,
            "resources": {ray_node_resource(i): 1},
            "env_vars": {"TRITON_CACHE_DIR": str(cache_dirs[i]), "PYTHONPATH": python_path},
        }

    def roots() -> set[int]:
        return {p.pid for p in loopback.ray_processes()}

    try:
        namespace = loopback.loopback_only()
        namespace.__enter__()
    except PermissionError as exc:
        pytest.skip(f"needs root, for a network namespace with only loopback ({exc})")
    _process_roots.append(roots)

    def start() -> Any:
        # Ray waits 30 s at most for a raylet to register (ray/_private/node.py), which a
        # heavily loaded machine can miss: then clean up and try once more.
        for attempt in range(RAY_START_ATTEMPTS):
            cluster = None
            try:
                cluster = Cluster(
                    initialize_head=True,
                    head_node_args={**node_args(0), "include_dashboard": False},
                )
                cluster.add_node(**node_args(1))
                return cluster
            except Exception:
                if cluster is not None:
                    with contextlib.suppress(Exception):
                        cluster.shutdown()
                _kill_ray_processes()
                if attempt + 1 == RAY_START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    cluster = None
    try:
        cluster = start()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        cluster.wait_for_nodes()
        assert cluster.address.startswith("127.0.0.1:"), cluster.address
        assert_on_loopback_only()
        yield cluster, cache_dirs, node_args
        assert_on_loopback_only()
    finally:
        pids = roots()
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        procs = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        _, alive = psutil.wait_procs(procs, timeout=30)
        if cluster is None:
            _kill_ray_processes()  # it never started: what it left is not the finding
            alive = []
        _process_roots.remove(roots)
        namespace.__exit__(None, None, None)
        assert not alive, f"Ray processes left after shutdown: {alive}"


def _kill_ray_processes() -> None:
    """SIGKILL what a failed Ray start left (its services, raylets, workers)."""
    import loopback

    procs = loopback.ray_processes()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


def assert_on_loopback_only() -> None:
    """Both nodes say 127.0.0.1; every socket of every Ray process (and the driver's) too."""
    import loopback
    import ray

    addresses = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    assert addresses and set(addresses) == {"127.0.0.1"}, addresses
    processes = loopback.ray_processes()
    names = {p.name() for p in processes}
    assert {"gcs_server", "raylet"} <= names, names
    pids = [p.pid for p in processes] + [os.getpid()]
    # the control store and both raylets listen (so the check below has sockets to check)
    assert len(loopback.listening(pids)) >= 3, loopback.listening(pids)
    assert loopback.non_loopback_sockets(pids) == []
