"""Scenario 1: per-task overhead of a no-op on a warm pool, torch and triton loaded in the parent.

Two figures per pool: throughput of a ``map`` over many no-op tasks (µs per task, all workers
busy) and the sequential ``submit(...).result()`` round trip (µs, one task in flight). The map
is also timed over an eighth of the tasks: a per-task cost that grows with the batch means work
proportional to the queue length somewhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import precompile_executor as pe

from . import _pools, _seed
from ._common import Context, median, timed
from ._report import Section, Table, Target, fmt_us
from ._tasks import noop

REFERENCE_US = {
    "stdlib PPE (fork)": (97, 195),
    "stdlib PPE (spawn)": (84, 218),
    "loky reusable": (141, 342),
    "pebble ProcessPool": (52, 166),
    "seed fork mode: one fork per task": (None, 6300),
    "seed spawn mode: one fresh interpreter per task": (None, 1_500_000),
}
"""(map µs/task, round trip µs) measured on the project's 2-core machine (REFERENCE.md)."""


class _Row:
    def __init__(self, name: str) -> None:
        self.name = name
        self.map_small = math.nan
        self.map = math.nan
        self.rt = math.nan
        self.note = ""


def _measure(
    row: _Row,
    submit: Callable[[Any], Any],
    run_map: Callable[[int], list[Any]],
    n_map: int,
    n_rt: int,
    reps: int,
) -> None:
    run_map(max(64, n_map // 8))  # warm: every worker started and has run the task once
    for i in range(min(20, n_rt)):
        submit(i)
    small = max(8, n_map // 8)
    row.map_small = median(timed(lambda: run_map(small))[0] / small for _ in range(reps))
    row.map = median(timed(lambda: run_map(n_map))[0] / n_map for _ in range(reps))

    def round_trips() -> None:
        for i in range(n_rt):
            submit(i)

    row.rt = median(timed(round_trips)[0] / n_rt for _ in range(reps))


def _pool_row(
    name: str, pool: _pools.Pool, n_map: int, n_rt: int, reps: int, chunks: int = 1
) -> _Row:
    row = _Row(name)

    def run_map(n: int) -> list[Any]:
        result = list(pool.map(noop, range(n), chunksize=chunks))
        assert result == list(range(n))
        return result

    _measure(row, lambda i: pool.submit(noop, i).result(), run_map, n_map, n_rt, reps)
    return row


def _chunked_row(ex: pe.PrecompileExecutor, chunks: int, n_map: int, reps: int) -> _Row:
    row = _Row(f"PrecompileExecutor map, chunksize={chunks}")
    for n in (max(8, n_map // 8), n_map):
        value = median(
            timed(lambda: list(ex.map(noop, range(n), chunksize=chunks)))[0] / n  # noqa: B023
            for _ in range(reps)
        )
        if n == n_map:
            row.map = value
        else:
            row.map_small = value
    row.note = "map only"
    return row


def run(ctx: Context) -> Section:
    w = ctx.workers
    n_map = 200 if ctx.quick else 2000
    n_rt = 50 if ctx.quick else 500
    reps = 1 if ctx.quick else 3
    rows: list[_Row] = []
    skipped: list[str] = []

    ctx.log(f"s1: PrecompileExecutor({w}), map of {n_map} no-ops, {n_rt} round trips")
    ex = pe.PrecompileExecutor(w)
    try:
        ex.warm_up(timeout=120)
        pool = _pools.Pool("PrecompileExecutor", ex, ex.terminate_workers)
        rows.append(_pool_row("PrecompileExecutor (spawn path)", pool, n_map, n_rt, reps))
        for chunks in (20, 100):
            rows.append(_chunked_row(ex, chunks, n_map, reps))
        fork = ex.options(path="fork")
        n_fork = min(n_map, 100 if not ctx.quick else 20)
        row = _Row("PrecompileExecutor (fork path)")
        _measure(
            row,
            lambda i: fork.submit(noop, i).result(),
            lambda n: list(fork.map(noop, range(n))),
            n_fork,
            min(n_rt, 50),
            reps,
        )
        row.note = f"{n_fork} tasks in the map"
        rows.append(row)
    finally:
        ex.terminate_workers()

    # PrecompileExecutor goes first: a fork-started multiprocessing worker that exits runs the
    # parent's threading-atexit hooks, the library's hub shutdown among them (reported).
    for name in ("ppe-fork", "ppe-spawn", "loky", "pebble"):
        why = _pools.missing(name)
        if why:
            skipped.append(f"{name}: skipped, {why}")
            continue
        ctx.log(f"s1: {name}")
        pool = _pools.start(name, w)
        try:
            rows.append(_pool_row(pool.name, pool, n_map, n_rt, reps))
        finally:
            pool.close()

    ctx.log("s1: seed fork mode (one fork per task)")
    row = _Row("seed fork mode: one fork per task")
    n_fork = 20 if ctx.quick else 100
    row.map = median(
        timed(lambda: _seed.run_forked([(noop, (i,)) for i in range(n_fork)], w))[0] / n_fork
        for _ in range(reps)
    )
    n_seq = 10 if ctx.quick else 50
    row.rt = median(
        timed(lambda: [_seed.run_forked([(noop, (i,))], 1) for i in range(n_seq)])[0] / n_seq
        for _ in range(reps)
    )
    row.note = f"{n_fork} tasks in the map, {n_seq} round trips"
    rows.append(row)

    ctx.log("s1: seed spawn mode (one fresh interpreter per task, importing torch and triton)")
    row = _Row("seed spawn mode: one fresh interpreter per task")
    n_seq = 1 if ctx.quick else 3
    row.rt = timed(lambda: [_seed.run_spawned([(noop, (i,))], 1) for i in range(n_seq)])[0] / n_seq
    if not ctx.quick:
        n_par = 2 * w
        row.map = timed(lambda: _seed.run_spawned([(noop, (i,)) for i in range(n_par)], w))[0]
        row.map /= n_par
        row.note = f"{n_par} tasks in the map, {n_seq} round trips"
    else:
        row.note = f"{n_seq} round trip"
    rows.append(row)

    table = Table(
        f"No-op task overhead, warm pools of {w} workers (µs; median of {reps})",
        [
            "pool",
            f"map, {n_map} tasks (µs/task)",
            f"map, {max(8, n_map // 8)} tasks (µs/task)",
            "submit→result round trip (µs)",
            "reference, 2-core (map / round trip)",
            "note",
        ],
    )
    for r in rows:
        ref = REFERENCE_US.get(r.name)
        ref_text = "" if ref is None else " / ".join("—" if v is None else f"{v:,}" for v in ref)
        table.add(r.name, fmt_us(r.map), fmt_us(r.map_small), fmt_us(r.rt), ref_text, r.note)

    by_name = {r.name: r for r in rows}
    ours = by_name["PrecompileExecutor (spawn path)"]
    ppe = by_name.get("stdlib PPE (fork)")
    section = Section(
        "s1",
        "1. Per-task overhead (no-op, warm pool)",
        f"`map` throughput over {n_map} no-op tasks and the sequential submit→result round trip, "
        f"{w} workers, with torch and triton imported in the parent; every pool warmed first. "
        "The fork-per-task and fresh-interpreter rows are the seed's two modes (re-implemented in "
        "`benchmarks/_seed.py`); their map column runs them at most "
        f"{w} at a time. Reference figures are from REFERENCE.md (2-core machine).",
        tables=[table],
        notes=skipped,
    )
    if ppe is not None:
        ratio = ours.map / ppe.map
        reasons = []
        growth = ours.map / ours.map_small
        if growth > 1.3:
            reasons.append(
                f"PrecompileExecutor's per-task map cost grows with the batch "
                f"({fmt_us(ours.map_small)} µs/task at {max(8, n_map // 8)} tasks, "
                f"{fmt_us(ours.map)} at {n_map}): each dispatch does work proportional to the "
                "queue length"
            )
        bound = ours.rt / w
        if bound > ppe.map:
            reasons.append(
                f"it sends a task only to an idle worker and waits for that result before sending "
                f"the next (no prefetch), so a map cannot beat round trip / workers = "
                f"{fmt_us(bound)} µs/task, while the stdlib pool keeps a call queue ahead of its "
                "workers"
            )
        chunked = by_name.get("PrecompileExecutor map, chunksize=100")
        if chunked is not None:
            reasons.append(f"with chunksize=100 it does {fmt_us(chunked.map)} µs/task")
        section.targets.append(
            Target(
                "warm map overhead vs stdlib PPE (fork)",
                ratio,
                "<=",
                1.0,
                must=1.5,
                why="; ".join(reasons),
            )
        )
        section.notes.append(
            f"Round trip, PrecompileExecutor vs stdlib PPE (fork): {ours.rt / ppe.rt:.2f}× "
            "(no target)."
        )
    section.plot = {
        "title": f"1. No-op task overhead, warm pools of {w} (µs, log scale)",
        "labels": [r.name.replace("seed ", "").replace(": one", ":\none") for r in rows],
        "series": [
            (f"map, µs per task ({n_map} tasks)", [r.map * 1e6 for r in rows], "tab:orange"),
            ("submit→result round trip, µs", [r.rt * 1e6 for r in rows], "tab:blue"),
        ],
        "xlabel": "µs (log)",
        "log": True,
        "fmt": "{:,.0f}",
    }
    return section
