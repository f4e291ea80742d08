"""The dask backend: per-task overhead against ``Client.get_executor()``, and 2 nodes vs 1.

Run ``python -m benchmarks.dask_bench`` (``--quick`` for a smoke run). It starts a local cluster
of two dask workers (nodes) with one thread each, bound to 127.0.0.1, and prints Markdown tables
with the machine, the versions and the date; paste them into ``docs/benchmarks.md``.

* **Overhead**: a no-op through ``DaskPrecompileExecutor`` (node pool, outcome records, the
  caller's queue and windows) against the same no-op through dask's own ``ClientExecutor``
  (``Client.get_executor(pure=False)``, which runs it in the dask worker's thread: no isolation,
  no timeout). Both on the same two nodes.
* ``--busy-caller``: the overhead rows beside a caller thread busy in Python.
* **Compile batch**: distinct Triton matmul configs for sm_90 (``benchmarks._kernels``), on one
  node with one slot vs two nodes with one slot each. Pool workers are warmed first (the
  initializer pays the first compile), and each run uses a fresh Triton cache.

The body (options, timing, tables) is shared with ``benchmarks.ray_bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._common import median, stamp, timed, usable_cores, version
from ._kernels import Config, compile_config, configs
from ._report import Table


def noop() -> None:
    """The task of the overhead rows."""


def options(
    prog: str, doc: str | None, argv: list[str]
) -> tuple[argparse.Namespace, dict[str, str]]:
    """The shared options (with ``n_map``, ``n_rt`` and ``batch`` set) and the stamp."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {prog}", description=(doc or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="few tasks and configs (smoke run)")
    parser.add_argument("--configs", type=int, default=12, help="configs in the compile batch")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each compile batch")
    parser.add_argument(
        "--busy-caller",
        action="store_true",
        help="time the overhead rows beside a caller thread busy in Python (an autotuner "
        "searching or benchmarking while its compiles run)",
    )
    args = parser.parse_args(argv)
    args.n_map, args.n_rt = (50, 10) if args.quick else (500, 50)
    args.batch = configs(min(args.configs, 4) if args.quick else args.configs, quick=args.quick)
    info = stamp(usable_cores(), " ".join([f"python -m {prog}", *argv]))
    info["dask/distributed"] = f"{version('dask')}/{version('distributed')}"
    return args, info


def overhead(
    run_all: Callable[[int], Any], run_one: Callable[[], Any], args: Any
) -> tuple[float, float]:
    """(µs per task of ``run_all(n_map)``, median ms of ``run_one()``), after a warm-up."""
    run_all(20)  # warm: the pools have run a task, the caller's threads are up
    with busy_caller(args.busy_caller):
        per_task = timed(lambda: run_all(args.n_map))[0] / args.n_map * 1e6
        return per_task, median(timed(run_one)[0] for _ in range(args.n_rt)) * 1e3


@contextlib.contextmanager
def busy_caller(busy: bool) -> Iterator[None]:
    """With ``busy``, a thread of this process runs a Python loop meanwhile: every other thread
    of the caller (an executor's, the dask client's event loop) then waits for the GIL each time
    it gives it up."""
    stop = threading.Event()

    def spin() -> None:
        total = 0
        while not stop.is_set():
            for i in range(1000):
                total += i

    thread = threading.Thread(target=spin, name="busy-caller", daemon=True)
    if busy:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if busy:
            thread.join(timeout=10)


def executor_overhead(executor: Any, args: Any) -> tuple[float, float]:
    """:func:`overhead` of a ``concurrent.futures``-style executor."""

    def run_all(n: int) -> None:
        list(executor.map(lambda _: noop(), range(n)))

    return overhead(run_all, lambda: executor.submit(noop).result(timeout=60), args)


def batch_walls(executor: Any, batch: list[Config], repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` runs of the compile batch, each into a fresh Triton cache."""
    walls = []
    for _ in range(repeat):
        cache = tempfile.mkdtemp(prefix="cluster-bench-cache-")
        start = time.perf_counter()
        for f in [executor.submit(compile_config, cfg, cache) for cfg in batch]:
            f.result(timeout=600)
        walls.append(time.perf_counter() - start)
        shutil.rmtree(cache, ignore_errors=True)
    return walls


@contextlib.contextmanager
def local_dask() -> Iterator[Any]:
    """A client of a local dask cluster of two one-thread worker processes on 127.0.0.1."""
    import dask
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"distributed.worker.daemon": False}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def report(
    backend: str,
    nodes: str,
    args: Any,
    rows: dict[str, tuple[float, float]],
    walls: dict[int, list[float]],
    info: dict[str, str],
) -> None:
    """Print the overhead and batch tables (ours first in ``rows``) and the stamp, as Markdown."""
    ours_map, ours_rt = next(iter(rows.values()))
    mp, rt = (
        f"map of {args.n_map}, µs/task",
        f"submit→result round trip, ms (median of {args.n_rt})",
    )
    overhead_rows = [
        {"executor": name, mp: f"{m:.0f}", rt: f"{r:.2f}"} for name, (m, r) in rows.items()
    ]
    overhead_rows += [
        {"executor": f"ratio ours / {name}", mp: f"{ours_map / m:.2f}×", rt: f"{ours_rt / r:.2f}×"}
        for name, (m, r) in list(rows.items())[1:]
    ]
    one = min(walls[1])
    batch = [
        {
            "nodes (1 slot each)": n,
            "wall, s (each run)": ", ".join(f"{w:.2f}" for w in runs),
            "speed-up over 1 node": f"{one / min(runs):.2f}×",
        }
        for n, runs in walls.items()
    ]
    title = f"### {backend}: compile batch, {len(args.batch)} distinct matmul configs for sm_90"
    for table in (
        Table.of(f"### {backend}: per-task overhead of a no-op ({nodes})", overhead_rows),
        Table.of(title, batch),
    ):
        print(table.markdown("{}\n\n") + "\n")
    for key, value in info.items():
        print(f"- {key}: {value}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, info = options("benchmarks.dask_bench", __doc__, argv)
    from precompile_executor.dask import DaskPrecompileExecutor

    from ._kernels import warm_compile

    rows: dict[str, tuple[float, float]] = {}
    walls: dict[int, list[float]] = {}
    with local_dask() as client:
        nodes = sorted(client.nthreads())
        with DaskPrecompileExecutor(client) as ours:
            ours.warm_up(timeout=120)
            rows["`DaskPrecompileExecutor`"] = executor_overhead(ours, args)
        theirs = client.get_executor(pure=False)
        rows["`Client.get_executor(pure=False)`"] = executor_overhead(theirs, args)
        for n in (1, 2):
            with DaskPrecompileExecutor(
                client,
                initializer=warm_compile,
                max_workers_per_node=1,
                workers=nodes[:n],
                timeout=300,
            ) as ex:
                ex.warm_up(timeout=300)
                walls[n] = batch_walls(ex, args.batch, args.repeat)
    report("dask", "2 nodes, 1 thread each", args, rows, walls, info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
