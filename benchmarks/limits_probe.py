"""Memory limits on a real compile stack: what a warm torch+Triton worker is charged, what a
sample costs, no false kills, and how fast an overrun is killed (docs/design.md, "Memory limits").

Run from the repository root: ``python -m benchmarks.limits_probe [--workers 16]``. It starts
``workers`` workers whose initializer imports torch and triton (forked from one warm template),
then reports, in one run:

1. per worker: RSS, the pages it shares (``smaps_rollup``), and the charge the limit counts
   (``RSS − shared``) — the template's pages must not be charged to each worker;
2. the cost of one sampling round over every worker's group (``statm`` + the children lists), and
   of one ``smaps_rollup`` read (the exact USS the charge approximates);
3. ``3 × workers`` tasks each writing 256 MiB under a 1 GiB limit: none may be killed;
4. one task writing 4 GiB under the same limit beside ``workers − 1`` innocent ones: it fails with
   ``TaskMemoryError``, the seconds from its crossing the limit to its future failing, and the
   innocent ones succeed;
5. the parent's CPU seconds for ``3 × workers`` 0.5 s sleeps with and without a limit (the
   watcher's cost);
6. ``max_tasks_per_child=1`` against none, side by side, per start mode: the median round trip
   of a task when every task needs a new worker (``--recycle-only`` runs just this part, with
   no torch, so it runs anywhere).

Machine, versions and date are printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from typing import Any

import precompile_executor as pe
from precompile_executor import _memory

from ._common import median, timed
from ._report import Table
from ._tasks import import_torch_triton

MIB = 1 << 20
GIB = 1 << 30
LIMIT = GIB


def write_then_hold(n_bytes: int, hold_s: float) -> tuple[int, float]:
    """Write ``n_bytes`` in 32 MiB steps (printing a wall-clock stamp after each), hold them;
    return the pid and the wall-clock time when the total passed :data:`LIMIT` (0: never)."""
    chunks = []
    crossed = 0.0
    done = 0
    while done < n_bytes:
        chunks.append(b"\x01" * (32 * MIB))
        done += 32 * MIB
        print(f"WROTE {time.time():.6f} {done}", flush=True)
        if not crossed and done > LIMIT:
            crossed = time.time()
    time.sleep(hold_s)
    return os.getpid(), crossed


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def recycling(rounds: int = 15) -> None:
    """Median round trip of ``os.getpid`` on one worker: recycled after every task or not."""
    rows = []
    for start in ("template", "interpreter"):
        for limit in (None, 1):
            with pe.PrecompileExecutor(1, start=start, max_tasks_per_child=limit) as ex:
                ex.warm_up(timeout=600)
                ex.submit(os.getpid).result(timeout=600)
                runs = [
                    timed(lambda ex=ex: ex.submit(os.getpid).result(timeout=600))
                    for _ in range(rounds)
                ]
            rows.append(
                {
                    "start": start,
                    "max_tasks_per_child": str(limit),
                    "median round trip ms": f"{median(t for t, _ in runs) * 1e3:.1f}",
                    "distinct pids": len({pid for _, pid in runs}),
                }
            )
    print("\n" + Table.of("recycling", rows).markdown(""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--recycle-only", action="store_true")
    args = parser.parse_args()
    n = args.workers
    import loky

    head = (
        f"# limits_probe, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{platform.node()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
        f"loky {loky.__version__}"
    )
    if args.recycle_only:
        print(head)
        recycling()
        return
    import torch
    import triton

    print(f"{head}, torch {torch.__version__}, triton {triton.__version__}, {n} workers")
    with pe.PrecompileExecutor(n, initializer=import_torch_triton, memory_limit=LIMIT) as ex:
        pids = ex.warm_up(timeout=600)
        print(f"start mode: {ex.statistics().start} {ex.statistics().start_note or ''}")
        rows = []
        for pid in pids:
            rss, shared = _memory.rss_bytes(pid) / MIB, _memory.shared_bytes(pid) / MIB
            row = {"worker": pid, "RSS MiB": rss, "shared MiB": shared, "charge MiB": rss - shared}
            rows.append({k: f"{v:.0f}" for k, v in row.items()})
        print("\n" + Table.of("workers", rows).markdown(""))

        rounds = 50
        t0 = time.perf_counter()
        for _ in range(rounds):
            for pid in pids:
                _memory.group_rss(pid)
        per_round = (time.perf_counter() - t0) / rounds
        t0 = time.perf_counter()
        for pid in pids:
            _memory.shared_bytes(pid)
        per_smaps = (time.perf_counter() - t0) / len(pids)
        print(
            f"\none sampling round over {n} groups: {per_round * 1e3:.2f} ms "
            f"(every {_memory.SAMPLE_INTERVAL_S * 1e3:.0f} ms); one smaps_rollup read: "
            f"{per_smaps * 1e3:.2f} ms"
        )

        futures = [ex.submit(write_then_hold, 256 * MIB, 0.2) for _ in range(3 * n)]
        killed = sum(isinstance(f.exception(timeout=600), pe.TaskMemoryError) for f in futures)
        print(f"\n{3 * n} tasks writing 256 MiB under a 1 GiB limit: {killed} killed (want 0)")

        innocent = [ex.submit(write_then_hold, 128 * MIB, 1.0) for _ in range(n - 1)]
        failed_at: list[float] = []
        bad = ex.submit(write_then_hold, 4 * GIB, 30.0)
        bad.add_done_callback(lambda _: failed_at.append(time.time()))
        error = bad.exception(timeout=600)
        ok = sum(f.exception(timeout=600) is None for f in innocent)
        if isinstance(error, pe.TaskMemoryError):
            stamps = [
                (float(t), int(b))
                for _, t, b in (
                    line.split()
                    for line in error.captured_output.splitlines()
                    if line.startswith("WROTE")
                )
            ]
            under = [t for t, b in stamps if b + 32 * MIB <= LIMIT]
            over = [t for t, b in stamps if b > LIMIT]
            since_under = failed_at[0] - max(under) if under else float("nan")
            since_over = failed_at[0] - min(over) if over else float("nan")
            print(
                f"4 GiB under 1 GiB: TaskMemoryError, peak {error.peak_bytes / MIB:.0f} MiB; "
                f"the future failed {since_under:.3f} s after the last step surely under the "
                f"limit and {since_over:.3f} s after the first step over it (the crossing lies "
                f"between; want <= 0.5); innocent tasks ok: {ok}/{n - 1}"
            )
        else:
            print(f"4 GiB under 1 GiB: NOT killed: {error!r}; innocent ok: {ok}/{n - 1}")

    for limit in (None, LIMIT):
        with pe.PrecompileExecutor(n, initializer=import_torch_triton, memory_limit=limit) as ex:
            ex.warm_up(timeout=600)
            cpu = _cpu_s()
            wall = time.perf_counter()
            futures: list[Any] = [ex.submit(time.sleep, 0.5) for _ in range(3 * n)]
            for f in futures:
                f.result(timeout=600)
            print(
                f"{3 * n} sleeps of 0.5 s, memory_limit={limit}: parent CPU "
                f"{_cpu_s() - cpu:.2f} s over {time.perf_counter() - wall:.2f} s wall"
            )
    recycling()


if __name__ == "__main__":
    main()
