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
* **Compile batch**: as in ``benchmarks.dask_bench`` (whose body this shares), on Ray nodes.
"""

from __future__ import annotations

import os
import shutil
import sys

from ._common import version
from .dask_bench import batch_walls, executor_overhead, local_dask, noop, options, overhead, report

_IN_NAMESPACE = "--in-loopback-namespace"


def _reexec_in_loopback_namespace(argv: list[str]) -> None:
    """As root, run this benchmark again in a network namespace with only loopback."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        print("(not root: Ray binds to this machine's interface address, see docs/ray.md)")
        return
    args = [sys.executable, "-m", "benchmarks.ray_bench", _IN_NAMESPACE, *argv]
    os.execvp(
        "unshare", ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *args]
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _IN_NAMESPACE in argv:
        argv.remove(_IN_NAMESPACE)
    else:
        _reexec_in_loopback_namespace(argv)
    args, info = options("benchmarks.ray_bench", __doc__, argv)
    import ray
    from ray.cluster_utils import Cluster

    from precompile_executor.dask import DaskPrecompileExecutor
    from precompile_executor.ray import RayPrecompileExecutor

    from ._kernels import warm_compile

    info["ray"] = version("ray")
    head = {"num_cpus": 1, "resources": {"node-0": 1}, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1, resources={"node-1": 1})
    rows: dict[str, tuple[float, float]] = {}
    walls: dict[int, list[float]] = {}
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        cluster.wait_for_nodes()
        addresses = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})
        info["Ray node addresses"] = ", ".join(addresses)
        with RayPrecompileExecutor() as ours:
            ours.warm_up(timeout=120)
            rows["`RayPrecompileExecutor`"] = executor_overhead(ours, args)
        remote_noop = ray.remote(num_cpus=1)(noop)

        def ray_all(n: int) -> None:
            for f in [remote_noop.remote().future() for _ in range(n)]:
                f.result(timeout=60)

        def ray_one() -> None:
            remote_noop.remote().future().result(timeout=60)

        rows["Ray task, `ObjectRef.future()`"] = overhead(ray_all, ray_one, args)
        with local_dask() as client, DaskPrecompileExecutor(client) as theirs:
            theirs.warm_up(timeout=120)
            rows["`DaskPrecompileExecutor`"] = executor_overhead(theirs, args)
        for n in (1, 2):
            with RayPrecompileExecutor(
                initializer=warm_compile,
                max_workers_per_node=1,
                resources={"node-0": 1} if n == 1 else None,
                timeout=300,
            ) as ex:
                assert len(ex.nodes()) == n, ex.nodes()
                ex.warm_up(timeout=300)
                walls[n] = batch_walls(ex, args.batch, args.repeat)
    finally:
        ray.shutdown()
        cluster.shutdown()
    report("Ray", "2 nodes, 1 CPU each", args, rows, walls, info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
