"""The cost of moving a compile to a dask node, at the GPU fleet benchmark's shape, on any machine.

Run ``python -m benchmarks.fleet_probe`` (``--quick`` for a smoke run; ``--against REV`` to
put another commit's ``precompile_executor`` beside this one, runs interleaved).

``benchmarks.fleet_bench`` measures the per-task cost of a dask cluster (``DispatchProbe``:
dispatch → node → outcome back and installed here) on a GPU box, where real compiles share the
host's cores with the nodes' event loops. This probe isolates the cluster's own path: a dask
``LocalCluster`` of 2 nodes × 8 threads on 127.0.0.1, each task a stand-in compile that sleeps
as long as one of the GPU fleet's compiles (no CPU, so a 2-core machine holds 16 at once) and
returns an outcome as large as a real one (a real sm_90 compile's files, repeated to about
680 KB), which a done-callback writes into a
directory here, as the Triton integration installs a compile's files in the caller's cache. The
caller is quiet, or busy in Python (``--busy-caller``: an autotuner's search, codegen or
benchmarking loop).

Each run is a fresh process (its own cluster); the table gives, per tree and caller, the median
over rounds of the per-task cost (the tasks' time outside their compile, over the compile time
moved) and its split, as ``fleet_bench`` defines them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ._common import median, stamp, usable_cores
from ._report import Table

COMPILE_MS = (
    262.6, 270.3, 262.2, 292.0, 288.3, 324.4, 223.3, 258.6, 286.9, 296.6, 318.8, 336.9, 321.3,
    306.3, 343.6, 301.2, 348.7, 390.0, 402.3, 405.8, 384.0, 310.7, 400.3, 450.8, 413.6, 467.1,
    457.6, 395.8, 607.7, 759.7, 592.3, 514.4, 543.9, 660.3, 737.1, 557.8, 698.7, 741.0, 745.1,
    785.3, 1228.1, 1269.0, 890.8, 1049.6, 1438.1, 1439.1, 1407.9, 1339.3,
)  # fmt: skip
"""The 48 compiles of the GPU fleet benchmark's cluster run, in the order it sent them
(docs/gpu-runs.md, "2026-12-05 03:38 UTC"; its data file's ``records``)."""
OUTCOME_BYTES = 680_000  # a GEMM config's files for sm_90, the same record: 32.6 MB / 48
NODES = 2
NODE_THREADS = 8
RUN_TIMEOUT_S = 300.0
SPLIT = ("to_node_s", "on_node_s", "back_s", "queued_s")


@dataclasses.dataclass
class Outcome:
    """What ``DispatchProbe`` reads of a compile's artifacts."""

    compile_time_s: float
    files: dict[str, bytes]
    hash: str


def stand_in_compile(i: int, seconds: float, files: str, copies: int) -> Outcome:
    """Sleep like a compile; return a real compile's files (read from ``files``), ``copies``
    times over, as large as a GPU fleet compile's outcome and as compressible."""
    start = time.perf_counter()
    time.sleep(seconds)
    found = {}
    for path in sorted(Path(files).rglob("*")):
        if path.is_file():
            for c in range(copies):
                found[f"{i}-{c}-{path.name}"] = path.read_bytes()
    return Outcome(time.perf_counter() - start, found, f"h{i}")


def real_files(directory: str) -> int:
    """Compile one matmul config for sm_90 into ``directory``; return its files' total size."""
    from ._kernels import compile_config, configs

    compile_config(configs(12, quick=False)[-1], directory)
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


def install(directory: str, future: Future[Any]) -> None:
    """Write a finished compile's files here, as the Triton integration's done-callback does."""
    if future.cancelled() or future.exception() is not None:
        return
    for name, data in future.result().files.items():
        Path(directory, name).write_bytes(data)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run: a fresh cluster, a warm executor, ``args.tasks`` stand-in compiles."""
    import dask
    from distributed import Client, LocalCluster

    import precompile_executor
    from precompile_executor.dask import DaskPrecompileExecutor

    from .dask_bench import busy_caller
    from .fleet_bench import DispatchProbe

    if args.resolvers is not None:  # before the executor: its state reads it when built
        from precompile_executor import _cluster_state

        _cluster_state.RESOLVERS = int(args.resolvers)
    cache = tempfile.mkdtemp(prefix="fleet-probe-cache-")
    with (
        dask.config.set({"distributed.worker.daemon": False}),
        LocalCluster(
            n_workers=NODES,
            threads_per_worker=NODE_THREADS,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
        DaskPrecompileExecutor(client, timeout=120) as ex,
    ):
        addresses = [cluster.scheduler_address, *client.scheduler_info()["workers"]]
        ex.warm_up(timeout=120)
        list(ex.map(time.sleep, [0.05] * NODES * NODE_THREADS))  # every node worker has run one
        probe = DispatchProbe(ex, client)
        with busy_caller(args.busy_caller):
            start = time.perf_counter()
            futures = []
            for i in range(args.tasks):
                seconds = args.scale * COMPILE_MS[i % len(COMPILE_MS)] / 1e3
                future = ex.submit(stand_in_compile, i, seconds, args.files, args.copies)
                future.add_done_callback(lambda f: install(cache, f))
                futures.append(future)
            for f in futures:
                f.result(timeout=RUN_TIMEOUT_S)
            wall = time.perf_counter() - start
        time.sleep(0.2)  # the probe's own done-callbacks, after ours
        summary = probe.summary()
    shutil.rmtree(cache, ignore_errors=True)
    keep = ("tasks", "compile_s", "per_task_cost", "per_task_cost_unqueued", "extra_ms_median",
            "extra_ms_max", *SPLIT, "split_tasks")  # fmt: skip
    return {
        "tree": precompile_executor.__file__,
        "addresses": addresses,
        "wall_s": round(wall, 3),
        **{k: summary.get(k) for k in keep},
    }


def run(
    tree: Path | None, resolvers: int | None, busy: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """One run in a fresh process, ``precompile_executor`` from ``tree`` (else this one's),
    with ``resolvers`` resolver threads (else the tree's own number)."""
    here = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    if tree is not None:  # ``-m`` puts the working directory first: the old package wins
        env["PYTHONPATH"] = os.pathsep.join([str(here), env.get("PYTHONPATH", "")])
    argv = [
        sys.executable,
        "-m",
        "benchmarks.fleet_probe",
        "--child",
        "--tasks",
        str(args.tasks),
        "--scale",
        str(args.scale),
        "--files",
        args.files,
        "--copies",
        str(args.copies),
    ]
    if busy:
        argv.append("--busy-caller")
    if resolvers is not None:
        argv += ["--resolvers", str(resolvers)]
    # A group of its own: a run past its time takes its cluster's processes with it.
    proc = subprocess.Popen(argv, env=env, cwd=here if tree is None else tree, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        raise RuntimeError(f"a run took over {RUN_TIMEOUT_S + 60} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def per_task(runs: list[dict[str, Any]], part: str) -> float:
    """The median over ``runs`` of a part of the split, in ms a task."""
    return 1e3 * median(r[part] / max(1, r["split_tasks"]) for r in runs)


def old_tree(rev: str) -> Path:
    """``precompile_executor`` of commit ``rev``, unpacked into a scratch directory."""
    directory = Path(tempfile.mkdtemp(prefix=f"fleet-probe-{rev}-"))
    archive = subprocess.run(
        ["git", "archive", rev, "precompile_executor"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    return directory


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_probe",
                                     description=(__doc__ or "").split("\n")[0])  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="12 tasks, one round (smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=len(COMPILE_MS))
    parser.add_argument("--scale", type=float, default=1.0, help="times each recorded compile")
    parser.add_argument("--against", metavar="REV", help="a commit to interleave with this tree")
    parser.add_argument("--busy-caller", action="store_true", help="only the busy caller")
    parser.add_argument(
        "--resolvers",
        metavar="N,…",
        help="compare these numbers of resolver threads (_cluster_state.RESOLVERS) in this tree",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    parser.add_argument("--copies", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    if args.quick:
        args.tasks, args.rounds = 12, 1
    args.files = tempfile.mkdtemp(prefix="fleet-probe-files-")
    size = real_files(args.files)
    args.copies = max(1, round(OUTCOME_BYTES / size))
    trees: dict[str, tuple[Path | None, int | None]] = {"this tree": (None, None)}
    for n in (int(v) for v in (args.resolvers or "").split(",") if v):
        trees[f"this tree, {n} resolver{'s' if n > 1 else ''}"] = (None, n)
    if args.against:
        trees[args.against] = (old_tree(args.against), None)
    callers = (True,) if args.busy_caller else (False, True)
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    try:
        for r in range(args.rounds):
            for busy in callers:
                for name, (tree, resolvers) in trees.items():
                    row = run(tree, resolvers, busy, args)
                    runs.setdefault((name, busy), []).append(row)
                    print(f"round {r + 1} {name} busy={busy}: {json.dumps(row)}", file=sys.stderr)
    finally:
        for directory in [args.files, *(tree for tree, _ in trees.values())]:
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
    rows = []
    for (name, busy), got in runs.items():
        cost = [g["per_task_cost"] for g in got]
        rows.append({
            "tree": name,
            "caller": "busy in Python" if busy else "quiet",
            "per-task cost (each run)": ", ".join(f"{100 * c:.2f} %" for c in cost),
            "median": f"{100 * median(cost):.2f} %",
            **{f"{k[:-2].replace('_', ' ')}, ms a task": f"{per_task(got, k):.1f}" for k in SPLIT},
            "wall s (median)": f"{median([g['wall_s'] for g in got]):.2f}",
        })  # fmt: skip
    title = (f"### dask, {NODES} nodes × {NODE_THREADS} threads, {args.tasks} stand-in compiles "
             f"(the GPU fleet's × {args.scale}), {args.copies * size // 1000} KB each")  # fmt: skip
    print(Table.of(title, rows).markdown("{}\n\n"))
    info = stamp(usable_cores(), " ".join(["python -m benchmarks.fleet_probe", *argv]))
    for key, value in info.items():
        print(f"- {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
