"""A caller that holds the GIL: how fast do tasks still flow through the pool?

    python -m benchmarks.gil_probe [--against REV ...] [--rounds 5] [--workers 4] [--tasks 48]
        [--task-ms 20] [--warm-tasks 200] [--hog-ms 50] [--result-kib 0] [--hog-kind c]

An autotuning process is rarely idle while its compiles run: Inductor traces and lowers the
next graph, Triton's autotuner benchmarks or compiles a config in the caller, and much of that
is C code that keeps the GIL for tens of milliseconds. Every message between a worker and this
library's hub (a worker's hello, a task's ``Started`` and ``Done``, the next task sent) is
handled by a thread of the caller, which needs the GIL back after each pipe read or write; the
stdlib's pool has the same shape (its management thread), Inductor's own pool a sidecar process.

Each measurement is a child interpreter that starts a *hog* thread — ``sorted()`` of a list
sized to hold the GIL in one C call for ``--hog-ms`` — then starts a pool of ``--workers``
(so the workers' start-up messages meet the hog), maps ``--tasks`` tasks that each sleep
``--task-ms`` in the worker (and returns ``--result-kib`` KiB: a compile's files are hundreds
of KiB, read in many pieces), and reports the time from the pool's creation to the first result
and to the last, then the time ``--warm-tasks`` more take on the now warm pool (dispatch alone);
then the median of ``--round-trips`` one-at-a-time no-op tasks (latency alone: a ``map`` sends
tasks ahead and hides it); the same without the hog gives the quiet baseline. With ``--hog-kind
python`` the hog is a Python loop instead (an autotuner generating code or benchmarking in
Python): CPython hands the GIL over only at the switch interval (``sys.getswitchinterval()``),
and the row also gives the loop's own rate while the tasks ran against its rate just before the
pool started (what the pool's threads cost the caller; docs/design.md, "A busy caller"). With
``--warm-up-first`` the pool's workers are started by ``warm_up()`` before the first task, timed
(the first result then comes from a warm pool). The
pool's module is imported before the hog starts (``import_s`` in each row). Pools: this tree's
``PrecompileExecutor``, the one of ``--against REV`` (a commit or a directory holding an
extracted ``precompile_executor/``, as ``benchmarks/s9_versus.py`` takes it; omitted: not run),
and ``concurrent.futures.ProcessPoolExecutor`` (fork). Rounds interleave the pools (the order
rotates), and medians are printed as a Markdown table with the machine and versions, then
this tree's warm-pool time and round trip beside the hog as a ratio to each other pool's. The ideal
with a free caller is ``tasks × task-ms / workers``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ._common import median

CHILD_TIMEOUT_S = 300.0


def _sized_list(hog_ms: float) -> list[float]:
    """A list whose ``sorted()`` takes about ``hog_ms`` (one C call: the GIL held throughout)."""
    import random

    rng = random.Random(0)
    size = 10_000
    while True:
        data = [rng.random() for _ in range(size)]
        start = time.perf_counter()
        sorted(data)
        took_ms = (time.perf_counter() - start) * 1e3
        if took_ms >= hog_ms or size > 50_000_000:
            return data
        size = int(size * max(1.5, min(10.0, hog_ms / max(took_ms, 0.01))))


def _sleep_ms(ms: float, result_kib: int = 0) -> float | bytes:
    time.sleep(ms / 1e3)
    return b"r" * (result_kib << 10) if result_kib else ms


def child(pool: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement, in this interpreter: the pool started while the hog runs (or not)."""
    stop = threading.Event()
    data = _sized_list(args.hog_ms) if args.hog and args.hog_kind == "c" else []
    spins = [0]

    def hog() -> None:
        if args.hog_kind == "c":
            while not stop.is_set():
                sorted(data)
            return
        while not stop.is_set():
            total = 0
            for i in range(1000):
                total += i
            spins[0] += 1

    def spin_rate(seconds: float) -> float:
        before, began = spins[0], time.perf_counter()
        time.sleep(seconds)
        return (spins[0] - before) / (time.perf_counter() - began)

    # The pool's module is imported before the hog starts, as a program imports its libraries
    # before it gets busy (each file an import opens would hand the hog a whole slice).
    start = time.perf_counter()
    if pool == "stdlib":  # every other pool is a PrecompileExecutor, of the tree on the path
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
    else:
        import precompile_executor
    imported = time.perf_counter() - start
    alone = None
    if args.hog:
        threading.Thread(target=hog, daemon=True).start()
        if args.hog_kind == "python":
            alone = spin_rate(0.5)
    start = time.perf_counter()
    if pool == "stdlib":
        executor: Any = ProcessPoolExecutor(
            args.workers, mp_context=multiprocessing.get_context("fork")
        )
    else:
        executor = precompile_executor.PrecompileExecutor(args.workers)
    # The task function of a module, pickled by reference as a program's would be (this file
    # runs as __main__, whose functions cloudpickle pickles by value, for every task).
    from benchmarks.gil_probe import _sleep_ms as sleep_ms

    warm_up_s = None
    if args.warm_up_first and hasattr(executor, "warm_up"):
        began = time.perf_counter()
        executor.warm_up(timeout=CHILD_TIMEOUT_S)
        warm_up_s = time.perf_counter() - began
    first = None
    tasks = [args.task_ms] * args.tasks
    kib = [args.result_kib] * max(args.tasks, args.warm_tasks)
    with executor:
        for _ in executor.map(sleep_ms, tasks, kib):
            if first is None:
                first = time.perf_counter() - start
        last = time.perf_counter() - start
        # A longer batch on the warm pool: dispatch alone, no start-up.
        again, spun = time.perf_counter(), spins[0]
        for _ in executor.map(sleep_ms, [args.task_ms] * args.warm_tasks, kib):
            pass
        warm = time.perf_counter() - again
        beside = (spins[0] - spun) / warm
        trips = []
        for _ in range(args.round_trips):
            began = time.perf_counter()
            executor.submit(sleep_ms, 0).result(timeout=CHILD_TIMEOUT_S)
            trips.append(time.perf_counter() - began)
    stop.set()
    return {
        "pool": pool,
        "hog": args.hog,
        "import_s": imported,
        "first_s": first,
        "last_s": last,
        "warm_s": warm,
        "round_trip_ms": median(trips) * 1e3 if trips else None,
        "hog_rate": beside / alone if alone else None,
        "warm_up_s": warm_up_s,
    }


