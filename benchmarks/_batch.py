"""Running one compile batch under each strategy, and what a batch should ideally take."""

from __future__ import annotations

import dataclasses
import heapq
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from typing import Any

import precompile_executor as pe

from . import _helion_modes
from ._kernels import Config, compile_config, warm_compile
from ._tasks import import_torch_triton

RESULT_TIMEOUT_S = 900.0
"""No wait in the benchmark is unbounded: a batch that takes longer than this is broken."""


@dataclasses.dataclass
class BatchRun:
    """One timed batch: wall seconds, each task's own compile seconds, and its failures."""

    wall_s: float
    task_s: list[float]
    errors: list[str] = dataclasses.field(default_factory=list)


def new_executor(workers: int, **kwargs: Any) -> pe.PrecompileExecutor:
    """A PrecompileExecutor whose workers import torch and triton, as an autotuner's would."""
    return pe.PrecompileExecutor(workers, initializer=import_torch_triton, **kwargs)


def worker_start_s() -> float:
    """Seconds to start one fresh worker that imports torch and triton (its own initializer
    arguments, so no pooled worker serves): what a restart after a crash or kill costs."""
    ex = pe.PrecompileExecutor(1, initializer=import_torch_triton, initargs=("probe",))
    try:
        start = time.perf_counter()
        ex.warm_up(timeout=RESULT_TIMEOUT_S)
        return time.perf_counter() - start
    finally:
        ex.terminate_workers()


def warm_workers(ex: pe.PrecompileExecutor) -> list[int]:
    """Start every worker and have each compile an unrelated kernel once; return their pids."""
    pids = set(ex.warm_up(timeout=RESULT_TIMEOUT_S))
    warmed: set[int] = set()
    for _ in range(5):
        # All workers are idle, so these start at once, one per worker; the short sleep keeps
        # a fast one from taking a second task.
        futures = [ex.submit(warm_compile, 0.3) for _ in range(ex.max_workers)]
        warmed |= {f.result(timeout=RESULT_TIMEOUT_S) for f in futures}
        if pids <= warmed:
            break
    return sorted(pids)


def collect(futures: Sequence[Future[Any]], start: float) -> BatchRun:
    """Wait for a batch's ``compile_config`` futures; time it from ``start``."""
    task_s, errors = [], []
    for future in futures:
        try:
            task_s.append(future.result(timeout=RESULT_TIMEOUT_S)["elapsed_s"])
        except Exception as exc:  # noqa: BLE001 - a failed config is counted, not fatal
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
    return BatchRun(time.perf_counter() - start, task_s, errors)


def on_executor(
    ex: Executor, configs: Sequence[Config], cache: str, priorities: Sequence[float] | None = None
) -> BatchRun:
    """Submit every config to ``ex`` (a PrecompileExecutor: with ``priorities``) and wait."""
    start = time.perf_counter()
    views = [ex.options(priority=p) for p in priorities] if priorities else [ex] * len(configs)  # type: ignore[attr-defined]
    return collect(
        [v.submit(compile_config, c, cache) for v, c in zip(views, configs, strict=True)], start
    )


def helion_fork(configs: Sequence[Config], cache: str, jobs: int, spawn: bool = False) -> BatchRun:
    """Helion's fork mode from this process (``spawn``: its spawn mode)."""
    start = time.perf_counter()
    outcomes = (_helion_modes.run_spawned if spawn else _helion_modes.run_forked)(
        [(compile_config, (c, cache)) for c in configs], jobs
    )
    wall = time.perf_counter() - start
    return BatchRun(
        wall,
        [o.value["elapsed_s"] for o in outcomes if o.ok],
        [o.error for o in outcomes if not o.ok],
    )


def helion_fork_cold_parent(configs: Sequence[Config], cache: str, jobs: int) -> BatchRun:
    """Helion's fork mode from a fresh parent that imported torch and triton and never
    compiled (``python -m benchmarks._helion_modes``); only the batch is timed, in that parent."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._helion_modes", str(jobs), cache, json.dumps(configs)],
        capture_output=True,
        text=True,
        timeout=RESULT_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        return BatchRun(float("nan"), [], [f"cold parent failed: {proc.stderr[-500:]}"])
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return BatchRun(
        data["wall_s"],
        data["task_s"],
        [f"{data['failed']} config(s) failed"] if data["failed"] else [],
    )


def sequential(configs: Sequence[Config], cache: str) -> BatchRun:
    """Compile every config in this process, one after another."""
    start = time.perf_counter()
    times = [compile_config(cfg, cache)["elapsed_s"] for cfg in configs]
    return BatchRun(time.perf_counter() - start, times)


def warm_times(ctx: Any, cfgs: Sequence[Config]) -> dict[Config, float]:
    """Each config's warm compile time in this process (from scenario 2 if it ran)."""
    known: dict[Config, float] = ctx.shared.get("warm_times", {})
    if not all(c in known for c in cfgs):
        warm_compile()
        known = {
            **known,
            **dict(zip(cfgs, sequential(cfgs, ctx.fresh_dir("seq")).task_s, strict=True)),
        }
        ctx.shared["warm_times"] = known
    return {c: known[c] for c in cfgs}


def ideal(task_s: Sequence[float], workers: int) -> float:
    """The best a pool of ``workers`` can do: max(sum / workers, longest task)."""
    return max(sum(task_s) / workers, max(task_s))


def simulate(
    task_s: Sequence[float], workers: int, priorities: Sequence[float] | None = None
) -> float:
    """Makespan of a batch submitted in this order to ``workers`` idle workers: the first
    ``workers`` tasks start at once; later ones queue, highest priority first (else FIFO)."""
    prio = list(priorities) if priorities is not None else [0.0] * len(task_s)
    n = min(workers, len(task_s))
    free, end = [0.0] * n, 0.0
    for i in list(range(n)) + sorted(range(n, len(task_s)), key=lambda i: (-prio[i], i)):
        done = heapq.heappop(free) + task_s[i]
        end = max(end, done)
        heapq.heappush(free, done)
    return end


def lpt(task_s: Sequence[float], workers: int) -> float:
    """Makespan when the longest tasks are started first (a near-optimal schedule)."""
    return simulate(sorted(task_s, reverse=True), workers)
