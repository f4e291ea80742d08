"""``RayPrecompileExecutor`` on a 2-node local Ray cluster: loopback, faults, cancel, node loss,
Triton.

The cluster (``ray_cluster`` in ``conftest.py``) is a ``ray.cluster_utils.Cluster`` of two nodes
with 2 CPUs, its own ``TRITON_CACHE_DIR`` and a custom resource each, inside a network namespace
with only loopback. The contract tests in ``test_contract.py`` run against this executor too.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import cluster_helpers as cases
import crashers
import loopback
import psutil
import pytest
from cluster_helpers import WAIT_S, wait_until
from conftest import RAY_NODE_CPUS, RAY_NODE_GPUS, assert_on_loopback_only, ray_node_resource
from test_faults import FAULTS, _assert_gone

pytest.importorskip("ray")

import ray  # noqa: E402

from precompile_executor import WorkerCrashedError, worker_device  # noqa: E402
from precompile_executor._cluster_plan import has_resources, pick_node  # noqa: E402
from precompile_executor.ray import (  # noqa: E402
    NodeLostError,
    RayPrecompileExecutor,
    node_actors,
)


def _actor_pids() -> dict[str, int]:
    """The node actors' pids, node → pid: the processes the node pools live in."""
    return {
        n: ray.get(h.describe.remote(), timeout=WAIT_S)["pid"] for n, h in node_actors().items()
    }


def _on_node(i: int) -> cases.Make:
    return functools.partial(RayPrecompileExecutor, resources={ray_node_resource(i): 1})


@pytest.mark.timeout(240)  # the first test: the cluster starts inside its time
def test_every_ray_process_is_on_loopback_only(ray_cluster: Any) -> None:
    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    assert_on_loopback_only()
    with RayPrecompileExecutor() as executor:  # the node actors and their pools too
        assert executor.submit(crashers.square, 3).result(timeout=WAIT_S) == 9
        assert len(executor.nodes()) == 2
        assert_on_loopback_only()
    assert {p.name() for p in loopback.ray_processes()} >= {"ray::NodeActor"}


@pytest.mark.timeout(60)
def test_tasks_reach_both_nodes_and_each_nodes_environment(ray_cluster: Any) -> None:
    _, cache_dirs, _ = ray_cluster
    with RayPrecompileExecutor() as executor:
        executor.warm_up(timeout=WAIT_S)
        on = {}
        for i in range(2):
            view = executor.options(resources={ray_node_resource(i): 1})
            # a lambda: os.environ.get would carry this process's environment along
            on[i] = view.submit(lambda: os.environ.get("TRITON_CACHE_DIR")).result(timeout=WAIT_S)
        assert on == {0: str(cache_dirs[0]), 1: str(cache_dirs[1])}
        pids = {ray.get(h.describe.remote())["pid"] for h in node_actors().values()}
        assert len(pids) == 2


