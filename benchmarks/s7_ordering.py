"""Scenario 7: ordering by predicted cost — plain ``map`` and ``triton.warm`` vs an oracle order.

The same N matmul configs as scenario 2, each strategy into a fresh Triton cache, on warm
workers (each compiled an unrelated kernel first). Per round:

* **ours, listed order**: ``ex.map(compile_config, configs)`` — nothing known, submission order;
* **ours, map, cold history**: ``ex.map(compile_config_costed, configs)`` on an executor with an
  empty history file: only the function's own prior (the Triton config prior) orders it;
* **ours, oracle**: ``batch()`` + ``options(priority=measured sequential time)``;
* **ours, map, history**: the same ``map`` again: the durations observed by the cold run order it;
* **stdlib PPE (spawn), listed map**: pre-warmed the same way;
* **triton.warm, cold / history**: ``precompile_executor.triton.warm`` of an autotuned matmul with
  the same configs, with an empty history file beside the cache, then again.

With ``--contention``: the history ``map`` with W = cores/2, 3·cores/4 and cores workers, and W =
cores pinned one per core (``os.sched_setaffinity`` in the initializer). A Gantt chart of the cold
and history runs of the first round (``PrecompileExecutor.timeline()``) goes to
``<out>/ordering-gantt.png``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import triton

import precompile_executor as pe
from precompile_executor.triton import TensorSpec, launch, triton_prior_s, warm

from . import _batch, _pools, gantt
from ._common import Context, median, spread
from ._kernels import Config, compile_config, configs, matmul, triton_cache_dir, warm_compile
from ._report import Section, Table, Target
from ._tasks import import_torch_triton, import_torch_triton_pinned

HISTORY_ENV = "PRECOMPILE_EXECUTOR_COST_HISTORY"


def _config_estimate(cfg: Config, cache_dir: str) -> pe.Estimate:
    bm, bn, bk, stages, warps = cfg
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    return pe.Estimate(seconds=triton_prior_s(blocks, num_warps=warps, num_stages=stages))


@pe.estimated_cost(_config_estimate)
def compile_config_costed(cfg: Config, cache_dir: str) -> dict[str, Any]:
    """``compile_config`` declaring its prior cost (the Triton config prior) to the executor, as a
    compile function written for the executor does; the caller passes no hint."""
    return compile_config(cfg, cache_dir)


def _map_run(
    ex: pe.PrecompileExecutor, fn: Callable[..., Any], cfgs: Sequence[Config], cache: str
) -> tuple[float, list[pe.TaskTimeline]]:
    before = len(ex.timeline())
    start = time.perf_counter()
    results = list(ex.map(fn, cfgs, itertools.repeat(cache), timeout=_batch.RESULT_TIMEOUT_S))
    wall = time.perf_counter() - start
    assert len(results) == len(cfgs)
    return wall, list(ex.timeline()[before:])


def _oracle_run(
    ex: pe.PrecompileExecutor, cfgs: Sequence[Config], times: dict[Config, float], cache: str
) -> tuple[float, list[pe.TaskTimeline]]:
    before = len(ex.timeline())
    start = time.perf_counter()
    with ex.batch():
        futures = [ex.options(priority=times[c]).submit(compile_config, c, cache) for c in cfgs]
    for f in futures:
        f.result(timeout=_batch.RESULT_TIMEOUT_S)
    return time.perf_counter() - start, list(ex.timeline()[before:])


def _autotuned(cfgs: Sequence[Config]) -> Any:
    return triton.autotune(
        configs=[
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                num_warps=warps,
                num_stages=stages,
            )
            for bm, bn, bk, stages, warps in cfgs
        ],
        key=["M", "N", "K"],
    )(matmul)


def _warm_run(
    ex: pe.PrecompileExecutor, kernel: Any, cache: str
) -> tuple[float, int, list[pe.TaskTimeline], dict[int, float]]:
    m = n = k = 4096
    a, b, c = (TensorSpec("fp16", (m, k)), TensorSpec("fp16", (k, n)), TensorSpec("fp16", (m, n)))
    args = (a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    args += (c.stride(0), c.stride(1))
    before = len(ex.timeline())
    with triton_cache_dir(cache):
        report = warm({kernel: [launch(*args)]}, target="cuda:90", executor=ex)
    records = list(ex.timeline()[before:])
    jobs = [r.job for r in report.results if r.job is not None]
    return report.wall_time_s, report.count("ok"), records, gantt.installed_by_task(jobs, records)


def _prewarmed_stdlib(w: int) -> _pools.Pool:
    pool = _pools.start("ppe-spawn", w, import_torch_triton)
    for _ in range(2):  # spawn starts workers on demand: keep them all busy once, twice
        for f in [pool.submit(warm_compile, 0.3) for _ in range(w)]:
            f.result(timeout=_batch.RESULT_TIMEOUT_S)
    return pool


def run(ctx: Context) -> Section:
    w = ctx.workers
    cfgs = configs(ctx.n_configs, ctx.quick)
    ctx.log(f"s7: {len(cfgs)} configs on {w} workers, {ctx.repeats} round(s)")
    times = _batch.warm_times(ctx, cfgs)
    seq_sum = sum(times.values())
    ideal = _batch.ideal(list(times.values()), w)
    walls: dict[str, list[float]] = {}
    slow: dict[str, list[float]] = {}
    gantts: list[tuple[str, Sequence[pe.TaskTimeline], dict[int, float]]] = []
    kernel = _autotuned(cfgs)
    warm_ok: list[int] = []
    stdlib = _prewarmed_stdlib(w)
    names = {
        "listed": "ours: map, listed order (nothing known)",
        "cold": "ours: map, cold history (prior only)",
        "oracle": "ours: batch() + priority = measured time (oracle)",
        "history": "ours: map, history (second run)",
        "stdlib": "stdlib PPE (spawn), pre-warmed, listed map",
        "warm_cold": "triton.warm, cold history",
        "warm_history": "triton.warm, history (second run)",
    }

    def keep(key: str, wall: float, records: Sequence[pe.TaskTimeline] = ()) -> None:
        walls.setdefault(key, []).append(wall)
        if records:
            run_s = sum(r.run_s or 0.0 for r in records)
            slow.setdefault(key, []).append(run_s / seq_sum)
        ctx.log(f"s7: {names[key]}: {wall:.2f}s")

    try:
        for rnd in range(ctx.repeats):
            history = os.path.join(ctx.fresh_dir("history"), "costs.json")
            ex = _batch.new_executor(w, cost_history=history)
            try:
                _batch.warm_workers(ex)
                wall, recs = _map_run(ex, compile_config, cfgs, ctx.fresh_dir("cache"))
                keep("listed", wall, recs)
                wall, cold = _map_run(ex, compile_config_costed, cfgs, ctx.fresh_dir("cache"))
                keep("cold", wall, cold)
                wall, recs = _oracle_run(ex, cfgs, times, ctx.fresh_dir("cache"))
                keep("oracle", wall, recs)
                wall, hist = _map_run(ex, compile_config_costed, cfgs, ctx.fresh_dir("cache"))
                keep("history", wall, hist)
                if rnd == 0:
                    gantts += [(names["cold"], cold, {}), (names["history"], hist, {})]
                start = time.perf_counter()
                cache = ctx.fresh_dir("cache")
                list(stdlib.executor.map(compile_config, cfgs, itertools.repeat(cache)))
                keep("stdlib", time.perf_counter() - start)
                os.environ[HISTORY_ENV] = os.path.join(ctx.fresh_dir("thistory"), "costs.json")
                try:
                    for key in ("warm_cold", "warm_history"):
                        wall, ok, recs, installed = _warm_run(ex, kernel, ctx.fresh_dir("cache"))
                        warm_ok.append(ok)
                        keep(key, wall, recs)
                        if rnd == 0 and key == "warm_history":
                            gantts.append((names[key], recs, installed))
                finally:
                    os.environ.pop(HISTORY_ENV, None)
            finally:
                ex.shutdown()
    finally:
        stdlib.close()

    def med(key: str) -> float:
        return median(walls[key])

    oracle = med("oracle")
    table = Table(
        f"{len(cfgs)} matmul configs for sm_90 on {w} workers, ordering strategies (seconds; "
        f"median (min–max) of {ctx.repeats})",
        ["strategy", "wall (s)", "× oracle", "× ideal", "Σ in-worker / Σ sequential"],
    )
    table.add(f"ideal on {w} workers", f"{ideal:.2f}", f"{ideal / oracle:.2f}", "1.00", "—")
    table.add(
        "model: longest first, zero overhead",
        f"{_batch.lpt(list(times.values()), w):.2f}",
        f"{_batch.lpt(list(times.values()), w) / oracle:.2f}",
        f"{_batch.lpt(list(times.values()), w) / ideal:.2f}",
        "—",
    )
    for key, name in names.items():
        table.add(
            name,
            spread(walls[key]),
            f"{med(key) / oracle:.2f}",
            f"{med(key) / ideal:.2f}",
            f"{median(slow[key]):.2f}" if key in slow else "—",
        )
    targets = [
        Target("map, cold history / oracle", med("cold") / oracle, "<=", 1.15),
        Target("map, history / oracle", med("history") / oracle, "<=", 1.05),
        Target(
            "stdlib listed map / ours map with history", med("stdlib") / med("history"), ">=", 1.2
        ),
        Target("triton.warm, cold history / oracle", med("warm_cold") / oracle, "<=", 1.15),
        Target("triton.warm, history / oracle", med("warm_history") / oracle, "<=", 1.05),
        Target(
            "stdlib listed map / triton.warm with history",
            med("stdlib") / med("warm_history"),
            ">=",
            1.2,
        ),
    ]
    if w <= 2:
        targets.append(
            Target(f"map, history / ideal ({w} workers)", med("history") / ideal, "<=", 1.05)
        )
    section = Section(
        "s7",
        "7. Ordering by predicted cost",
        f"{len(cfgs)} configs as in scenario 2, {w} warm workers, each run into a fresh Triton "
        "cache. 'cold history': an executor whose history file is empty, so only the compile "
        "function's prior (`precompile_executor.triton.triton_prior_s` of the block sizes and "
        "warps, declared with `@precompile_executor.estimated_cost`) orders the batch; "
        "'history': the same call again, ordered by the durations the cold run observed. "
        "No run passes a hint. The oracle orders by each config's measured sequential time. "
        "`triton.warm` compiles an autotuned copy of the kernel with the same configs (Triton "
        "specialises its integer arguments, so its compiles differ slightly from the others').",
        tables=[table],
        targets=targets,
    )
    if warm_ok:
        section.notes.append(
            f"triton.warm compiled {min(warm_ok)}–{max(warm_ok)} of {len(cfgs)} configs per run "
            "(the rest were already in the JIT's memory or failed)."
        )
    _timeline_notes(section, gantts, w, seq_sum)
    if ctx.contention:
        _contention(ctx, section, cfgs, times)
    if ctx.out is not None and gantts:
        path = ctx.out / "ordering-gantt.png"
        if gantt.draw(path, gantts, w, stamp=f"{len(cfgs)} configs, {w} workers"):
            section.notes.append(f"Gantt chart of the first round: ![timeline]({path.name})")
    section.plot = {
        "title": f"7. {len(cfgs)} configs on {w} workers: ordering (s)",
        "labels": ["ideal", *names.values()],
        "values": [ideal] + [med(k) for k in names],
        "xlabel": "wall seconds",
        "lines": [{"x": oracle, "label": "oracle", "color": "tab:green"}],
    }
    return section


def _timeline_notes(
    section: Section,
    gantts: Sequence[tuple[str, Sequence[pe.TaskTimeline], dict[int, float]]],
    w: int,
    seq_sum: float,
) -> None:
    table = Table(
        "Where the time went (first round, from PrecompileExecutor.timeline())",
        [
            "batch",
            "wall (s)",
            "Σ in worker (s)",
            "Σ sent→Started (s)",
            "Σ Done→set (+install) (s)",
            "parent share",
            "idle capacity",
            "parallel slowdown",
            "tail (s)",
        ],
    )
    for title, records, installed in gantts:
        if not records:
            continue
        s = gantt.summarize(records, w, seq_sum, installed)
        table.add(
            title,
            f"{s.wall_s:.2f}",
            f"{s.run_s:.2f}",
            f"{s.dispatch_s:.3f}",
            f"{s.result_s:.3f}",
            f"{s.parent_share:.1%}",
            f"{s.idle_share:.1%}",
            f"{s.slowdown:.2f}×" if s.slowdown else "—",
            f"{s.tail_s:.2f}",
        )
    section.tables.append(table)
    section.notes.append(
        "Parent share: the part of each task's time on a worker slot spent in the parent "
        "(sending it until the worker's Started arrives, and from its Done to the future set, "
        "plus installing artifacts for triton.warm). Idle capacity: 1 − Σ in-worker time / "
        "(workers × wall). Parallel slowdown: Σ in-worker time / Σ sequential time of the same "
        "configs (compiles slowing each other down on shared cores, caches, memory bandwidth). "
        "Tail: from the last task's start to the end of the batch."
    )


def _contention(
    ctx: Context, section: Section, cfgs: Sequence[Config], times: dict[Config, float]
) -> None:
    cores = ctx.cores
    counts = sorted({max(1, cores // 2), max(1, (3 * cores) // 4), cores})
    history = os.path.join(ctx.fresh_dir("chistory"), "costs.json")
    table = Table(
        f"Contention: the history map of {len(cfgs)} configs by worker count and pinning "
        f"({cores} usable cores; median of {ctx.repeats})",
        ["workers", "pinned", "wall (s)", "× ideal for that count", "Σ in-worker / Σ sequential"],
    )
    seq_sum = sum(times.values())
    runs: list[tuple[int, bool]] = [(n, False) for n in counts] + [(cores, True)]
    for n, pinned in runs:
        ctx.log(f"s7: contention, {n} workers{' pinned' if pinned else ''}")
        if pinned:
            counter = os.path.join(ctx.fresh_dir("pin"), "counter")
            # Interpreters: pinning is per process, and a warm template would run this
            # initializer once and fork every worker onto its one core.
            ex = pe.PrecompileExecutor(
                n,
                initializer=import_torch_triton_pinned,
                initargs=(counter,),
                cost_history=history,
                start="interpreter",
            )
        else:
            ex = _batch.new_executor(n, cost_history=history)
        try:
            _batch.warm_workers(ex)
            _map_run(ex, compile_config_costed, cfgs, ctx.fresh_dir("cache"))  # learn
            walls, ratios = [], []
            for _ in range(ctx.repeats):
                wall, recs = _map_run(ex, compile_config_costed, cfgs, ctx.fresh_dir("cache"))
                walls.append(wall)
                ratios.append(sum(r.run_s or 0.0 for r in recs) / seq_sum)
        finally:
            if pinned:
                ex.terminate_workers()  # pinned workers must not serve later executors
            else:
                ex.shutdown()
        ideal = _batch.ideal(list(times.values()), n)
        table.add(
            str(n),
            "yes" if pinned else "no",
            spread(walls),
            f"{median(walls) / ideal:.2f}",
            f"{median(ratios):.2f}",
        )
    section.tables.append(table)
    section.notes.append(
        "Contention decides `DEFAULT_WORKERS_PER_CORE` (precompile_executor/_executor.py): "
        "the default `max_workers` is that many per usable core."
    )
