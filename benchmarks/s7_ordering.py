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
from precompile_executor.examples import kernels as examples
from precompile_executor.triton import triton_prior_s, warm

from . import _batch, _pools, gantt
from ._common import Context, median, spread
from ._kernels import Config, compile_config, configs, matmul, triton_cache_dir, warm_compile
from ._report import Section, Table, Target, bars, intro
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
    fp16_4096 = examples.PRECOMPILE_SPECS["matmul_kernel"][0]  # the package's 4096³ fp16 launch
    before = len(ex.timeline())
    with triton_cache_dir(cache):
        report = warm({kernel: [fp16_4096]}, target="cuda:90", executor=ex)
    records = list(ex.timeline()[before:])
    jobs = [r.job for r in report.results if r.job is not None]
    return report.wall_time_s, report.count("ok"), records, gantt.installed_by_task(jobs, records)


def _prewarmed_stdlib(w: int) -> _pools.Pool:
    pool = _pools.start("ppe-spawn", w, import_torch_triton)
    for _ in range(2):  # spawn starts workers on demand: keep them all busy once, twice
        for f in [pool.submit(warm_compile, 0.3) for _ in range(w)]:
            f.result(timeout=_batch.RESULT_TIMEOUT_S)
    return pool


NAMES = {
    "listed": "ours: map, listed order (nothing known)",
    "cold": "ours: map, cold history (prior only)",
    "oracle": "ours: batch() + priority = measured time (oracle)",
    "history": "ours: map, history (second run)",
    "stdlib": "stdlib PPE (spawn), pre-warmed, listed map",
    "warm_cold": "triton.warm, cold history",
    "warm_history": "triton.warm, history (second run)",
}


def _round(
    ctx: Context,
    cfgs: Sequence[Config],
    times: dict[Config, float],
    stdlib: _pools.Pool,
    kernel: Any,
) -> dict[str, tuple[float, Sequence[pe.TaskTimeline], dict[int, float], int]]:
    """One run of every strategy: key → (wall, timeline records, installs, configs compiled)."""
    out = {}
    history = os.path.join(ctx.fresh_dir("history"), "costs.json")
    with _batch.new_executor(ctx.workers, cost_history=history) as ex:
        _batch.warm_workers(ex)
        for key, fn in (
            ("listed", compile_config),
            ("cold", compile_config_costed),
            ("oracle", None),
            ("history", compile_config_costed),
        ):
            cache = ctx.fresh_dir("cache")
            wall, recs = (
                _oracle_run(ex, cfgs, times, cache) if fn is None else _map_run(ex, fn, cfgs, cache)
            )
            out[key] = (wall, recs, {}, len(cfgs))
        start = time.perf_counter()
        cache = ctx.fresh_dir("cache")
        list(stdlib.executor.map(compile_config, cfgs, itertools.repeat(cache)))
        out["stdlib"] = (time.perf_counter() - start, [], {}, len(cfgs))
        os.environ[HISTORY_ENV] = os.path.join(ctx.fresh_dir("thistory"), "costs.json")
        try:
            for key in ("warm_cold", "warm_history"):
                wall, ok, recs, installed = _warm_run(ex, kernel, ctx.fresh_dir("cache"))
                out[key] = (wall, recs, installed, ok)
        finally:
            os.environ.pop(HISTORY_ENV, None)
    for key, (wall, *_) in out.items():
        ctx.log(f"s7: {NAMES[key]}: {wall:.2f}s")
    return out


