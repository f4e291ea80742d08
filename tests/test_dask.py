"""``DaskPrecompileExecutor`` on a 2-node local cluster: faults, cancel, node loss, Triton.

The cluster (``dask_cluster`` in ``conftest.py``) is a ``SpecCluster`` of two dask workers on
127.0.0.1 with 2 threads and its own ``TRITON_CACHE_DIR`` each. The contract tests in
``test_contract.py`` run against this executor too.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crashers
import psutil
import pytest
from test_faults import FAULTS, HANG_TIMEOUT_S, _assert_gone

pytest.importorskip("distributed")

from precompile_executor import (  # noqa: E402
    TaskMemoryError,
    WorkerCrashedError,
    WorkerStartError,
)
from precompile_executor.dask import DaskPrecompileExecutor, NodeLostError  # noqa: E402
from precompile_executor.dask._plan import departed, free_slots, node_window, pick_node  # noqa: E402

WAIT_S = 60.0
"""Longest any single wait in these tests may take."""


def _dask_pids(client: Any) -> dict[str, int]:
    return dict(client.run(os.getpid))


def _runs(log: Path) -> list[int]:
    return sorted(int(line) for line in log.read_text().split()) if log.exists() else []


# -- the pure scheduling decisions ----------------------------------------------------------------


@pytest.mark.timeout(10)
def test_window_is_the_thread_count_capped_by_the_setting() -> None:
    assert node_window(4, None) == 4
    assert node_window(4, 2) == 2
    assert node_window(1, 8) == 1
    assert node_window(0, None) == 1  # a node always takes at least one task


@pytest.mark.timeout(10)
def test_the_node_with_the_most_free_slots_gets_the_next_task() -> None:
    free = free_slots({"a": 2, "b": 2}, {"a": 1})
    assert free == {"a": 1, "b": 2}
    assert pick_node(free) == "b"
    assert pick_node({"a": 1, "b": 1}) == "a"  # ties: address order, so runs are repeatable
    assert pick_node({"a": 0, "b": 0}) is None
    assert pick_node({}) is None
    assert departed({"a": 1, "b": 1}, {"b": 2, "c": 2}) == ["a"]


# -- faults: each fails alone, as on one machine ----------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("name", "task", "check", "needs_timeout"), FAULTS, ids=[f[0] for f in FAULTS]
)
def test_fault_fails_alone_on_a_node(
    dask_cluster: Any,
    name: str,
    task: Callable[..., Any],
    check: Callable[[BaseException], None],
    needs_timeout: bool,
    tmp_path: Path,
) -> None:
    _, client, _ = dask_cluster
    dask_pids = _dask_pids(client)
    log = tmp_path / "runs.log"
    with DaskPrecompileExecutor(client, max_workers_per_node=2) as executor:
        before = [executor.submit(crashers.square_and_log, i, str(log), 0.3) for i in range(3)]
        bad_executor = executor.options(timeout=HANG_TIMEOUT_S) if needs_timeout else executor
        if task is crashers.allocate_gib:  # enforced by the node's pool, as on one machine
            bad_executor = executor.options(memory_limit=crashers.MEMORY_LIMIT_BYTES)
        args: tuple[Any, ...] = ()
        pid_file = tmp_path / "grandchild.pid"
        if task is crashers.hang_with_grandchild:
            args = (str(pid_file),)
        bad = bad_executor.submit(task, *args)
        after = [executor.submit(crashers.square_and_log, i, str(log), 0.1) for i in range(3, 8)]

        error = bad.exception(timeout=WAIT_S)
        assert error is not None, f"{name} should have failed"
        check(error)
        assert [f.result(timeout=WAIT_S) for f in before + after] == [i * i for i in range(8)]
        stats = executor.statistics()
        assert (stats.failed, stats.completed) == (1, 8)
    assert _runs(log) == list(range(8))  # every innocent task ran, and ran once
    assert _dask_pids(client) == dask_pids  # no dask worker died or restarted
    if task is crashers.hang_with_grandchild:
        _assert_gone(int(pid_file.read_text()))


# -- the honest queue across the cluster -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_cancel_after_dispatch_stops_the_task_on_its_node_and_frees_the_slot(
    dask_cluster: Any, tmp_path: Path
) -> None:
    _, client, _ = dask_cluster
    node = sorted(client.nthreads())[0]
    log = tmp_path / "runs.log"

    def slow_start() -> None:
        time.sleep(3.0)  # the node's pool is still starting: a dispatched task waits there

    with DaskPrecompileExecutor(
        client, initializer=slow_start, max_workers_per_node=1, workers=[node]
    ) as executor:
        doomed = executor.submit(crashers.square_and_log, 1, str(log))
        deadline = time.monotonic() + WAIT_S
        while executor.statistics().dispatched != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert executor.statistics().dispatched == 1
        assert not doomed.running()  # on its node, not started: PENDING, so cancel() works
        assert doomed.cancel()
        survivor = executor.submit(crashers.square_and_log, 2, str(log))
        assert survivor.result(timeout=WAIT_S) == 4  # the slot was freed
        stats = executor.statistics()
        assert (stats.cancelled, stats.completed, stats.failed) == (1, 1, 0)
    assert _runs(log) == [2]  # the cancelled task never ran


@pytest.mark.timeout(60)
def test_running_means_running_on_a_node(dask_cluster: Any) -> None:
    _, client, _ = dask_cluster
    node = sorted(client.nthreads())[0]
    with DaskPrecompileExecutor(client, max_workers_per_node=1, workers=[node]) as executor:
        executor.warm_up(timeout=WAIT_S)
        busy = executor.submit(time.sleep, 1.0)
        queued = executor.submit(crashers.square, 3)
        deadline = time.monotonic() + WAIT_S
        while not busy.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert busy.running() and not queued.running()
        assert not busy.cancel()  # running: too late, as with the stdlib
        stats = executor.statistics()
        assert (stats.running, stats.queued) == (1, 1)
        assert queued.result(timeout=WAIT_S) == 9


@pytest.mark.timeout(60)
def test_interrupt_kills_running_tasks_on_their_nodes(dask_cluster: Any, tmp_path: Path) -> None:
    _, client, _ = dask_cluster
    dask_pids = _dask_pids(client)
    pid_file = tmp_path / "grandchild.pid"
    with DaskPrecompileExecutor(client) as executor:
        hung = executor.submit(crashers.hang_with_grandchild, str(pid_file))
        queued = [executor.options(priority=-1).submit(time.sleep, 30) for _ in range(8)]
        deadline = time.monotonic() + WAIT_S
        while not (hung.running() and pid_file.exists()) and time.monotonic() < deadline:
            time.sleep(0.02)
        start = time.monotonic()
        executor.interrupt()
        error = hung.exception(timeout=WAIT_S)
        assert isinstance(error, WorkerCrashedError)
        assert "interrupted" in str(error)
        assert time.monotonic() - start < 10
        for f in queued:  # the 4 started ones are killed, the others cancelled
            assert f.cancelled() or isinstance(f.exception(timeout=WAIT_S), WorkerCrashedError)
    _assert_gone(int(pid_file.read_text()))
    assert _dask_pids(client) == dask_pids


# -- settings ---------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_initializer_and_window_reach_every_node(dask_cluster: Any) -> None:
    _, client, _ = dask_cluster

    def init(value: str) -> None:
        os.environ["PRECOMPILE_DASK_INIT"] = value

    with DaskPrecompileExecutor(
        client, initializer=init, initargs=("yes",), max_workers_per_node=1
    ) as executor:
        assert sorted(executor.nodes().values()) == [1, 1]
        pids = executor.warm_up(timeout=WAIT_S)
        assert sorted(len(p) for p in pids.values()) == [1, 1]
        got = executor.submit(lambda: os.environ.get("PRECOMPILE_DASK_INIT")).result(timeout=WAIT_S)
        assert got == "yes"
        assert executor.statistics().slots == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_workers_per_node": 0}, ValueError, "max_workers_per_node must be >= 1"),
        ({"max_workers_per_node": 1.5}, TypeError, "max_workers_per_node must be an int"),
        ({"timeout": 0}, ValueError, "timeout must be > 0"),
        ({"initializer": 3}, TypeError, "initializer must be callable"),
        ({"initargs": [1]}, TypeError, "initargs must be a tuple"),
        ({"classify": "warn"}, TypeError, "classify must be callable"),
        ({"workers": "tcp://127.0.0.1:1"}, TypeError, "list of dask worker addresses"),
        ({"memory_limit": 0}, ValueError, "memory_limit must be >= 1 byte"),
    ],
)
def test_bad_settings_fail_at_construction(
    dask_cluster: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    _, client, _ = dask_cluster
    with pytest.raises(error, match=match):
        DaskPrecompileExecutor(client, **kwargs)


@pytest.mark.timeout(60)
def test_the_constructors_memory_limit_is_enforced_on_the_nodes(dask_cluster: Any) -> None:
    _, client, _ = dask_cluster
    limit = crashers.MEMORY_LIMIT_BYTES
    with DaskPrecompileExecutor(client, memory_limit=limit) as executor:
        with pytest.raises(TypeError, match="memory_limit must be a number of bytes"):
            executor.options(memory_limit="1G")
        error = executor.submit(crashers.allocate_gib).exception(timeout=WAIT_S)
        assert isinstance(error, TaskMemoryError) and error.limit_bytes == limit
        assert executor.submit(crashers.square, 3).result(timeout=WAIT_S) == 9


@pytest.mark.timeout(60)
def test_options_refuse_the_fork_path(dask_cluster: Any) -> None:
    _, client, _ = dask_cluster
    with DaskPrecompileExecutor(client) as executor:
        with pytest.raises(ValueError, match="cannot fork"):
            executor.options(path="fork")
        assert executor.options(path="spawn").submit(abs, -2).result(timeout=WAIT_S) == 2


def test_wait_for_all_on_ctrl_c_kills_tasks_running_on_nodes(dask_cluster: Any) -> None:
    # wait_for_all kills what still runs through kill_running_futures, which reaches every
    # backend of the process (docs/design.md, "A backend"): here a task looping on a node.
    from precompile_executor import kill_running_futures

    _, client, _ = dask_cluster
    with DaskPrecompileExecutor(client, max_workers_per_node=1) as executor:
        looping = executor.submit(crashers.python_loop)
        deadline = time.monotonic() + WAIT_S
        while not looping.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert looping.running()
        kill_running_futures([looping])
        error = looping.exception(timeout=WAIT_S)
        assert isinstance(error, WorkerCrashedError)
        assert executor.submit(abs, -3).result(timeout=WAIT_S) == 3


@pytest.mark.timeout(90)
def test_daemonic_workers_are_refused_in_one_line() -> None:
    import dask
    from distributed import Client, LocalCluster

    # daemon: True is dask's default (the module's cluster fixture may have turned it off).
    # dashboard_address=None still binds the HTTP server to 8787; any free port instead.
    with (
        dask.config.set({"distributed.worker.daemon": True}),
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        with pytest.raises(WorkerStartError, match="distributed.worker.daemon: False") as info:
            DaskPrecompileExecutor(client)
        assert "\n" not in str(info.value)


@pytest.mark.timeout(60)
def test_import_does_not_import_torch_or_triton() -> None:
    code = (
        "import sys, precompile_executor.dask; "
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


# -- Triton: compiled on two nodes, used here ----------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore:.*TRITON_DEFAULT_FP_FUSION.*:UserWarning")
def test_triton_configs_compiled_on_two_nodes_are_cache_hits_here(
    dask_cluster: Any, tmp_path: Path
) -> None:
    triton = pytest.importorskip("triton")
    from triton import knobs
    from triton.compiler import ASTSource, CompiledKernel

    from precompile_executor.examples import kernels as examples
    from precompile_executor.triton import classify, parse_target, precompile

    _, client, node_caches = dask_cluster
    kernel = examples.add_gelu_kernel.fn
    signature = {
        "x_ptr": "*fp16",
        "bias_ptr": "*fp16",
        "out_ptr": "*fp16",
        "n_elements": "i32",
        "n_cols": "i32",
        "BLOCK_SIZE": "constexpr",
    }
    blocks = [256, 512, 1024, 2048]
    options = {"num_warps": 4, "num_stages": 3}
    hits: list[tuple[str, bool]] = []

    def listener(
        *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        hits.append((metadata["hash"], cache_hit))

    caller_cache = tmp_path / "caller-cache"
    with knobs.cache.scope(), knobs.compilation.scope():
        knobs.cache.dir = str(caller_cache)
        knobs.compilation.listener = listener
        with DaskPrecompileExecutor(
            client, timeout=120, classify=classify, max_workers_per_node=1
        ) as executor:
            pool_pids = executor.warm_up(timeout=WAIT_S)
            jobs = [
                precompile(
                    kernel,
                    signature,
                    {"BLOCK_SIZE": b},
                    target="cuda:90",
                    options=options,
                    executor=executor,
                )
                for b in blocks
            ]
            compiled = [job.result(timeout=180) for job in jobs]
        assert all(isinstance(k, CompiledKernel) for k in compiled)
        by_node = {
            node: {j.artifacts.worker_pid for j in jobs if j.artifacts} & set(pids)
            for node, pids in pool_pids.items()
        }
        assert all(by_node.values()), f"both nodes should have compiled: {by_node}"
        assert hits == []  # nothing compiled in this process
        for b, kernel_b in zip(blocks, compiled, strict=True):
            assert all(
                Path(p).is_relative_to(caller_cache) for p in kernel_b.metadata_group.values()
            )
            again = triton.compile(
                ASTSource(kernel, signature, {"BLOCK_SIZE": b}),
                target=parse_target("cuda:90"),
                options=options,
            )
            assert again.asm["cubin"] == kernel_b.asm["cubin"]
    assert hits == [(k.hash, True) for k in compiled]  # every one a cache hit here
    assert all(not str(d).startswith(str(caller_cache)) for d in node_caches)


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore:.*TRITON_DEFAULT_FP_FUSION.*:UserWarning")
def test_warm_takes_the_dask_executor(dask_cluster: Any, tmp_path: Path) -> None:
    pytest.importorskip("triton")
    from triton import knobs

    from precompile_executor.examples import kernels as examples
    from precompile_executor.triton import TensorSpec, classify, launch, warm

    _, client, _ = dask_cluster
    rows, cols = 64, 1000
    sx, sy = TensorSpec("fp16", (rows, cols)), TensorSpec("fp16", (rows, cols))
    specs = {examples.softmax_kernel: [launch(sy, sx, sx.stride(0), sy.stride(0), rows, cols)]}
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "caller-cache")
        with DaskPrecompileExecutor(client, timeout=120, classify=classify) as executor:
            report = warm(specs, target="cuda:90", executor=executor)
            assert [r.status for r in report.results] == ["ok"] * len(
                examples.softmax_kernel.configs
            )
            again = warm(specs, target="cuda:90", executor=executor)
            assert {r.status for r in again.results} == {"cached"}  # installed here
            assert executor.statistics().completed == len(examples.softmax_kernel.configs)


# -- a lost node (last: the cluster comes back with a new worker) ------------------------------------


@pytest.mark.timeout(120)
def test_a_lost_node_fails_only_its_in_flight_tasks(dask_cluster: Any, tmp_path: Path) -> None:
    _, client, _ = dask_cluster
    log = tmp_path / "runs.log"
    with DaskPrecompileExecutor(client, max_workers_per_node=2) as executor:
        executor.warm_up(timeout=WAIT_S)
        futures = [executor.submit(crashers.square_and_log, i, str(log), 1.0) for i in range(12)]
        deadline = time.monotonic() + WAIT_S
        while executor.statistics().running < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        victim = sorted(executor.nodes())[0]
        victim_pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(victim_pid, signal.SIGKILL)

        errors = [f.exception(timeout=WAIT_S) for f in futures]
        lost = [i for i, e in enumerate(errors) if e is not None]
        assert len(lost) == 2  # the victim's two in-flight tasks, nothing else
        for i in lost:
            assert isinstance(errors[i], NodeLostError)
            assert isinstance(errors[i], WorkerCrashedError)
            # One task failed; the executor goes on (see docs/design.md, Errors).
            assert not isinstance(errors[i], cf.BrokenExecutor)
            assert victim in str(errors[i])
        done = [i for i in range(12) if i not in lost]
        assert [futures[i].result() for i in done] == [i * i for i in done]
        runs = _runs(log)
        assert [i for i in done if runs.count(i) != 1] == []  # the others ran exactly once
        assert all(runs.count(i) == 0 for i in lost)  # killed mid-sleep, never re-run
        stats = executor.statistics()
        assert (stats.completed, stats.failed, stats.nodes_lost) == (10, 2, 1)
        assert not psutil.pid_exists(victim_pid) or psutil.Process(victim_pid).status() == "zombie"
        # The nanny starts a new worker; the executor finds it and sends it work.
        deadline = time.monotonic() + WAIT_S
        while len(executor.nodes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(executor.nodes()) == 2 and victim not in executor.nodes()
        assert executor.submit(crashers.square, 5).result(timeout=WAIT_S) == 25
