"""Scenario 3: the batch with faults — 10% of tasks hang past the timeout, 10% crash.

The faulty batch is the scenario-2 configs plus ``k = max(1, round(0.1 × N))`` tasks that hang
in C with the GIL held (``ctypes.PyDLL`` ``sleep``) and ``k`` that crash (``os.abort`` and
SIGKILL of themselves, alternating), spread through the submission order. Every compile task
appends a line to a log when it starts, so a re-run shows up.

PrecompileExecutor, Helion's fork mode and pebble (which have per-task timeouts) run the whole
faulty batch; loky's reusable executor and the stdlib ProcessPoolExecutor have no per-task
timeout, so they run the batch with the crashes only (a hang would never end). Budget =
fault-free wall + hung tasks × timeout / workers; the target allows 10% over it. 'Innocent
failed' counts compile tasks that did not return a result; 'innocent re-run' counts compile
tasks that started more than once.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from . import _batch, _helion_modes, _pools
from ._common import Context, descendants, median, spread
from ._kernels import Config, compile_config, configs, warm_compile
from ._report import Section, Table, Target, bars, intro
from ._tasks import crash, hang, import_torch_triton

Task = tuple[Callable[..., Any], tuple[Any, ...], bool]
"""``(fn, args, innocent)``."""


@dataclasses.dataclass
class FaultRun:
    """One faulty batch: wall time, what happened to the innocent tasks, errors by type."""

    wall_s: float
    innocent_failed: int
    innocent_rerun: int
    errors: collections.Counter[str]


def faulty_batch(cfgs: list[Config], cache: str, log: str, hangs: int, crashes: int) -> list[Task]:
    """The configs with ``hangs`` hanging and ``crashes`` crashing tasks spread among them."""
    tasks: list[Task] = [(compile_config, (cfg, cache, log), True) for cfg in cfgs]
    faults: list[Task] = [(hang, ("c",), False) for _ in range(hangs)]
    faults += [(crash, ("abort" if i % 2 == 0 else "sigkill",), False) for i in range(crashes)]
    for j, fault in enumerate(faults):
        tasks.insert(round((j + 1) * len(tasks) / (len(faults) + 1)), fault)
    return tasks


def _reruns(log: str) -> int:
    try:
        with open(log) as f:
            counts = collections.Counter(line.split()[0] for line in f if line.strip())
    except FileNotFoundError:
        return 0
    return sum(n - 1 for n in counts.values())


def _submit_all(submit: Callable[..., Future[Any]], tasks: list[Task], log: str) -> FaultRun:
    """Submit every task (a refused submit counts as its failure) and judge the outcome."""
    start = time.perf_counter()
    futures = []
    for fn, args, innocent in tasks:
        try:
            futures.append((submit(fn, *args), innocent))
        except Exception as exc:  # noqa: BLE001 - a broken pool refuses new work
            refused: Future[Any] = Future()
            refused.set_exception(exc)
            futures.append((refused, innocent))
    errors: collections.Counter[str] = collections.Counter()
    failed = 0
    for future, innocent in futures:
        try:
            future.result(timeout=_batch.RESULT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - counting what failed, and how
            errors[type(exc).__name__] += 1
            failed += innocent
    return FaultRun(time.perf_counter() - start, failed, _reruns(log), errors)


def _fork_run(tasks: list[Task], w: int, timeout: float, log: str) -> FaultRun:
    start = time.perf_counter()
    outcomes = _helion_modes.run_forked([(fn, args) for fn, args, _ in tasks], w, timeout=timeout)
    errors = collections.Counter(
        "timeout" if o.timed_out else (o.error.split(":")[0] or "crash")
        for o in outcomes
        if not o.ok
    )
    failed = sum(innocent and not o.ok for o, (_, _, innocent) in zip(outcomes, tasks, strict=True))
    return FaultRun(time.perf_counter() - start, failed, _reruns(log), errors)


def _row(
    name: str, batch: str, faulty: list[FaultRun], clean: list[float], note: str = "one run"
) -> dict[str, Any]:
    return {"name": name, "batch": batch, "faulty": faulty, "clean": clean, "note": note}


def _wait_for_spares(processes: int, start_s: float) -> None:
    """Wait until this process has ``processes`` loky worker children, then one worker start:
    a spare that exists but still imports torch would not help the batch."""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        cmds = []
        for p in descendants().values():
            try:
                cmds.append(" ".join(p.cmdline()))
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        if sum("loky" in c and "resource_tracker" not in c for c in cmds) >= processes:
            break
        time.sleep(0.1)
    time.sleep(start_s)


def _ours(
    ctx: Context, cfgs: list[Config], k: int, timeout: float, spares: int, start_s: float
) -> dict[str, Any]:
    """Fault-free and faulty batches, ``repeats`` times each, on one warm PrecompileExecutor."""
    name = "PrecompileExecutor (warm)" + (f", spare_workers={spares}" if spares else "")
    faulty, clean = [], []
    with _batch.new_executor(ctx.workers, spare_workers=spares) as ex:
        view = ex.options(timeout=timeout)
        for _ in range(ctx.repeats):
            for with_faults in (False, True):
                _batch.warm_workers(ex)
                if spares:
                    _wait_for_spares(ctx.workers + spares, start_s)
                ctx.log(f"s3: {name}, {'with faults' if with_faults else 'fault-free'}")
                if with_faults:
                    log = ctx.fresh_dir("log") + "/starts.log"
                    faulty.append(
                        _submit_all(
                            view.submit, faulty_batch(cfgs, ctx.fresh_dir("faulty"), log, k, k), log
                        )
                    )
                else:
                    clean.append(_batch.on_executor(view, cfgs, ctx.fresh_dir("ff")).wall_s)
        stats = ex.statistics()
    note = (
        f"{stats.timed_out} timed out, {stats.crashed} crashed, {stats.worker_restarts} worker "
        "restarts in all runs"
    )
    return _row(name, "hangs + crashes", faulty, clean, note) | {"restarts": stats.worker_restarts}


def measure(
    ctx: Context, cfgs: list[Config], k: int, timeout: float
) -> tuple[list[Any], list[str], float]:
    w = ctx.workers
    start_s = _batch.worker_start_s()  # before any fork-started pool below has run
    rows = [_ours(ctx, cfgs, k, timeout, spares, start_s) for spares in (0, k)]
    # PrecompileExecutor runs before every pool that forks multiprocessing workers (pebble, the
    # stdlib pool): when such a worker exits it runs the parent's threading-atexit hooks,
    # including the library's hub shutdown, which breaks the hub in this process.
    ctx.log("s3: Helion's fork mode, fault-free and with faults")
    fork_ff = _batch.helion_fork(cfgs, ctx.fresh_dir("fork-ff"), w).wall_s
    log = ctx.fresh_dir("log") + "/starts.log"
    forked = _fork_run(faulty_batch(cfgs, ctx.fresh_dir("fork"), log, k, k), w, timeout, log)
    rows.append(_row("Helion's fork mode (warm parent)", "hangs + crashes", [forked], [fork_ff]))
    skipped: list[str] = []
    for pool in _pools.each(("pebble", "loky", "ppe-fork"), w, ctx, skipped, import_torch_triton):
        with pool:
            list(pool.map(warm_compile, [0.2] * (2 * w)))
            clean = []
            if pool.name.startswith("pebble"):  # the one with a per-task timeout
                pool.timeout = timeout
                start, cache = time.perf_counter(), ctx.fresh_dir("ff")
                clean = [
                    _batch.collect(
                        [pool.submit(compile_config, c, cache) for c in cfgs], start
                    ).wall_s
                ]
            log = ctx.fresh_dir("log") + "/starts.log"
            tasks = faulty_batch(cfgs, ctx.fresh_dir("faulty"), log, k if clean else 0, k)
            run_ = _submit_all(pool.submit, tasks, log)
        batch = "hangs + crashes" if clean else "crashes only (no per-task timeout)"
        rows.append(_row(pool.name, batch, [run_], clean))
    return rows, skipped, start_s


def run(ctx: Context) -> Section:
    w = ctx.workers
    cfgs = configs(ctx.n_configs, ctx.quick)
    times = _batch.warm_times(ctx, cfgs)
    warm_compile()  # Helion's fork mode and pebble fork from this process: make it warm
    k = max(1, round(0.1 * len(cfgs)))
    timeout = max(2.0 if ctx.quick else 5.0, 3 * max(times.values()))
    ctx.log(f"s3: {len(cfgs)} configs + {k} hanging + {k} crashing tasks, timeout {timeout:.1f}s")
    rows, skipped, start_s = measure(ctx, cfgs, k, timeout)
    for r in rows:
        r["wall"], r["ff"] = median(f.wall_s for f in r["faulty"]), median(r["clean"])
        r["budget"] = r["ff"] + k * timeout / w

    def errors(runs: list[FaultRun]) -> str:
        total = sum((r.errors for r in runs), collections.Counter[str]())
        return ", ".join(f"{name} ×{n / len(runs):g}" for name, n in total.most_common()) or "—"

    table = Table.of(
        f"{len(cfgs)} configs + {k} hanging + {k} crashing tasks on {w} workers, per-task "
        f"timeout {timeout:.1f}s (wall seconds; median (min–max) of the runs)",
        [
            {
                "pool": r["name"],
                "batch": r["batch"],
                "wall (s)": spread(f.wall_s for f in r["faulty"]),
                "fault-free wall (s)": spread(r["clean"]),
                "budget (s)": r["budget"],
                "innocent failed": max(f.innocent_failed for f in r["faulty"]),
                "innocent re-run": max(f.innocent_rerun for f in r["faulty"]),
                "how the faulty tasks failed": errors(r["faulty"]),
                "note": r["note"],
            }
            for r in rows
        ],
    )
    ours, spares = rows[0], rows[1]
    per_run = ours["restarts"] / max(1, len(ours["faulty"]))
    why = (
        f"every hang and crash costs a worker restart ({per_run:g} per run): a fresh worker that "
        f"imports torch and triton ({start_s:.2f}s here) and then pays its first compile, while "
        f"the pool is a worker short (about {per_run * start_s / w:.2f}s of lost capacity per "
        "run); the fork-based pools restart in milliseconds from a parent that imported them"
    )
    lost = max(f.innocent_failed + f.innocent_rerun for r in rows[:2] for f in r["faulty"])
    targets = [
        Target(
            "faulty batch / (fault-free + hung × timeout / workers)",
            ours["wall"] / ours["budget"],
            "<=",
            1.10,
            why=why,
        ),
        Target(
            f"the same with spare_workers={k}",
            spares["wall"] / spares["budget"],
            "<=",
            1.10,
            why="even a warm spare must pay its first compile, and the spare that replaces "
            "it starts during the batch, on the same cores",
        ),
        Target(
            "innocent tasks lost by PrecompileExecutor",
            float(lost),
            "<=",
            0,
            unit="",
            why="an innocent task failed or ran twice: a bug in crash isolation",
        ),
    ]
    notes = skipped + [
        f"{r['name']} lost {r['faulty'][0].innocent_failed} of {len(cfgs)} innocent tasks to "
        f"{k} crash(es)"
        for r in rows
        if r["batch"].startswith("crashes only")
    ]
    notes.append(
        f"Starting one fresh PrecompileExecutor worker (what a restart costs): {start_s:.2f}s."
    )
    section = Section(
        "s3",
        "3. Faults: hangs past the timeout and crashes",
        intro(__doc__),
        [table],
        targets,
        notes,
    )
    plotted = [r for r in rows if r["batch"] == "hangs + crashes"]
    section.plot = bars(
        f"3. {len(cfgs)} configs + {k} hangs + {k} crashes, timeout {timeout:.1f}s (s)",
        [r["name"] for r in plotted],
        {
            "fault-free": ([r["ff"] for r in plotted], "tab:green"),
            "budget: fault-free + hung × timeout / workers": (
                [r["budget"] for r in plotted],
                "tab:gray",
            ),
            "with faults": ([r["wall"] for r in plotted], "tab:red"),
        },
    )
    return section
