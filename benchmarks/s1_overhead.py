"""Scenario 1: per-task overhead of a no-op on a warm pool, torch and triton loaded in the parent.

Two figures per pool: throughput of a ``map`` over many no-op tasks (µs per task, all workers
busy) and the sequential ``submit(...).result()`` round trip (µs, one task in flight). The map
is also timed over an eighth of the tasks: a per-task cost that grows with the batch means work
proportional to the queue length somewhere. The fork-per-task and fresh-interpreter rows are the
seed's two modes (``benchmarks/_seed.py``); their map runs at most ``workers`` at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import precompile_executor as pe

from . import _pools, _seed
from ._common import Context, median, timed
from ._report import Section, Table, Target, bars, fmt_us, intro
from ._tasks import noop

REFERENCE_US = {
    "stdlib PPE (fork)": "97 / 195",
    "stdlib PPE (spawn)": "84 / 218",
    "loky reusable": "141 / 342",
    "pebble ProcessPool": "52 / 166",
    "seed fork mode: one fork per task": "— / 6,300",
    "seed spawn mode: one fresh interpreter per task": "— / 1,500,000",
}
"""(map µs/task / round trip µs) on the project's 2-core machine (REFERENCE.md)."""


def _per_task(fn: Callable[[int], Any], n: int, reps: int) -> float:
    return median(timed(lambda: fn(n))[0] / n for _ in range(reps))


def _row(
    name: str,
    run_map: Callable[[int], Any] | None,
    submit: Callable[[int], Any],
    n_map: int,
    n_rt: int,
    reps: int,
    note: str = "",
    seed: bool = False,
) -> dict[str, Any]:
    """Time the map (at ``n_map`` and, on a pool, at an eighth of it) and the round trip; a pool
    is warmed first: every worker started and has run the task once."""
    if not seed and run_map is not None:
        run_map(max(64, n_map // 8))
        [submit(i) for i in range(min(20, n_rt))]
    nan = math.nan
    return {
        "name": name,
        "map": nan if run_map is None else _per_task(run_map, n_map, reps),
        "small": nan if seed or run_map is None else _per_task(run_map, max(8, n_map // 8), reps),
        "rt": nan if n_rt == 0 else _per_task(lambda n: [submit(i) for i in range(n)], n_rt, reps),
        "note": note,
    }


def _on(pool: Any, chunks: int = 1) -> tuple[Callable[[int], Any], Callable[[int], Any]]:
    def run_map(n: int) -> None:
        assert list(pool.map(noop, range(n), chunksize=chunks)) == list(range(n))

    return run_map, lambda i: pool.submit(noop, i).result()


def measure(ctx: Context) -> tuple[list[dict[str, Any]], list[str]]:
    w, reps = ctx.workers, ctx.repeats
    n_map, n_rt = (200, 50) if ctx.quick else (2000, 500)
    n_fork = 20 if ctx.quick else 100
    rows, skipped = [], []
    ctx.log(f"s1: PrecompileExecutor({w}), map of {n_map} no-ops, {n_rt} round trips")
    ex = pe.PrecompileExecutor(w)
    try:
        ex.warm_up(timeout=120)
        rows.append(_row("PrecompileExecutor (spawn path)", *_on(ex), n_map, n_rt, reps))
        for chunks in (20, 100):
            name = f"PrecompileExecutor map, chunksize={chunks}"
            rows.append(_row(name, *_on(ex, chunks), n_map, 0, reps, "map only"))
        fork = ex.options(path="fork")
        note = f"{n_fork} tasks in the map"
        rows.append(_row("PrecompileExecutor (fork path)", *_on(fork), n_fork, 50, reps, note))
    finally:
        ex.terminate_workers()
    # PrecompileExecutor goes first: a fork-started multiprocessing worker that exits runs the
    # parent's threading-atexit hooks, the library's hub shutdown among them.
    for pool in _pools.each(("ppe-fork", "ppe-spawn", "loky", "pebble"), w, ctx, skipped):
        with pool:
            rows.append(_row(pool.name, *_on(pool), n_map, n_rt, reps))

    ctx.log("s1: the seed's modes (one fork, one fresh interpreter per task)")
    seq = 10 if ctx.quick else 50
    rows.append(
        _row(
            "seed fork mode: one fork per task",
            lambda n: _seed.run_forked([(noop, (i,)) for i in range(n)], w),
            lambda i: _seed.run_forked([(noop, (i,))], 1),
            n_fork,
            seq,
            reps,
            f"{n_fork} tasks in the map, {seq} round trips",
            seed=True,
        )
    )
    spawned = 1 if ctx.quick else 3
    rows.append(
        _row(
            "seed spawn mode: one fresh interpreter per task",
            None if ctx.quick else lambda n: _seed.run_spawned([(noop, (i,)) for i in range(n)], w),
            lambda i: _seed.run_spawned([(noop, (i,))], 1),
            2 * w,
            spawned,
            1,
            f"{2 * w} tasks in the map, {spawned} round trips",
            seed=True,
        )
    )
    return rows, skipped


def run(ctx: Context) -> Section:
    rows, skipped = measure(ctx)
    w, n_map = ctx.workers, 200 if ctx.quick else 2000
    table = Table.of(
        f"No-op task overhead, warm pools of {w} workers (µs; median of {ctx.repeats})",
        [
            {
                "pool": r["name"],
                f"map, {n_map} tasks (µs/task)": fmt_us(r["map"]),
                f"map, {max(8, n_map // 8)} tasks (µs/task)": fmt_us(r["small"]),
                "submit→result round trip (µs)": fmt_us(r["rt"]),
                "reference, 2-core (map / round trip)": REFERENCE_US.get(r["name"], ""),
                "note": r["note"],
            }
            for r in rows
        ],
    )
    by = {r["name"]: r for r in rows}
    ours, ppe = by["PrecompileExecutor (spawn path)"], by.get("stdlib PPE (fork)")
    section = Section(
        "s1", "1. Per-task overhead (no-op, warm pool)", intro(__doc__), [table], notes=skipped
    )
    if ppe is not None:
        growth = (
            f"its map costs {fmt_us(ours['small'])} µs/task at {max(8, n_map // 8)} tasks and "
            f"{fmt_us(ours['map'])} at {n_map}; with chunksize=100 "
            f"{fmt_us(by['PrecompileExecutor map, chunksize=100']['map'])}; a map cannot beat "
            f"round trip / workers = {fmt_us(ours['rt'] / w)} µs/task without sending ahead"
        )
        ratio = ours["map"] / ppe["map"]
        section.targets.append(
            Target("warm map overhead vs stdlib PPE (fork)", ratio, "<=", 1.0, 1.5, why=growth)
        )
        section.notes.append(
            f"Round trip, PrecompileExecutor vs stdlib PPE (fork): {ours['rt'] / ppe['rt']:.2f}×"
            " (no target)."
        )
    section.plot = bars(
        f"1. No-op task overhead, warm pools of {w} (µs, log scale)",
        [r["name"].replace("seed ", "").replace(": one", ":\none") for r in rows],
        {
            f"map, µs per task ({n_map} tasks)": ([r["map"] * 1e6 for r in rows], "tab:orange"),
            "submit→result round trip, µs": ([r["rt"] * 1e6 for r in rows], "tab:blue"),
        },
        "µs (log)",
        log=True,
        fmt="{:,.0f}",
    )
    return section
