"""The Ray backend: per-task overhead against Ray's own ``ObjectRef.future()`` and the dask
backend, and a compile batch on one node vs two.

Run ``python -m benchmarks.ray_bench`` (``--quick`` for a smoke run). It starts a two-node
``ray.cluster_utils.Cluster`` with one CPU per node (as root: inside a network namespace with
only loopback, so every Ray process binds to 127.0.0.1; see docs/ray.md) and, for the dask rows,
a local dask cluster of two one-thread workers on 127.0.0.1. It prints Markdown tables with the
machine, the versions and the date; paste them into ``docs/ray.md``.

* **Overhead**: a no-op through ``RayPrecompileExecutor`` (node actor, node pool, outcome
  records, the caller's queue and windows) against the same no-op as a Ray task through
  ``ObjectRef.future()`` (no isolation, no timeout, no queue of the caller's) and through
  ``DaskPrecompileExecutor``: a map of many calls (µs per task) and the serial
  submit→result round trip.
* **Compile batch**: distinct Triton matmul configs for sm_90 (``benchmarks._kernels``), on one
  node with one slot vs two nodes with one slot each. Pool workers are warmed first (the
  initializer pays the first compile), and each run uses a fresh Triton cache.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from ._common import stamp, usable_cores, version
from ._kernels import compile_config, configs, warm_compile

_IN_NAMESPACE = "--in-loopback-namespace"


def noop() -> None:
    """The task of the overhead rows."""


def _per_task_map_us(run_all: Any, n: int) -> float:
    start = time.perf_counter()
    run_all(n)
    return (time.perf_counter() - start) / n * 1e6


def _round_trip_ms(run_one: Any, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        run_one()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _executor_rows(executor: Any, n_map: int, n_rt: int) -> tuple[float, float]:
    def run_all(n: int) -> None:
        list(executor.map(lambda _: noop(), range(n)))

    def run_one() -> None:
        executor.submit(noop).result(timeout=60)

    run_all(20)  # warm: the pools have run a task, the caller's threads are up
    return _per_task_map_us(run_all, n_map), _round_trip_ms(run_one, n_rt)


def _compile_batch_s(executor: Any, batch: list[Any]) -> float:
    cache = tempfile.mkdtemp(prefix="ray-bench-cache-")
    try:
        start = time.perf_counter()
        futures = [executor.submit(compile_config, cfg, cache) for cfg in batch]
        for f in futures:
            f.result(timeout=600)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _reexec_in_loopback_namespace(argv: list[str]) -> None:
    """As root, run this benchmark again in a network namespace with only loopback."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        print("(not root: Ray binds to this machine's interface address, see docs/ray.md)")
        return
    script = 'ip link set lo up && exec "$0" "$@"'
    args = [sys.executable, "-m", "benchmarks.ray_bench", _IN_NAMESPACE, *argv]
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", script, *args])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _IN_NAMESPACE in argv:
        argv.remove(_IN_NAMESPACE)
    else:
        _reexec_in_loopback_namespace(argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="few tasks and configs (smoke run)")
    parser.add_argument("--configs", type=int, default=12, help="configs in the compile batch")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each compile batch")
    args = parser.parse_args(argv)
    n_map, n_rt = (50, 10) if args.quick else (500, 50)
    batch = configs(min(args.configs, 4) if args.quick else args.configs, quick=args.quick)

    import dask
    import ray
    from distributed import Client, LocalCluster
    from ray.cluster_utils import Cluster

    from precompile_executor.dask import DaskPrecompileExecutor
    from precompile_executor.ray import RayPrecompileExecutor

    info = stamp(usable_cores(), "python -m benchmarks.ray_bench " + " ".join(argv))
    info["ray"] = version("ray")
    info["dask/distributed"] = f"{version('dask')}/{version('distributed')}"

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node-0": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"node-1": 1})
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        cluster.wait_for_nodes()
        addresses = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})
        info["Ray node addresses"] = ", ".join(addresses)

        rows: dict[str, tuple[float, float]] = {}
        with RayPrecompileExecutor() as ours:
            ours.warm_up(timeout=120)
            rows["`RayPrecompileExecutor`"] = _executor_rows(ours, n_map, n_rt)

        remote_noop = ray.remote(num_cpus=1)(noop)

        def ray_all(n: int) -> None:
            for f in [remote_noop.remote().future() for _ in range(n)]:
                f.result(timeout=60)

        def ray_one() -> None:
            remote_noop.remote().future().result(timeout=60)

        ray_all(20)
        rows["Ray task, `ObjectRef.future()`"] = (
            _per_task_map_us(ray_all, n_map),
            _round_trip_ms(ray_one, n_rt),
        )

        with (
            dask.config.set({"distributed.worker.daemon": False}),
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
            ) as dask_cluster,
            Client(dask_cluster) as client,
            DaskPrecompileExecutor(client) as theirs,
        ):
            theirs.warm_up(timeout=120)
            rows["`DaskPrecompileExecutor`"] = _executor_rows(theirs, n_map, n_rt)

        walls: dict[int, list[float]] = {}
        for n_nodes in (1, 2):
            with RayPrecompileExecutor(
                initializer=warm_compile,
                max_workers_per_node=1,
                resources={"node-0": 1} if n_nodes == 1 else None,
                timeout=300,
            ) as ex:
                assert len(ex.nodes()) == n_nodes, ex.nodes()
                ex.warm_up(timeout=300)
                walls[n_nodes] = [_compile_batch_s(ex, batch) for _ in range(args.repeat)]
    finally:
        ray.shutdown()
        cluster.shutdown()

    ours_map, ours_rt = rows["`RayPrecompileExecutor`"]
    print("### Ray: per-task overhead of a no-op (2 nodes, 1 CPU each)\n")
    rt_title = f"submit→result round trip, ms (median of {n_rt})"
    print(f"| executor | map of {n_map}, µs/task | {rt_title} |")
    print("|---|---|---|")
    for name, (per_task, rt) in rows.items():
        print(f"| {name} | {per_task:.0f} | {rt:.2f} |")
    for name, (per_task, rt) in rows.items():
        if name != "`RayPrecompileExecutor`":
            print(f"| ratio ours / {name} | {ours_map / per_task:.2f}× | {ours_rt / rt:.2f}× |")
    print(f"\n### Ray: compile batch, {len(batch)} distinct matmul configs for sm_90\n")
    print("| nodes (1 slot each) | wall, s (each run) | speed-up over 1 node |")
    print("|---|---|---|")
    one = min(walls[1])
    for n_nodes, runs in walls.items():
        shown = ", ".join(f"{w:.2f}" for w in runs)
        print(f"| {n_nodes} | {shown} | {one / min(runs):.2f}× |")
    print()
    for key, value in info.items():
        print(f"- {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