def _run_child(pool: str, pythonpath: str, args: argparse.Namespace, hog: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.gil_probe",
        "--child",
        pool,
        "--workers",
        str(args.workers),
        "--tasks",
        str(args.tasks),
        "--task-ms",
        str(args.task_ms),
        "--warm-tasks",
        str(args.warm_tasks),
        "--hog-ms",
        str(args.hog_ms),
        "--result-kib",
        str(args.result_kib),
        "--hog-kind",
        args.hog_kind,
        "--round-trips",
        str(args.round_trips),
        *(["--warm-up-first"] if args.warm_up_first else []),
        *(["--hog"] if hog else []),
    ]
    out = subprocess.run(
        cmd,
        env=env,
        # ``-m`` puts the working directory first on sys.path: the tree the pool is taken from
        # (the first entry of ``pythonpath``) must be it, or every pool would be this tree's.
        cwd=pythonpath.split(os.pathsep)[0],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    if out.returncode != 0:
        return {"pool": pool, "hog": hog, "error": out.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _tree(pythonpath: str) -> str:
    """Where a child with ``pythonpath`` (run as :func:`_run_child` runs it) imports the package
    from: printed with the results, so a comparison shows that it compared two trees."""
    out = subprocess.run(
        [sys.executable, "-c", "import precompile_executor as p; print(p.__file__)"],
        env=dict(os.environ, PYTHONPATH=pythonpath),
        cwd=pythonpath.split(os.pathsep)[0],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Run the probe (or, with ``--child``, one measurement of it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        help="a commit, or a directory with precompile_executor/ (may be given more than once)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=48)
    parser.add_argument("--task-ms", type=float, default=20.0)
    parser.add_argument("--warm-tasks", type=int, default=200, help="the batch on the warm pool")
    parser.add_argument("--hog-ms", type=float, default=50.0)
    parser.add_argument(
        "--result-kib", type=int, default=0, help="each task returns this many KiB (0: a float)"
    )
    parser.add_argument(
        "--hog-kind",
        choices=("c", "python"),
        default="c",
        help="c: one C call holds the GIL --hog-ms; python: a Python loop",
    )
    parser.add_argument("--round-trips", type=int, default=30, help="one-at-a-time no-op tasks")
    parser.add_argument(
        "--warm-up-first",
        action="store_true",
        help="start the workers with warm_up() (timed) before the first task",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # this, stdlib, or against-N
    parser.add_argument("--hog", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    repo = str(Path(__file__).resolve().parent.parent)
    paths = {"this": repo, "stdlib": repo}
    label = {"this": "this tree", "stdlib": "stdlib ProcessPoolExecutor (fork)"}
    with tempfile.TemporaryDirectory(prefix="pe-gil-probe-") as scratch:
        from .s9_versus import extract_all

        for i, (name, into) in enumerate(extract_all(args.against, Path(scratch))):
            paths[f"against-{i}"] = f"{into}{os.pathsep}{repo}"
            label[f"against-{i}"] = f"against {name}"
        pools = list(paths)
        for pool in pools:
            if pool != "stdlib":
                print(f"{label[pool]}: {_tree(paths[pool])}", flush=True)
        rows: dict[tuple[str, bool], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            order = pools[r % len(pools) :] + pools[: r % len(pools)]
            for pool in order:
                for hog in (True, False):
                    got = _run_child(pool, paths[pool], args, hog)
                    rows.setdefault((pool, hog), []).append(got)
                    print(f"round {r + 1} {pool:8} hog={hog!s:5} {got}", flush=True)
    from ._common import version

    ideal = args.tasks * args.task_ms / 1e3 / args.workers
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"python {sys.version.split()[0]}, loky {version('loky')}; `python -m "
        f"benchmarks.gil_probe {' '.join(sys.argv[1:])}`: {args.workers} workers, "
        f"{args.tasks} tasks of {args.task_ms:g} ms (ideal {ideal:.2f} s), the caller's hog "
        + (
            f"holding the GIL {args.hog_ms:g} ms a call"
            if args.hog_kind == "c"
            else "a Python loop"
        )
        + f"; medians of {args.rounds} rounds.\n"
    )
    print(
        "| pool | first result s (hog / quiet) | last result s (hog / quiet) | hog ÷ quiet "
        "| warm pool, --warm-tasks s (hog / quiet) | hog ÷ quiet "
        "| round trip ms (hog / quiet) | the hog's rate beside the warm batch |"
        + (" warm_up() s (hog / quiet) |" if args.warm_up_first else "")
    )
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.warm_up_first else ""))
    for pool in pools:
        cells = []
        for key in ("first_s", "last_s", "warm_s", "round_trip_ms"):
            values: dict[bool, float] = {}
            for hog in (True, False):
                good = [x[key] for x in rows[(pool, hog)] if x.get(key) is not None]
                values[hog] = median(good) if good else float("nan")
            cells.append(f"{values[True]:.2f} / {values[False]:.2f}")
            if key in ("last_s", "warm_s"):
                cells.append(f"{values[True] / values[False]:.2f}")
        rates = [x["hog_rate"] for x in rows[(pool, True)] if x.get("hog_rate") is not None]
        cells.append(f"{median(rates):.3f}" if rates else "—")
        if args.warm_up_first:
            starts = {
                hog: [x["warm_up_s"] for x in rows[(pool, hog)] if x.get("warm_up_s") is not None]
                for hog in (True, False)
            }
            cells.append(
                f"{median(starts[True]):.2f} / {median(starts[False]):.2f}"
                if starts[True] and starts[False]
                else "—"
            )
        print(f"| {label[pool]} | {' | '.join(cells)} |")

    def med(pool: str, key: str) -> float:
        good = [x[key] for x in rows[(pool, True)] if x.get(key) is not None]
        return median(good) if good else float("nan")

    print()
    for pool in pools[1:]:  # this tree against each other pool, beside the same hog
        print(
            f"ratio, this tree ÷ {label[pool]}, with the hog: warm pool "
            f"{med('this', 'warm_s') / med(pool, 'warm_s'):.2f}×, round trip "
            f"{med('this', 'round_trip_ms') / med(pool, 'round_trip_ms'):.2f}×"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
