"""Scenario 8: starting workers — forked from a warm template vs a fresh interpreter each.

For each start mode (``start="interpreter"``: every worker a fresh interpreter that imports torch
and triton itself; ``start="template"``: one interpreter per worker kind imports them once and
forks every worker from that warm state), measured in the same run: ``warm_up()`` of one worker
and of all the workers (fresh pools: no pooled worker, no template left from before); how long
a lost worker takes to be replaced — from the moment a task SIGKILLs its own worker, or a task
is killed at its timeout, to the moment the next task starts on the replacement; the memory a
worker holds alone (USS); and the fault batch of scenario 3 (configs + hanging + crashing tasks)
against its budget.
"""

from __future__ import annotations

import time
from typing import Any

import precompile_executor as pe

from . import _batch, _tasks
from ._common import Context, median, memory_mib
from ._kernels import configs, warm_compile
from ._report import Section, Table, Target, intro
from ._tasks import import_torch_triton
from .s3_faults import _submit_all, faulty_batch

MODES = ("interpreter", "template")


def _import_and_compile(label: str) -> None:
    """Initializer: import torch and triton and compile one unrelated kernel (a warm compiler)."""
    import_torch_triton(label)
    warm_compile()


def _fresh(
    mode: str, workers: int, label: str, initializer: Any = import_torch_triton
) -> pe.PrecompileExecutor:
    pe.stop_idle_workers()  # no pooled worker and no template from an earlier measurement
    return pe.PrecompileExecutor(
        workers,
        initializer=initializer,
        initargs=(f"{label}-{mode}-{time.monotonic()}",),  # a worker kind of its own
        start=mode,  # type: ignore[arg-type]
    )


def _warm_up_s(mode: str, workers: int) -> tuple[float, list[int], pe.PrecompileExecutor]:
    ex = _fresh(mode, workers, "warm")
    t0 = time.monotonic()
    pids = ex.warm_up(timeout=600)
    return time.monotonic() - t0, pids, ex


def _replacement_s(ex: pe.PrecompileExecutor, how: str, timeout: float) -> float:
    """From a worker's death (crash) or a timeout kill to the next task's start."""
    view = ex.options(timeout=timeout)
    submitted = time.monotonic()
    # The tasks come from _tasks, which the initializer's unpickling imported already (in the
    # template, so in every worker forked from it): a task from this module would make each new
    # worker import it, and all it imports, before the task starts (~90 ms on 2 cores).
    failed = view.submit(_tasks.crash, "sigkill") if how == "crash" else view.submit(_tasks.hang)
    nxt = view.submit(_tasks.now)
    failed.exception(timeout=600)
    start: float = nxt.result(timeout=600)
    # The crashing task dies as soon as it starts (an idle worker takes it at once): count from
    # its submit. The hanging one is killed at its deadline: count from submit + timeout.
    return start - (submitted if how == "crash" else submitted + timeout)


def _measure_mode(ctx: Context, mode: str, w: int) -> dict[str, Any]:
    ones, alls, crashes, kills, uss = [], [], [], [], []
    for _ in range(ctx.repeats):
        one, _, ex1 = _warm_up_s(mode, 1)
        ex1.shutdown()
        ones.append(one)
        many, pids, ex = _warm_up_s(mode, w)
        alls.append(many)
        with ex:
            uss += [u for u in (memory_mib(p)[1] for p in pids) if u is not None]
            # One worker, so the replacement is the only place the next task can go.
            kind = (f"solo-{mode}-{time.monotonic()}",)  # a worker kind of its own
            solo = pe.PrecompileExecutor(
                1,
                initializer=import_torch_triton,
                initargs=kind,
                start=mode,  # type: ignore[arg-type]
            )
            with solo:
                solo.warm_up(timeout=600)
                crashes.append(_replacement_s(solo, "crash", 600))
                kills.append(_replacement_s(solo, "kill", 0.5))
    one, all_, faults = median(ones), median(alls), _fault_batch(ctx, mode, w)
    return {
        "start": mode,
        "warm_up() of 1 worker": one,
        f"warm_up() of {w} workers": all_,
        f"{w} / 1": f"{all_ / one:.2f}×",
        "crash → next task starts": f"{median(crashes):.3f}",
        "timeout kill → next task starts": f"{median(kills):.3f}",
        "USS / worker": f"{median(uss):.0f}",
        "fault batch / budget": f"{faults:.2f}×",
        "values": (median(crashes), median(kills), all_ / one, faults),
    }


def run(ctx: Context) -> Section:
    w = 1 if ctx.quick else ctx.workers
    rows = []
    for mode in MODES:
        ctx.log(f"s8: start={mode}")
        rows.append(_measure_mode(ctx, mode, w))
    pe.stop_idle_workers()
    crash, kill, scale, faults = rows[-1].pop("values")
    rows[0].pop("values")
    table = Table.of(
        f"worker starts with torch and triton imported ({w} workers; seconds, median of "
        f"{ctx.repeats}; USS in MiB)",
        rows,
    )
    targets = [
        Target("replacement after a crash, template start", crash, "<=", 0.1, unit=" s"),
        Target("replacement after a timeout kill, template start", kill, "<=", 0.1, unit=" s"),
        Target(f"warm_up() of {w} workers / of 1, template start", scale, "<=", 1.3),
        Target("fault batch (1 hang + 1 crash) / budget, template start", faults, "<=", 1.05),
    ]
    notes = [
        "The crash column counts from the submit of the crashing task (it dies as soon as it "
        "starts) to the start of the next task on the replacement; the kill column from the "
        "hanging task's deadline (submit + 0.5 s timeout). The tasks are functions of "
        "benchmarks/_tasks.py, which the template imported with the initializer: a task whose "
        "module a new worker has not imported yet pays that import before it starts, in every "
        "replacement (about 63 ms for this benchmark's own modules, docs/benchmarks.md).",
        f"Fault batch: the scenario-3 batch (configs + 1 task hung in C + 1 crashing task) on {w} "
        "workers whose initializer imports torch and triton and compiles one unrelated kernel "
        "(for 'template': once, in the template; for 'interpreter': in each new worker); budget "
        "= its fault-free wall + timeout / workers.",
    ]
    title = "8. Worker starts: warm template vs fresh interpreter"
    return Section("s8", title, intro(__doc__), [table], targets, notes)


def _fault_batch(ctx: Context, mode: str, w: int) -> float:
    cfgs = configs(ctx.n_configs, ctx.quick)
    warm_compile()
    times = _batch.warm_times(ctx, cfgs)
    timeout = max(2.0 if ctx.quick else 5.0, 3 * max(times.values()))
    with _fresh(mode, w, "faults", _import_and_compile) as ex:
        view = ex.options(timeout=timeout)
        _batch.warm_workers(ex)
        clean = _batch.on_executor(view, cfgs, ctx.fresh_dir("ff")).wall_s
        _batch.warm_workers(ex)
        log = ctx.fresh_dir("log") + "/starts.log"
        run = _submit_all(view.submit, faulty_batch(cfgs, ctx.fresh_dir("f"), log, 1, 1), log)
    return float(run.wall_s / (clean + timeout / w))