def run(ctx: Context) -> Section:
    w = ctx.workers
    cfgs = configs(ctx.n_configs, ctx.quick)
    ctx.log(f"s7: {len(cfgs)} configs on {w} workers, {ctx.repeats} round(s)")
    times = _batch.warm_times(ctx, cfgs)
    seq_sum = sum(times.values())
    ideal, lpt = _batch.ideal(list(times.values()), w), _batch.lpt(list(times.values()), w)
    with _prewarmed_stdlib(w) as stdlib:
        kernel = _autotuned(cfgs)  # one for all rounds, as one autotuner's kernel would be
        rounds = [_round(ctx, cfgs, times, stdlib, kernel) for _ in range(ctx.repeats)]

    def med(key: str) -> float:
        return median(r[key][0] for r in rounds)

    oracle = med("oracle")
    rows: list[dict[str, Any]] = [
        {"strategy": f"ideal on {w} workers", "wall (s)": ideal, "× oracle": ideal / oracle},
        {
            "strategy": "model: longest first, zero overhead",
            "wall (s)": lpt,
            "× oracle": lpt / oracle,
        },
    ]
    rows[0] |= {"× ideal": 1.0, "Σ in-worker / Σ sequential": None}
    rows[1] |= {"× ideal": lpt / ideal, "Σ in-worker / Σ sequential": None}
    for key, name in NAMES.items():
        slow = [sum(t.run_s or 0.0 for t in r[key][1]) / seq_sum for r in rounds if r[key][1]]
        rows.append(
            {
                "strategy": name,
                "wall (s)": spread(r[key][0] for r in rounds),
                "× oracle": med(key) / oracle,
                "× ideal": med(key) / ideal,
                "Σ in-worker / Σ sequential": median(slow) if slow else None,
            }
        )
    table = Table.of(
        f"{len(cfgs)} matmul configs for sm_90 on {w} workers, ordering strategies (seconds; "
        f"median (min–max) of {ctx.repeats})",
        rows,
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
    section = Section("s7", "7. Ordering by predicted cost", intro(__doc__), [table], targets)
    warm_ok = [r[k][3] for r in rounds for k in ("warm_cold", "warm_history")]
    section.notes.append(
        f"triton.warm compiled {min(warm_ok)}–{max(warm_ok)} of {len(cfgs)} configs per run "
        "(the rest were already in the JIT's memory or failed)."
    )
    gantts = [
        (NAMES[k], rounds[0][k][1], rounds[0][k][2]) for k in ("cold", "history", "warm_history")
    ]
    section.tables.append(_timeline_table(gantts, w, seq_sum))
    section.notes.append(TIMELINE_NOTE)
    if ctx.contention:
        section.tables.append(_contention(ctx, cfgs, times))
        section.notes.append(
            "Contention decides `DEFAULT_WORKERS_PER_CORE` (precompile_executor/_executor.py): "
            "the default `max_workers` is that many per usable core."
        )
    if ctx.out is not None:
        path = ctx.out / "ordering-gantt.png"
        if gantt.draw(path, gantts, w, stamp=f"{len(cfgs)} configs, {w} workers"):
            section.notes.append(f"Gantt chart of the first round: ![timeline]({path.name})")
    section.plot = bars(
        f"7. {len(cfgs)} configs on {w} workers: ordering (s)",
        ["ideal", *NAMES.values()],
        {"": ([ideal] + [med(k) for k in NAMES], "tab:blue")},
        colors=["tab:blue"] * (len(NAMES) + 1),
        lines=[{"x": oracle, "label": "oracle", "color": "tab:green"}],
    )
    return section


TIMELINE_NOTE = (
    "Parent share: the part of each task's time on a worker slot spent in the parent (sending it "
    "until the worker's Started arrives, and from its Done to the future set, plus installing "
    "artifacts for triton.warm). Idle capacity: 1 − Σ in-worker time / (workers × wall). "
    "Parallel slowdown: Σ in-worker time / Σ sequential time of the same configs (compiles "
    "slowing each other down on shared cores, caches, memory bandwidth). Tail: from the last "
    "task's start to the end of the batch."
)


def _timeline_table(
    gantts: Sequence[tuple[str, Sequence[pe.TaskTimeline], dict[int, float]]], w: int, seq: float
) -> Table:
    rows = []
    for title, records, installed in gantts:
        if records:
            s = gantt.summarize(records, w, seq, installed)
            rows.append(
                {
                    "batch": title,
                    "wall (s)": s.wall_s,
                    "Σ in worker (s)": s.run_s,
                    "Σ sent→Started (s)": f"{s.dispatch_s:.3f}",
                    "Σ Done→set (+install) (s)": f"{s.result_s:.3f}",
                    "parent share": f"{s.parent_share:.1%}",
                    "idle capacity": f"{s.idle_share:.1%}",
                    "parallel slowdown": f"{s.slowdown:.2f}×" if s.slowdown else "—",
                    "tail (s)": s.tail_s,
                }
            )
    return Table.of("Where the time went (first round, from PrecompileExecutor.timeline())", rows)


def _contention(ctx: Context, cfgs: Sequence[Config], times: dict[Config, float]) -> Table:
    cores = ctx.cores
    counts = sorted({max(1, cores // 2), max(1, (3 * cores) // 4), cores})
    history = os.path.join(ctx.fresh_dir("chistory"), "costs.json")
    seq_sum = sum(times.values())
    rows = []
    for n, pinned in [(n, False) for n in counts] + [(cores, True)]:
        ctx.log(f"s7: contention, {n} workers{' pinned' if pinned else ''}")
        if pinned:
            # Interpreters: pinning is per process, and a warm template would run this
            # initializer once and fork every worker onto its one core.
            counter = os.path.join(ctx.fresh_dir("pin"), "counter")
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
            runs = [
                _map_run(ex, compile_config_costed, cfgs, ctx.fresh_dir("cache"))
                for _ in range(ctx.repeats)
            ]
        finally:
            # Pinned workers must not serve later executors.
            ex.terminate_workers() if pinned else ex.shutdown()
        walls = [wall for wall, _ in runs]
        slow = [sum(r.run_s or 0.0 for r in recs) / seq_sum for _, recs in runs]
        rows.append(
            {
                "workers": str(n),
                "pinned": "yes" if pinned else "no",
                "wall (s)": spread(walls),
                "× ideal for that count": median(walls) / _batch.ideal(list(times.values()), n),
                "Σ in-worker / Σ sequential": median(slow),
            }
        )
    return Table.of(
        f"Contention: the history map of {len(cfgs)} configs by worker count and pinning "
        f"({cores} usable cores; median of {ctx.repeats})",
        rows,
    )
