"""Scenario 5: memory of the workers, each with torch and triton imported (an initializer).

For each pool: start it with ``workers`` workers whose initializer imports torch and triton, run
a few tasks until every worker has answered, then read RSS and USS (memory only that process
holds; a forked worker shares its parent's pages until it writes them) of every worker and of
the helper processes that outlive the pools (loky's and multiprocessing's resource trackers, the
library's guardian), which whichever pool starts first brings up for all. Then each
pool compiles a few small configs and is measured again: the compiler's memory stays in a warm
worker. Helion's two modes are not in the table: fork mode holds one short-lived forked child per
running config (its USS is what the compile writes), spawn mode one fresh interpreter per running
config (about one spawned worker's USS each, paid again for every config).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from typing import Any

import precompile_executor as pe

from . import _pools
from ._common import Context, descendants, memory_mib
from ._kernels import QUICK_CONFIGS, compile_config
from ._report import Section, Table, bars, intro
from ._tasks import getpid, import_torch_triton

POOLS = ("precompile", "ppe-spawn", "ppe-fork", "loky", "pebble")
"""PrecompileExecutor first: a fork-started multiprocessing worker that exits runs the parent's
threading-atexit hooks, the library's hub shutdown among them."""


def _workers(pool: _pools.Pool, n: int) -> set[int]:
    found: set[int] = set()
    for _ in range(20):
        found |= {f.result(timeout=300) for f in [pool.submit(getpid, 0.2) for _ in range(2 * n)]}
        if len(found) >= n:
            break
    return found


def _sum(pids: Iterable[int]) -> tuple[float, float]:
    pairs = [memory_mib(pid) for pid in pids]
    return sum(r for r, _ in pairs), sum(math.nan if u is None else u for _, u in pairs)


def measure(ctx: Context, w: int) -> tuple[list[dict[str, Any]], list[str]]:
    rows, skipped = [], []
    pe.stop_idle_workers()  # fresh workers, not ones that compiled in earlier scenarios
    for pool in _pools.each(POOLS, w, ctx, skipped, import_torch_triton):
        with pool:
            workers = _workers(pool, w)
            time.sleep(0.5)  # let start-up garbage settle
            rss, uss = _sum(workers)
            cache = ctx.fresh_dir("mem")
            for cfg in QUICK_CONFIGS[: w if ctx.quick else 2 * w]:
                pool.submit(compile_config, cfg, cache).result(timeout=600)
            alive = {p for p in workers if p in descendants()}
            _, uss2 = _sum(alive)
        n = len(workers)
        rows.append(
            {
                "pool": pool.name,
                "workers": n,
                "RSS / worker": f"{rss / n:.0f}",
                "USS / worker": f"{uss / n:.0f}",
                "Σ USS workers": f"{uss:.0f}",
                "USS / worker after compiles": f"{uss2 / max(1, len(alive)):.0f}",
                "Σ USS workers after compiles": f"{uss2:.0f}",
            }
        )
    helpers = descendants()
    me_rss, me_uss = memory_mib(os.getpid())
    rows.append(dict.fromkeys(rows[0], "—") | {"pool": f"(shared helpers: {len(helpers)})"})
    rows[-1] |= {"workers": len(helpers), "Σ USS workers": f"{_sum(helpers)[1]:.0f}"}
    rows.append(dict.fromkeys(rows[0], "—") | {"pool": "(the benchmark process itself)"})
    rows[-1] |= {"RSS / worker": f"{me_rss:.0f}", "USS / worker": f"{me_uss or math.nan:.0f}"}
    return rows, skipped


def run(ctx: Context) -> Section:
    w = 1 if ctx.quick else ctx.workers
    rows, skipped = measure(ctx, w)
    title = (
        f"{w} workers with torch and triton imported (MiB; USS = memory no other process shares)"
    )
    section = Section("s5", "5. Memory", intro(__doc__), [Table.of(title, rows)], notes=skipped)
    pools = rows[:-2]
    section.plot = bars(
        f"5. Memory of {w} workers after compiles (Σ USS, MiB)",
        [r["pool"] for r in pools],
        {"": ([float(r["Σ USS workers after compiles"]) for r in pools], "")},
        "MiB (unique set size)",
        fmt="{:.0f}",
    )
    return section
