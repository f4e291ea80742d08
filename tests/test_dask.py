"""``DaskPrecompileExecutor`` on a 2-node local cluster: faults, cancel, node loss, Triton.

The cluster (``dask_cluster`` in ``conftest.py``) is a ``SpecCluster`` of two dask workers on
127.0.0.1 with 2 threads and its own ``TRITON_CACHE_DIR`` each. The contract tests in
``test_contract.py`` run against this executor too.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cluster_helpers as cases
import crashers
import psutil
import pytest
from cluster_helpers import WAIT_S
from test_faults import FAULTS

pytest.importorskip("distributed")

from precompile_executor import TaskMemoryError, WorkerStartError  # noqa: E402
from precompile_executor.dask import DaskPrecompileExecutor, NodeLostError  # noqa: E402
from precompile_executor.dask._plan import departed, free_slots, node_window, pick_node  # noqa: E402


def _dask_pids(client: Any) -> Callable[[], dict[str, int]]:
    """The dask workers' pids, node → pid: the processes the node pools live in."""
    return lambda: dict(client.run(os.getpid))


def _on_one_node(client: Any) -> cases.Make:
    return functools.partial(DaskPrecompileExecutor, client, workers=[sorted(client.nthreads())[0]])


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
@pytest.mark.parametrize("fault", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_fails_alone_on_a_node(dask_cluster: Any, fault: Any, tmp_path: Path) -> None:
    _, client, _ = dask_cluster
    make = functools.partial(DaskPrecompileExecutor, client)
    cases.fault_fails_alone(make, _dask_pids(client), fault, tmp_path)


# -- the honest queue across the cluster -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_cancel_after_dispatch_stops_the_task_on_its_node_and_frees_the_slot(
    dask_cluster: Any, tmp_path: Path
) -> None:
    cases.cancel_after_dispatch_frees_the_slot(_on_one_node(dask_cluster[1]), tmp_path)


@pytest.mark.timeout(60)
def test_cancel_of_a_queued_task_and_running_means_running_on_a_node(
    dask_cluster: Any, tmp_path: Path
) -> None:
    cases.running_means_running_on_a_node(_on_one_node(dask_cluster[1]), tmp_path)


@pytest.mark.timeout(60)
def test_interrupt_kills_running_tasks_on_their_nodes(dask_cluster: Any, tmp_path: Path) -> None:
    _, client, _ = dask_cluster
    make = functools.partial(DaskPrecompileExecutor, client)
    cases.interrupt_kills_running_tasks(make, _dask_pids(client), tmp_path)


@pytest.mark.timeout(60)
def test_wait_for_all_on_ctrl_c_kills_tasks_running_on_nodes(dask_cluster: Any) -> None:
    _, client, _ = dask_cluster
    make = functools.partial(DaskPrecompileExecutor, client)
    cases.ctrl_c_in_wait_for_all_kills_tasks_on_nodes(make, _dask_pids(client))


@pytest.mark.timeout(60)
def test_a_slow_done_callback_does_not_hold_back_other_outcomes(
    dask_cluster: Any, tmp_path: Path
) -> None:
    cases.a_slow_done_callback_does_not_hold_back_other_outcomes(
        functools.partial(DaskPrecompileExecutor, dask_cluster[1]), tmp_path
    )


# -- settings ---------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_initializer_and_window_reach_every_node(dask_cluster: Any) -> None:
    cases.initializer_and_window_reach_every_node(
        functools.partial(DaskPrecompileExecutor, dask_cluster[1])
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        *cases.BAD_SETTINGS,
        ({"workers": "tcp://127.0.0.1:1"}, TypeError, "list of dask worker addresses"),
    ],
)
def test_bad_settings_fail_at_construction(
    dask_cluster: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    _, client, _ = dask_cluster
    with pytest.raises(error, match=match):
        DaskPrecompileExecutor(client, **kwargs)


@pytest.mark.timeout(60)
def test_what_is_not_a_connected_client_is_refused_saying_what_to_pass(dask_cluster: Any) -> None:
    from distributed import Client

    cluster, _, _ = dask_cluster
    for not_a_client in (None, cluster.scheduler_address):
        with pytest.raises(TypeError, match=r"a distributed\.Client.*Client\('tcp://"):
            DaskPrecompileExecutor(not_a_client)
    closed = Client(cluster.scheduler_address, timeout=WAIT_S)
    closed.close()
    with pytest.raises(ValueError, match="client is closed.*connected"):
        DaskPrecompileExecutor(closed)


@pytest.mark.timeout(60)
def test_workers_naming_no_present_node_is_warned_of_and_a_present_one_is_not(
    dask_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, client, _ = dask_cluster
    present = sorted(client.nthreads())[0]
    with caplog.at_level(logging.WARNING, logger="precompile_executor.dask"):
        with DaskPrecompileExecutor(client, workers=["tcp://127.0.0.1:9"]):
            pass
        with DaskPrecompileExecutor(client, workers=[present, "tcp://127.0.0.1:9"]) as executor:
            assert executor.submit(abs, -2).result(timeout=WAIT_S) == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "precompile_executor.dask"]
    assert len(warnings) == 1, warnings
    assert "tcp://127.0.0.1:9" in warnings[0] and present in warnings[0]
    assert "wait until one of them joins" in warnings[0]


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
def test_options_refuse_the_fork_path_and_resources(dask_cluster: Any) -> None:
    _, client, _ = dask_cluster
    with DaskPrecompileExecutor(client) as executor:
        cases.options_refuse_the_fork_path(executor)
        with pytest.raises(TypeError, match="does not route tasks by resources"):
            executor.options(resources={"GPU": 1})
        assert executor.options(resources=None).submit(abs, -4).result(timeout=WAIT_S) == 4


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


# -- Triton: compiled on two nodes, used here ----------------------------------------------------------


@pytest.mark.timeout(240)
def test_triton_configs_compiled_on_two_nodes_are_cache_hits_here(
    dask_cluster: Any, tmp_path: Path
) -> None:
    _, client, node_caches = dask_cluster
    make = functools.partial(DaskPrecompileExecutor, client)
    _, caller_cache = cases.triton_compiles_on_two_nodes_are_cache_hits_here(make, tmp_path)
    assert all(not str(d).startswith(str(caller_cache)) for d in node_caches)


@pytest.mark.timeout(240)
def test_warm_takes_the_dask_executor(dask_cluster: Any, tmp_path: Path) -> None:
    pytest.importorskip("triton")
    from triton import knobs

    from precompile_executor.triton import classify

    _, client, _ = dask_cluster
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "caller-cache")
        with DaskPrecompileExecutor(client, timeout=120, classify=classify) as executor:
            cases.warm_compiles_on_the_nodes_then_finds_them_cached(executor)


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

        lost = cases.a_lost_nodes_in_flight_tasks_fail_alone(
            executor, futures, log, victim, NodeLostError
        )
        assert all(cases.runs(log).count(i) == 0 for i in lost)  # killed mid-sleep, never re-run
        assert not psutil.pid_exists(victim_pid) or psutil.Process(victim_pid).status() == "zombie"
        # The nanny starts a new worker; the executor finds it and sends it work.
        deadline = time.monotonic() + WAIT_S
        while len(executor.nodes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(executor.nodes()) == 2 and victim not in executor.nodes()
        assert executor.submit(crashers.square, 5).result(timeout=WAIT_S) == 25
