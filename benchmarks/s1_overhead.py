"""Scenario 1: per-task overhead of a no-op on a warm pool, torch and triton loaded in the parent.

Two figures per pool: throughput of a ``map`` over many no-op tasks (µs per task, all workers
busy) and the sequential ``submit(...).result()`` round trip (µs, one task in flight). The map
is also timed over an eighth of the tasks: a per-task cost that grows with the batch means work
proportional to the queue length somewhere. The fork-per-task and fresh-interpreter rows are
Helion's two modes (``benchmarks/_helion_modes.py``); their map runs at most ``workers`` at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import precompile_executor as pe

from . import _helion_modes, _pools
from ._common import Context, median, timed
from ._report import Section, Table, Target, bars, fmt_us, intro
from ._tasks import noop

REFERENCE_US = {
    "stdlib PPE (fork)": "97 / 195",
    "stdlib PPE (spawn)": "84 / 218",
    "loky reusable": "141 / 342",
    "pebble ProcessPool": "52 / 166",
    "Helion's fork mode: one fork per task": "— / 6,300",
    "Helion's spawn mode: one fresh interpreter per task": "— / 1,500,000",
}
"""(map µs/task / round trip µs) on the project's 2-core machine (REFERENCE.md)."""

Runner = Callable[[int], Any]


def _per_task(fn: Runner | None, n: int, reps: int) -> float:
    return (
        math.nan
        if fn is None or n == 0
        else median(timed(lambda: fn(n))[0] / n for _ in range(reps))
    )


def _on(pool: Any, chunks: int = 1) -> tuple[Runner, Runner]:
    def run_map(n: int) -> None:
        assert list(pool.map(noop, range(n), chunksize=chunks)) == list(range(n))

    return run_map, lambda n: [pool.submit(noop, i).result() for i in range(n)]


def measure(ctx: Context) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per pool (name, map at n and n/8, round trip, note); a pool is warmed first."""
    w, reps = ctx.workers, ctx.repeats
    n_map, n_rt, n_fork = (200, 50, 20) if ctx.quick else (2000, 500, 100)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []

    def row(
        name: str,
        run_map: Runner | None,
        rt: Runner,
        n: int,
        n_rt: int,
        note: str = "",
        per_task_process: bool = False,
        r: int = reps,
    ) -> None:
        if not per_task_process and run_map is not None:
            run_map(max(64, n // 8))
            rt(min(20, n_rt))
        small = _per_task(None if per_task_process else run_map, max(8, n // 8), r)
        rows.append(
            {
                "name": name,
                "map": _per_task(run_map, n, r),
                "small": small,
                "rt": _per_task(rt, n_rt, r),
                "note": note,
            }
        )

    ctx.log(f"s1: PrecompileExecutor({w}), map of {n_map} no-ops, {n_rt} round trips")
    with pe.PrecompileExecutor(w) as ex:
        ex.warm_up(timeout=120)
        row("PrecompileExecutor (spawn path)", *_on(ex), n_map, n_rt)
        for chunks in (20, 100):
            row(
                f"PrecompileExecutor map, chunksize={chunks}",
                *_on(ex, chunks),
                n_map,
                0,
                "map only",
            )
        note = f"{n_fork} tasks in the map"
        row("PrecompileExecutor (fork path)", *_on(ex.options(path="fork")), n_fork, 50, note)
        ex.terminate_workers()
    # PrecompileExecutor goes first: a fork-started multiprocessing worker that exits runs the
    # parent's threading-atexit hooks, the library's hub shutdown among them.
    for pool in _pools.each(("ppe-fork", "ppe-spawn", "loky", "pebble"), w, ctx, skipped):
        with pool:
            row(pool.name, *_on(pool), n_map, n_rt)
    ctx.log("s1: Helion's two modes (one fork, one fresh interpreter per task)")
    seq, spawned = (10, 1) if ctx.quick else (50, 3)
    for mode, n, n_rt, name in (
        (_helion_modes.run_forked, n_fork, seq, "Helion's fork mode: one fork per task"),
        (
            _helion_modes.run_spawned,
            2 * w,
            spawned,
            "Helion's spawn mode: one fresh interpreter per task",
        ),
    ):

        def many(n: int, mode: Any = mode) -> Any:
            return mode([(noop, (i,)) for i in range(n)], w)

        def one(n: int, mode: Any = mode) -> Any:
            return [mode([(noop, (i,))], 1) for i in range(n)]

        spawn = mode is _helion_modes.run_spawned
        note = f"{n} tasks in the map, {n_rt} round trips"
        row(
            name,
            None if spawn and ctx.quick else many,
            one,
            n,
            n_rt,
            note,
            True,
            1 if spawn else reps,
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
    section = Section(
        "s1", "1. Per-task overhead (no-op, warm pool)", intro(__doc__), [table], notes=skipped
    )
    by = {r["name"]: r for r in rows}
    ours, ppe = by["PrecompileExecutor (spawn path)"], by.get("stdlib PPE (fork)")
    if ppe is not None:
        why = (
            f"its map costs {fmt_us(ours['small'])} µs/task at {max(8, n_map // 8)} tasks and "
            f"{fmt_us(ours['map'])} at {n_map}; with chunksize=100 "
            f"{fmt_us(by['PrecompileExecutor map, chunksize=100']['map'])}; a map cannot beat "
            f"round trip / workers = {fmt_us(ours['rt'] / w)} µs/task without sending ahead"
        )
        ratio = ours["map"] / ppe["map"]
        section.targets.append(
            Target("warm map overhead vs stdlib PPE (fork)", ratio, "<=", 1.0, 1.5, why=why)
        )
        section.notes.append(
            "Round trip, PrecompileExecutor vs stdlib PPE (fork): "
            f"{ours['rt'] / ppe['rt']:.2f}× (no target)."
        )
    section.plot = bars(
        f"1. No-op task overhead, warm pools of {w} (µs, log scale)",
        [r["name"].replace("Helion's ", "").replace(": one", ":\none") for r in rows],
        {
            f"map, µs per task ({n_map} tasks)": ([r["map"] * 1e6 for r in rows], "tab:orange"),
            "submit→result round trip, µs": ([r["rt"] * 1e6 for r in rows], "tab:blue"),
        },
        "µs (log)",
        log=True,
        fmt="{:,.0f}",
    )
    return section
