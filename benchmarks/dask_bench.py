"""The dask backend: per-task overhead against ``Client.get_executor()``, and 2 nodes vs 1.

Run ``python -m benchmarks.dask_bench`` (``--quick`` for a smoke run). It starts a local cluster
of two dask workers (nodes) with one thread each, bound to 127.0.0.1, and prints Markdown tables
with the machine, the versions and the date; paste them into ``docs/benchmarks.md``.

* **Overhead**: a no-op through ``DaskPrecompileExecutor`` (node pool, outcome records, the
  caller's queue and windows) against the same no-op through dask's own ``ClientExecutor``
  (``Client.get_executor(pure=False)``, which runs it in the dask worker's thread: no isolation,
  no timeout). Both on the same two nodes.
* **Compile batch**: distinct Triton matmul configs for sm_90 (``benchmarks._kernels``), on one
  node with one slot vs two nodes with one slot each. Pool workers are warmed first (the
  initializer pays the first compile), and each run uses a fresh Triton cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from ._common import stamp, usable_cores, version
from ._kernels import compile_config, configs, warm_compile


def noop() -> None:
    """The task of the overhead rows."""


def _per_task_map_us(executor: Any, n: int) -> float:
    start = time.perf_counter()
    list(executor.map(lambda _: noop(), range(n)))
    return (time.perf_counter() - start) / n * 1e6


def _round_trip_ms(executor: Any, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        executor.submit(noop).result(timeout=60)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _compile_batch_s(executor: Any, batch: list[Any]) -> float:
    cache = tempfile.mkdtemp(prefix="dask-bench-cache-")
    start = time.perf_counter()
    futures = [executor.submit(compile_config, cfg, cache) for cfg in batch]
    for f in futures:
        f.result(timeout=600)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="few tasks and configs (smoke run)")
    parser.add_argument("--configs", type=int, default=12, help="configs in the compile batch")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each compile batch")
    args = parser.parse_args(argv)
    n_noop, n_rt = (50, 10) if args.quick else (500, 50)
    batch = configs(min(args.configs, 4) if args.quick else args.configs, quick=args.quick)

    import dask
    from distributed import Client, LocalCluster

    from precompile_executor.dask import DaskPrecompileExecutor

    info = stamp(
        usable_cores(), "python -m benchmarks.dask_bench " + " ".join(argv or sys.argv[1:])
    )
    info["dask/distributed"] = f"{version('dask')}/{version('distributed')}"
    with (
        dask.config.set({"distributed.worker.daemon": False}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        nodes = sorted(client.nthreads())
        with DaskPrecompileExecutor(client) as ours:
            ours.warm_up(timeout=120)
            _per_task_map_us(ours, 20)
            ours_map, ours_rt = _per_task_map_us(ours, n_noop), _round_trip_ms(ours, n_rt)
        theirs = client.get_executor(pure=False)
        _per_task_map_us(theirs, 20)
        dask_map, dask_rt = _per_task_map_us(theirs, n_noop), _round_trip_ms(theirs, n_rt)

        walls: dict[int, list[float]] = {}
        for n_nodes in (1, 2):
            with DaskPrecompileExecutor(
                client,
                initializer=warm_compile,
                max_workers_per_node=1,
                workers=nodes[:n_nodes],
                timeout=300,
            ) as ex:
                ex.warm_up(timeout=300)
                walls[n_nodes] = [_compile_batch_s(ex, batch) for _ in range(args.repeat)]

    print("### dask: per-task overhead of a no-op (2 nodes, 1 thread each)\n")
    print(
        f"| executor | map of {n_noop}, µs/task | submit→result round trip, ms (median of {n_rt}) |"
    )
    print("|---|---|---|")
    print(f"| `DaskPrecompileExecutor` | {ours_map:.0f} | {ours_rt:.1f} |")
    print(f"| `Client.get_executor(pure=False)` | {dask_map:.0f} | {dask_rt:.1f} |")
    print(f"| ratio ours / dask | {ours_map / dask_map:.2f}× | {ours_rt / dask_rt:.2f}× |\n")
    print(f"### dask: compile batch, {len(batch)} distinct matmul configs for sm_90\n")
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
