"""Scenario 5: memory of the workers, each with torch and triton imported (an initializer).

For each pool: start it with ``workers`` workers whose initializer imports torch and triton, run
a few tasks until every worker has answered, then read RSS and USS (memory only that process
holds; a forked worker shares its parent's pages until it writes them) of every worker and of
the helper processes that outlive the pools (loky's and multiprocessing's resource trackers, the
library's guardian), which whichever pool starts first brings up for all. Then each
pool compiles a few small configs and is measured again: the compiler's memory stays in a warm
worker.
"""

from __future__ import annotations

import os
import time

import precompile_executor as pe

from . import _pools
from ._common import Context, descendants, memory_mib
from ._kernels import QUICK_CONFIGS, compile_config
from ._report import Section, Table
from ._tasks import getpid, import_torch_triton

POOLS = ("precompile", "ppe-spawn", "ppe-fork", "loky", "pebble")
"""PrecompileExecutor first: a fork-started multiprocessing worker that exits runs the parent's
threading-atexit hooks, the library's hub shutdown among them (reported as a library bug)."""


def _workers(pool: _pools.Pool, n: int) -> set[int]:
    found: set[int] = set()
    for _ in range(20):
        futures = [pool.submit(getpid, 0.2) for _ in range(2 * n)]
        found |= {f.result(timeout=300) for f in futures}
        if len(found) >= n:
            break
    return found


def _sum(pids: set[int] | list[int]) -> tuple[float, float]:
    rss = uss = 0.0
    for pid in pids:
        r, u = memory_mib(pid)
        rss += r
        uss += u if u is not None else float("nan")
    return rss, uss


def run(ctx: Context) -> Section:
    w = 1 if ctx.quick else ctx.workers
    me_rss, me_uss = memory_mib_self()
    table = Table(
        f"{w} workers with torch and triton imported (MiB; USS = memory no other process shares)",
        [
            "pool",
            "workers",
            "RSS / worker",
            "USS / worker",
            "Σ USS workers",
            "USS / worker after compiles",
            "Σ USS workers after compiles",
        ],
    )
    skipped = []
    plot_labels: list[str] = []
    plot_values: list[float] = []
    for name in POOLS:
        why = _pools.missing(name)
        if why:
            skipped.append(f"{name}: skipped, {why}")
            continue
        if name == "precompile":
            pe.stop_idle_workers()  # fresh workers, not ones that compiled in earlier scenarios
        ctx.log(f"s5: {name}")
        pool = _pools.start(name, w, import_torch_triton)
        try:
            workers = _workers(pool, w)
            time.sleep(0.5)  # let start-up garbage settle
            rss, uss = _sum(workers)
            cache = ctx.fresh_dir("mem")
            futures = [
                pool.submit(compile_config, cfg, cache)
                for cfg in QUICK_CONFIGS[: w if ctx.quick else 2 * w]
            ]
            for f in futures:
                f.result(timeout=600)
            alive = {p for p in workers if p in descendants()}
            rss2, uss2 = _sum(alive)
        finally:
            pool.close()
        n = len(workers)
        table.add(
            pool.name,
            n,
            f"{rss / n:.0f}",
            f"{uss / n:.0f}",
            f"{uss:.0f}",
            f"{uss2 / max(1, len(alive)):.0f}",
            f"{uss2:.0f}",
        )
        plot_labels.append(pool.name)
        plot_values.append(uss2)
    helpers = descendants()
    h_rss, h_uss = _sum(set(helpers))
    table.add(
        f"(shared helpers: {len(helpers)} processes)",
        len(helpers),
        "—",
        "—",
        f"{h_uss:.0f}",
        "—",
        "—",
    )
    table.add(
        "(the benchmark process itself)", "—", f"{me_rss:.0f}", f"{me_uss:.0f}", "—", "—", "—"
    )
    section = Section(
        "s5",
        "5. Memory",
        __doc__.split("\n\n", 1)[1].replace("\n", " ").strip()
        + " The seed's modes are not in the table: fork mode holds one short-lived forked child "
        "per running config (its USS is what the compile writes), spawn mode one fresh "
        "interpreter per running config (about one spawned worker's USS each, paid again for "
        "every config).",
        tables=[table],
        notes=skipped,
    )
    section.plot = {
        "title": f"5. Memory of {w} workers after compiles (Σ USS, MiB)",
        "labels": plot_labels,
        "values": plot_values,
        "xlabel": "MiB (unique set size)",
        "fmt": "{:.0f}",
        "colors": ["tab:orange" if n.startswith("Precompile") else "tab:blue" for n in plot_labels],
    }
    return section


def memory_mib_self() -> tuple[float, float]:
    """(RSS, USS) of this process in MiB."""
    rss, uss = memory_mib(os.getpid())
    return rss, uss if uss is not None else float("nan")