@pytest.mark.timeout(60)
def test_a_slow_done_callback_does_not_hold_back_other_outcomes(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cases.a_slow_done_callback_does_not_hold_back_other_outcomes(RayPrecompileExecutor, tmp_path)


# -- the pure decisions ------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_an_address_nothing_listens_on_is_refused_at_once_without_starting_ray() -> None:
    # Ray's own `ray.init(address=...)` retries an unreachable GCS for minutes.
    with socket.socket() as probe:  # a loopback port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = (
        "import time; from precompile_executor.ray import RayPrecompileExecutor\n"
        "start = time.monotonic()\n"
        "try:\n"
        f"    RayPrecompileExecutor(address='127.0.0.1:{port}')\n"
        "except ConnectionError as exc:\n"
        "    print(round(time.monotonic() - start, 1), exc)\n"
        "import ray; print('initialized', ray.is_initialized())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    took, message = done.stdout.split(" ", 1)
    assert float(took) < 30, done.stdout
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in message
    assert "ray start --head" in message
    assert "initialized False" in done.stdout


@pytest.mark.timeout(10)
def test_a_task_goes_only_to_nodes_that_have_its_resources() -> None:
    assert has_resources({"CPU": 8.0, "GPU": 2.0}, {"GPU": 1})
    assert not has_resources({"CPU": 8.0}, {"GPU": 1})
    assert has_resources({"CPU": 8.0}, {})
    free = {"cpu-node": 4, "gpu-node": 1}
    assert pick_node(free) == "cpu-node"
    assert pick_node(free, among=["gpu-node"]) == "gpu-node"
    assert pick_node({"cpu-node": 4, "gpu-node": 0}, among=["gpu-node"]) is None
    assert pick_node(free, among=[]) is None


# -- faults: each fails alone, as on one machine ------------------------------------------------------

RAY_FAULTS = [
    f
    for f in FAULTS
    if f[0]
    in (
        "segfault",
        "abort",
        "self-SIGKILL",
        "C hang holding the GIL",
        "hang with a grandchild",
        "past its memory limit",
        "exception holding a lock",
        "exception class inside the task",
        "error over 10,000 characters",
    )
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", RAY_FAULTS, ids=[f[0] for f in RAY_FAULTS])
def test_fault_fails_alone_on_a_node(ray_cluster: Any, fault: Any, tmp_path: Path) -> None:
    cases.fault_fails_alone(RayPrecompileExecutor, _actor_pids, fault, tmp_path)


# -- the honest queue across the cluster -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_cancel_after_dispatch_stops_the_task_on_its_node_and_frees_the_slot(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cases.cancel_after_dispatch_frees_the_slot(_on_node(0), tmp_path)


@pytest.mark.timeout(60)
def test_cancel_of_a_queued_task_and_running_means_running_on_a_node(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cases.running_means_running_on_a_node(_on_node(1), tmp_path)


@pytest.mark.timeout(60)
def test_interrupt_kills_running_tasks_on_their_nodes(ray_cluster: Any, tmp_path: Path) -> None:
    cases.interrupt_kills_running_tasks(RayPrecompileExecutor, _actor_pids, tmp_path)


@pytest.mark.timeout(60)
def test_wait_for_all_on_ctrl_c_kills_tasks_running_on_nodes(ray_cluster: Any) -> None:
    cases.ctrl_c_in_wait_for_all_kills_tasks_on_nodes(RayPrecompileExecutor, _actor_pids)


@pytest.mark.timeout(60)
def test_a_task_that_asks_for_what_no_node_has_waits_and_can_be_cancelled(
    ray_cluster: Any,
) -> None:
    """Queued, not failed (such a node may join), cancellable; the tasks behind it run."""
    with RayPrecompileExecutor() as executor:
        waiting = executor.options(resources={"h200": 1}).submit(crashers.square, 2)
        assert executor.submit(crashers.square, 3).result(timeout=WAIT_S) == 9
        assert not waiting.running() and not waiting.done()
        assert executor.statistics().queued == 1
        assert waiting.cancel()


def _where() -> tuple[str | None, str | None, str | None]:
    return (
        os.environ.get("TRITON_CACHE_DIR"),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        worker_device(),
    )


@pytest.mark.timeout(60)
def test_gpu_tasks_go_to_the_gpu_node_and_its_workers_are_pinned(ray_cluster: Any) -> None:
    """``options(resources={"GPU": 1})`` reaches only the node with GPUs; ``devices_per_node``
    pins each node's pool workers, evenly ("auto": the GPUs Ray counts on that node)."""
    _, cache_dirs, _ = ray_cluster
    with RayPrecompileExecutor(devices_per_node="auto") as executor:
        executor.warm_up(timeout=WAIT_S)
        gpu = executor.options(resources={"GPU": 1})
        seen = [f.result(timeout=WAIT_S) for f in [gpu.submit(_where) for _ in range(6)]]
        assert {cache for cache, _, _ in seen} == {str(cache_dirs[0])}  # node 0 only
        assert {d for _, _, d in seen} <= {str(i) for i in range(RAY_NODE_GPUS)}
        assert all(visible == device for _, visible, device in seen)
        other = executor.options(resources={ray_node_resource(1): 1}).submit(_where)
        assert other.result(timeout=WAIT_S)[2] is None  # no GPU there: not pinned
    with RayPrecompileExecutor(devices_per_node=[3, 5], max_workers_per_node=2) as executor:
        executor.warm_up(timeout=WAIT_S)
        seen = [executor.submit(_where).result(timeout=WAIT_S) for _ in range(4)]
        assert {d for _, _, d in seen} <= {"3", "5"} and all(d for _, _, d in seen)


@pytest.mark.timeout(90)
def test_a_killed_node_actor_fails_its_tasks_and_is_replaced_on_its_node(
    ray_cluster: Any, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    node = ray.nodes()[0]["NodeID"]
    with RayPrecompileExecutor(max_workers_per_node=2) as executor:
        executor.warm_up(timeout=WAIT_S)
        futures = [executor.submit(crashers.square_and_log, i, str(log), 1.0) for i in range(8)]
        wait_until(lambda: executor.statistics().running == 4)
        victim = node_actors()[node]
        ray.kill(victim, no_restart=True)
        errors = [f.exception(timeout=WAIT_S) for f in futures]
        lost = [i for i, e in enumerate(errors) if e is not None]
        assert len(lost) == 2 and all(isinstance(errors[i], NodeLostError) for i in lost)
        assert all(node in str(errors[i]) for i in lost)
        runs = cases.runs(log)
        assert [i for i in range(8) if i not in lost and runs.count(i) != 1] == []
        assert all(runs.count(i) <= 1 for i in lost)  # never re-run
        wait_until(lambda: node in executor.nodes())  # a new actor, on the same node
        assert node_actors()[node] is not victim
        view = executor.options(resources={ray_node_resource(0): 1})
        assert view.submit(crashers.square, 6).result(timeout=WAIT_S) == 36
        assert executor.statistics().nodes_lost == 1


@pytest.mark.timeout(60)
def test_ctrl_c_in_the_with_block_kills_what_runs_on_every_node(
    ray_cluster: Any, tmp_path: Path
) -> None:
    pid_files = [tmp_path / f"grandchild-{i}.pid" for i in range(2)]
    hung: list[Any] = []
    with pytest.raises(KeyboardInterrupt):
        with RayPrecompileExecutor(max_workers_per_node=1) as executor:
            hung = [executor.submit(crashers.hang_with_grandchild, str(p)) for p in pid_files]
            wait_until(
                lambda: all(f.running() for f in hung) and all(p.exists() for p in pid_files)
            )
            raise KeyboardInterrupt
    for f in hung:  # one on each node, both killed
        assert isinstance(f.exception(timeout=WAIT_S), WorkerCrashedError)
    for p in pid_files:
        _assert_gone(int(p.read_text()))


def _sum_on_the_gpu() -> tuple[str | None, float, str]:
    import torch

    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    return worker_device(), float(x.sum().item()), torch.cuda.get_device_name(0)


@pytest.mark.gpu
@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="needs a CUDA GPU")
@pytest.mark.timeout(240)
def test_gpu_run_once_tasks_run_on_the_gpu_nodes_pinned_workers(ray_cluster: Any) -> None:
    """On a machine with a GPU: the GPU node's pool workers, pinned to GPU 0, run CUDA."""
    with RayPrecompileExecutor(
        devices_per_node=[0], resources={"GPU": 1}, max_workers_per_node=2, timeout=180
    ) as executor:
        assert len(executor.nodes()) == 1  # node 0, the one that reports GPUs
        results = [
            f.result(timeout=200) for f in [executor.submit(_sum_on_the_gpu) for _ in range(4)]
        ]
    assert {(device, total) for device, total, _ in results} == {("0", 523776.0)}
    assert all(name for _, _, name in results)


# -- settings ---------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_initializer_and_window_reach_every_node(ray_cluster: Any) -> None:
    cases.initializer_and_window_reach_every_node(RayPrecompileExecutor)
    with RayPrecompileExecutor() as default:  # the window is the node's Ray CPUs
        assert sorted(default.nodes().values()) == [RAY_NODE_CPUS, RAY_NODE_CPUS]
    with RayPrecompileExecutor(resources={ray_node_resource(1): 1}) as one:
        assert len(one.nodes()) == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        *cases.BAD_SETTINGS,
        ({"devices_per_node": "0,1"}, TypeError, "devices_per_node must be a list"),
        ({"devices_per_node": [0, 0]}, ValueError, "lists a GPU twice"),
        ({"resources": ["GPU"]}, TypeError, "resources must be a dict"),
        ({"resources": {"GPU": -1}}, ValueError, "must be a number >= 0"),
        ({"address": 6379}, TypeError, "address must be a string"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        RayPrecompileExecutor(**kwargs)


@pytest.mark.timeout(60)
def test_options_refuse_the_fork_path_and_bad_resources(ray_cluster: Any) -> None:
    with RayPrecompileExecutor() as executor:
        cases.options_refuse_the_fork_path(executor)
        with pytest.raises(TypeError, match="resources must be a dict"):
            executor.options(resources="GPU")


# -- Triton: compiled on two nodes, used here ----------------------------------------------------------


@pytest.mark.timeout(240)
def test_triton_configs_compiled_on_two_nodes_are_cache_hits_here(
    ray_cluster: Any, tmp_path: Path
) -> None:
    _, node_caches, _ = ray_cluster
    compiled, _ = cases.triton_compiles_on_two_nodes_are_cache_hits_here(
        RayPrecompileExecutor, tmp_path
    )
    # The nodes' own caches (their TRITON_CACHE_DIR) were not the way: the files travelled as
    # bytes in the outcome records (nothing assumes a shared disk).
    node_files = [str(p) for c in node_caches if c.exists() for p in c.rglob("*")]
    assert not [f for f in node_files for k in compiled if k.hash in f]


@pytest.mark.timeout(240)
def test_warm_and_the_autotune_mode_take_the_ray_executor(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``warm()`` compiles a kernel's configs on the nodes and installs them here; the
    ``@triton.autotune`` mode (on a dry-run sm_90 GPU, as in ``test_triton_autotune.py``)
    compiles each config on a node and benchmarks it from this process's cache."""
    pytest.importorskip("triton")
    import test_triton_autotune as at
    import triton
    from triton import knobs
    from triton.runtime.driver import driver

    from precompile_executor.triton import _autotune_tune, _preimport, classify
    from precompile_executor.triton import autotune as pe_autotune

    # The nodes' path only: no config compiled by the tune's own thread while the nodes start,
    # no module-import tasks in the counts.
    monkeypatch.setattr(_autotune_tune, "STEALS", False)
    monkeypatch.setattr(_preimport, "PREIMPORTS", False)

    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "caller-cache")
        with RayPrecompileExecutor(timeout=120, classify=classify) as executor:
            n_configs = cases.warm_compiles_on_the_nodes_then_finds_them_cached(executor)

            gpu = at.DryRunGPU()
            log = at.CompileLog()
            previous = driver.__dict__.get("_active")
            bench = at.Bench(gpu, lambda launched: at.DOUBLE_TIMES_MS[launched["BLOCK"]])
            kernel = triton.autotune(configs=at.DOUBLE_CONFIGS, key=["n"], do_bench=bench)(
                at.double_jit
            )
            driver.set_active(gpu)
            try:
                with knobs.compilation.scope():
                    knobs.compilation.listener = log
                    with pe_autotune.use(executor):
                        kernel[at.GRID](*at._double_args())
            finally:
                driver.set_active(previous)
                at.double_jit.device_caches.pop(gpu.device, None)
            stats = executor.statistics()
            assert stats.completed == n_configs + len(at.DOUBLE_CONFIGS)  # compiled on nodes
            assert log.events == []  # nothing compiled here: every launch hit the cache
            assert kernel.best_config is at.DOUBLE_CONFIGS[2]  # BLOCK=256
            assert gpu.launches[-1]["BLOCK"] == 256


@pytest.mark.timeout(240)
def test_helion_fork_mode_compiles_each_config_on_the_ray_nodes(
    ray_cluster: Any, tmp_path: Path
) -> None:
    _, node_caches, _ = ray_cluster
    with RayPrecompileExecutor(timeout=120) as executor:
        cases.helion_fork_mode_compiles_on_the_nodes(executor, node_caches, tmp_path)


# -- a node with another Triton ------------------------------------------------------------------------

OTHER_TRITON = "0.0.0"
"""The Triton version of the extra node in the refusal test."""


@pytest.mark.timeout(180)
def test_a_node_with_another_triton_is_refused_and_told_why(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """A node whose ``importlib.metadata`` finds another Triton (a ``triton-0.0.0.dist-info``
    first on its ``PYTHONPATH``; ``import triton`` still finds the real one) is refused when its
    actor opens the executor's pool; with only that node, tasks fail with the reason."""
    from precompile_executor._node_pool import triton_version
    from precompile_executor.ray import NodesRefusedError

    cluster, _, node_args = ray_cluster
    info = tmp_path / "other-triton" / f"triton-{OTHER_TRITON}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: triton\nVersion: {OTHER_TRITON}\n"
    )
    args = node_args(1)
    env = dict(args["env_vars"])
    env["PYTHONPATH"] = os.pathsep.join([str(info.parent), env["PYTHONPATH"]])
    only_there = {"precompile-test-other-triton": 1}
    node = cluster.add_node(**{**args, "resources": only_there, "env_vars": env})
    here = triton_version()
    try:
        cluster.wait_for_nodes()
        with RayPrecompileExecutor() as executor:
            assert node.node_id not in executor.nodes() and len(executor.nodes()) == 2
            why = executor.refused_nodes()[node.node_id]
            assert f"Triton {OTHER_TRITON}" in why and f"Triton {here}" in why
            assert executor.statistics().nodes_refused == 1
            assert executor.submit(crashers.square, 3).result(timeout=WAIT_S) == 9
        with RayPrecompileExecutor(resources=only_there) as stranded:
            error = stranded.submit(abs, -1).exception(timeout=WAIT_S)
            assert isinstance(error, NodesRefusedError)
            assert f"Triton {OTHER_TRITON}" in str(error) and f"Triton {here}" in str(error)
        with RayPrecompileExecutor(resources=only_there, require_same_triton=False) as anyway:
            assert list(anyway.nodes()) == [node.node_id]
            assert anyway.submit(abs, -1).result(timeout=WAIT_S) == 1
    finally:
        cluster.remove_node(node)
    assert_on_loopback_only()


@pytest.mark.timeout(240)
def test_warm_with_ray_address_fills_this_machines_cache_for_the_given_target(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """``precompile-executor warm --ray-address`` compiles on the nodes for the caller's
    ``--target`` and the files land in ``--cache-dir`` here. (This process's Ray is already
    connected to the test cluster, so the address is the one it uses.)"""
    import json

    from kernel_helpers import DOUBLE_KERNEL_FILE

    from precompile_executor.cli import EXIT_OK, main

    cluster, _, _ = ray_cluster
    module = tmp_path / "ray_kernels.py"
    module.write_text(DOUBLE_KERNEL_FILE)
    cache = tmp_path / "cache"
    argv = ["warm", str(module), "--target", "cuda:80", "--cache-dir", str(cache)]
    assert main([*argv, "--ray-address", cluster.address, "--jobs", "1"]) == EXIT_OK
    metadata = [json.loads(p.read_text()) for p in cache.rglob("double_kernel.json")]
    assert {(m["target"]["backend"], m["target"]["arch"]) for m in metadata} == {("cuda", 80)}
    assert len(metadata) == 3


# -- a lost node (last: the cluster gets a new node afterwards) --------------------------------------


@pytest.mark.timeout(180)
def test_a_lost_node_fails_only_its_in_flight_tasks_and_a_new_node_gets_work(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cluster, _, node_args = ray_cluster
    log = tmp_path / "runs.log"
    victim = next(iter(cluster.worker_nodes))  # not the head: the cluster lives on
    with RayPrecompileExecutor(max_workers_per_node=2) as executor:
        executor.warm_up(timeout=WAIT_S)
        futures = [executor.submit(crashers.square_and_log, i, str(log), 1.0) for i in range(12)]
        wait_until(lambda: executor.statistics().running == 4)
        raylet = psutil.Process(victim.all_processes["raylet"][0].process.pid)
        cluster.remove_node(victim, allow_graceful=False)

        lost = cases.a_lost_nodes_in_flight_tasks_fail_alone(
            executor, futures, log, victim.node_id, NodeLostError
        )
        # Never re-run. (A lost task may still have finished on the dying node: its pool
        # workers die a moment after its raylet; its outcome is unknown, so it fails.)
        assert all(cases.runs(log).count(i) <= 1 for i in lost)
        assert not raylet.is_running() or raylet.status() == psutil.STATUS_ZOMBIE
        assert victim.node_id not in executor.nodes()

        # A node joins: the executor places an actor there and sends it work.
        joiner = cluster.add_node(**node_args(1))
        wait_until(lambda: joiner.node_id in executor.nodes())
        view = executor.options(resources={ray_node_resource(1): 1})
        assert view.submit(crashers.square, 5).result(timeout=WAIT_S) == 25
    assert_on_loopback_only()
