"""Scenario 3: the batch with faults — 10% of tasks hang past the timeout, 10% crash.

The faulty batch is the scenario-2 configs plus ``k = max(1, round(0.1 × N))`` tasks that hang
in C with the GIL held (``ctypes.PyDLL`` ``sleep``) and ``k`` that crash (``os.abort`` and
SIGKILL of themselves, alternating), spread through the submission order. Every compile task
appends a line to a log when it starts, so a re-run shows up.

PrecompileExecutor, the seed's fork mode and pebble (which have per-task timeouts) run the whole
faulty batch; loky's reusable executor and the stdlib ProcessPoolExecutor have no per-task
timeout, so they run the batch with the crashes only (a hang would never end).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import precompile_executor as pe

from . import _batch, _pools, _seed
from ._common import Context, descendants, median, spread
from ._kernels import Config, compile_config, configs, warm_compile
from ._report import Section, Table, Target
from ._tasks import crash, hang, import_torch_triton

Task = tuple[Callable[..., Any], tuple[Any, ...], bool]
"""``(fn, args, innocent)``."""


@dataclasses.dataclass
class FaultRun:
    """One faulty batch: wall time and what happened to the innocent tasks."""

    wall_s: float
    innocent_failed: int
    innocent_rerun: int
    errors: collections.Counter[str]


def faulty_batch(cfgs: list[Config], cache: str, log: str, hangs: int, crashes: int) -> list[Task]:
    """The configs with ``hangs`` hanging and ``crashes`` crashing tasks spread among them."""
    tasks: list[Task] = [(compile_config, (cfg, cache, log), True) for cfg in cfgs]
    faults: list[Task] = [(hang, ("c",), False) for _ in range(hangs)]
    faults += [(crash, ("abort" if i % 2 == 0 else "sigkill",), False) for i in range(crashes)]
    # Interleave: fault j goes at an even spacing through the batch.
    for j, fault in enumerate(faults):
        tasks.insert(round((j + 1) * len(tasks) / (len(faults) + 1)), fault)
    return tasks


def _reruns(log: str) -> int:
    try:
        with open(log) as f:
            counts = collections.Counter(line.split()[0] for line in f if line.strip())
    except FileNotFoundError:
        return 0
    return sum(n - 1 for n in counts.values() if n > 1)


def _judge(futures: list[tuple[Future[Any], bool]], start: float, log: str) -> FaultRun:
    failed = 0
    errors: collections.Counter[str] = collections.Counter()
    for future, innocent in futures:
        try:
            future.result(timeout=_batch.RESULT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - counting what failed, and how
            errors[type(exc).__name__] += 1
            failed += innocent
    return FaultRun(time.perf_counter() - start, failed, _reruns(log), errors)


def _submit_all(submit: Callable[..., Future[Any]], tasks: list[Task], log: str) -> FaultRun:
    start = time.perf_counter()
    futures = []
    for fn, args, innocent in tasks:
        try:
            futures.append((submit(fn, *args), innocent))
        except Exception as exc:  # noqa: BLE001 - a broken pool refuses new work
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            futures.append((failed, innocent))
    return _judge(futures, start, log)


def _seed_run(tasks: list[Task], w: int, timeout: float, log: str) -> FaultRun:
    start = time.perf_counter()
    outcomes = _seed.run_forked([(fn, args) for fn, args, _ in tasks], w, timeout=timeout)
    errors: collections.Counter[str] = collections.Counter(
        "timeout" if o.timed_out else (o.error.split(":")[0] or "crash")
        for o in outcomes
        if not o.ok
    )
    failed = sum(
        1 for o, (_, _, innocent) in zip(outcomes, tasks, strict=True) if innocent and not o.ok
    )
    return FaultRun(time.perf_counter() - start, failed, _reruns(log), errors)


def run(ctx: Context) -> Section:
    w = ctx.workers
    cfgs = configs(ctx.n_configs, ctx.quick)
    times = _batch.warm_times(ctx, cfgs)
    warm_compile()  # the seed's fork mode and pebble fork from this process: make it warm
    k = max(1, round(0.1 * len(cfgs)))
    timeout = max(2.0 if ctx.quick else 5.0, 3 * max(times.values()))
    ctx.log(f"s3: {len(cfgs)} configs + {k} hanging + {k} crashing tasks, timeout {timeout:.1f}s")

    table = Table(
        f"{len(cfgs)} configs + {k} hanging + {k} crashing tasks on {w} workers, per-task "
        f"timeout {timeout:.1f}s (wall seconds; median (min–max) of the runs)",
        [
            "pool",
            "batch",
            "wall (s)",
            "fault-free wall (s)",
            "budget (s)",
            "innocent failed",
            "innocent re-run",
            "how the faulty tasks failed",
            "note",
        ],
    )

    def budget_of(fault_free: float) -> float:
        return fault_free + k * timeout / w

    plotted: list[tuple[str, float, float]] = []  # (pool, fault-free, faulty)

    # -- PrecompileExecutor: full faulty batch vs fault-free, same warm pool ---------------------
    ours = _ours(ctx, cfgs, k, timeout, spares=0)
    # Measured now, before any fork-started pool below has run: see the note on ordering.
    start_s = _batch.worker_start_s()
    with_spares = None
    if "spare_workers" in inspect.signature(pe.PrecompileExecutor).parameters:
        with_spares = _ours(ctx, cfgs, k, timeout, spares=k, start_s=start_s)
    for mine in (ours, with_spares):
        if mine is None:
            continue
        table.add(
            mine.name,
            "hangs + crashes",
            spread(r.wall_s for r in mine.faulty),
            spread(mine.clean),
            f"{budget_of(mine.ff):.2f}",
            max(r.innocent_failed for r in mine.faulty),
            max(r.innocent_rerun for r in mine.faulty),
            _errors(mine.faulty),
            f"{mine.stats.timed_out} timed out, {mine.stats.crashed} crashed, "
            f"{mine.stats.worker_restarts} worker restarts in all runs",
        )
        plotted.append((mine.name, mine.ff, mine.wall))
    ours_wall, ours_ff = ours.wall, ours.ff
    restarts = ours.stats.worker_restarts
    faulty = ours.faulty

    # PrecompileExecutor runs before every pool that forks multiprocessing workers (pebble, the
    # stdlib pool): when such a worker exits it runs the parent's threading-atexit hooks,
    # including the library's hub shutdown, which breaks the hub in this process (reported).
    # -- the seed's fork mode, same faulty batch ---------------------------------------------------
    ctx.log("s3: seed fork mode, fault-free and with faults")
    seed_ff = _batch.seed_fork(cfgs, ctx.fresh_dir("seed-ff"), w).wall_s
    log = ctx.fresh_dir("log") + "/starts.log"
    seed = _seed_run(faulty_batch(cfgs, ctx.fresh_dir("seed"), log, k, k), w, timeout, log)
    table.add(
        "seed fork mode (warm parent)",
        "hangs + crashes",
        f"{seed.wall_s:.2f}",
        f"{seed_ff:.2f}",
        f"{budget_of(seed_ff):.2f}",
        seed.innocent_failed,
        seed.innocent_rerun,
        _errors([seed]),
        "one run",
    )
    plotted.append(("seed fork mode", seed_ff, seed.wall_s))

    skipped: list[str] = []
    # -- pebble: has a per-task timeout ---------------------------------------------------------
    why = _pools.missing("pebble")
    if why:
        skipped.append(f"pebble: skipped, {why}")
    else:
        ctx.log("s3: pebble, fault-free and with faults")
        pool = _pools.start("pebble", w, import_torch_triton)
        try:
            assert isinstance(pool, _pools._PebblePool)
            list(pool.map(_warm_task, range(2 * w)))
            pool.timeout = timeout
            start = time.perf_counter()
            cache = ctx.fresh_dir("pb-ff")
            ff_futures = [pool.submit(compile_config, c, cache) for c in cfgs]
            ff = _batch.collect(ff_futures, start).wall_s
            log = ctx.fresh_dir("log") + "/starts.log"
            run_ = _submit_all(pool.submit, faulty_batch(cfgs, ctx.fresh_dir("pb"), log, k, k), log)
        finally:
            pool.close()
        table.add(
            "pebble ProcessPool",
            "hangs + crashes",
            f"{run_.wall_s:.2f}",
            f"{ff:.2f}",
            f"{budget_of(ff):.2f}",
            run_.innocent_failed,
            run_.innocent_rerun,
            _errors([run_]),
            "one run",
        )
        plotted.append(("pebble", ff, run_.wall_s))

    # -- loky and the stdlib pool: crashes only -------------------------------------------------
    lost_elsewhere: dict[str, int] = {}
    for name in ("loky", "ppe-fork"):
        why = _pools.missing(name)
        if why:
            skipped.append(f"{name}: skipped, {why}")
            continue
        ctx.log(f"s3: {name}, crashes only")
        pool = _pools.start(name, w, import_torch_triton)
        try:
            list(pool.map(_warm_task, range(2 * w)))
            log = ctx.fresh_dir("log") + "/starts.log"
            run_ = _submit_all(pool.submit, faulty_batch(cfgs, ctx.fresh_dir(name), log, 0, k), log)
        finally:
            pool.close()
        lost_elsewhere[pool.name] = run_.innocent_failed
        table.add(
            pool.name,
            "crashes only (no per-task timeout)",
            f"{run_.wall_s:.2f}",
            "—",
            "—",
            run_.innocent_failed,
            run_.innocent_rerun,
            _errors([run_]),
            "one run",
        )

    ratio = ours_wall / budget_of(ours_ff)
    why_slow = ""
    if ratio > 1.10:
        per_run = restarts / max(1, len(faulty))
        why_slow = (
            f"the faulty batch took {ours_wall:.2f}s against fault-free {ours_ff:.2f}s + "
            f"{k}×{timeout:.1f}s/{w} for the hangs = {budget_of(ours_ff):.2f}s, "
            f"{ours_wall - budget_of(ours_ff):.2f}s over. Every hang and crash costs a worker "
            f"restart ({per_run:g} per run): a fresh interpreter that imports torch and triton, "
            f"measured at {start_s:.2f}s here, then pays its first compile; meanwhile the pool "
            f"is a worker short, about {per_run * start_s / w:.2f}s of lost capacity per run, "
            "more when both workers die close together and queued configs wait. The fork-based "
            "pools (pebble forks its workers, the seed forks per task) restart in milliseconds "
            "from a parent that already imported torch and triton"
        )
    section = Section(
        "s3",
        "3. Faults: hangs past the timeout and crashes",
        __doc__.split("\n\n", 1)[1].replace("\n", " ").strip()
        + " Budget = fault-free wall + hung tasks × timeout / workers; the target allows 10% "
        "over it. 'Innocent failed' counts compile tasks that did not return a result; "
        "'innocent re-run' counts compile tasks that started more than once.",
        tables=[table],
        targets=[
            Target(
                "faulty batch / (fault-free + hung × timeout / workers)",
                ratio,
                "<=",
                1.10,
                why=why_slow,
            ),
            *(
                [
                    Target(
                        f"the same with spare_workers={k}",
                        with_spares.wall / budget_of(with_spares.ff),
                        "<=",
                        1.10,
                        why="even a warm spare must pay its first compile, and it replaces a "
                        "lost worker only once it has started; the spare that replaces it "
                        "starts during the batch, on the same cores",
                    )
                ]
                if with_spares is not None
                else []
            ),
            Target(
                "innocent tasks lost by PrecompileExecutor",
                float(
                    max(
                        r.innocent_failed + r.innocent_rerun
                        for r in faulty + (with_spares.faulty if with_spares else [])
                    )
                ),
                "<=",
                0,
                unit="",
                why="an innocent task failed or ran twice: a bug in crash isolation",
            ),
        ],
        notes=skipped
        + [
            f"{name} lost {n} of {len(cfgs)} innocent tasks to {k} crash(es)"
            for name, n in lost_elsewhere.items()
        ]
        + [
            f"Starting one fresh PrecompileExecutor worker (interpreter + torch/triton import), "
            f"what each restart costs: {start_s:.2f}s here."
        ],
    )
    section.plot = {
        "title": f"3. {len(cfgs)} configs + {k} hangs + {k} crashes, timeout {timeout:.1f}s (s)",
        "labels": [name for name, _, _ in plotted],
        "series": [
            ("fault-free", [ff for _, ff, _ in plotted], "tab:green"),
            (
                "budget: fault-free + hung × timeout / workers",
                [budget_of(ff) for _, ff, _ in plotted],
                "tab:gray",
            ),
            ("with faults", [wall for _, _, wall in plotted], "tab:red"),
        ],
        "xlabel": "wall seconds",
    }
    return section


@dataclasses.dataclass
class _Ours:
    name: str
    faulty: list[FaultRun]
    clean: list[float]
    stats: pe.ExecutorStatistics

    @property
    def wall(self) -> float:
        return median(r.wall_s for r in self.faulty)

    @property
    def ff(self) -> float:
        return median(self.clean)


def _ours(
    ctx: Context, cfgs: list[Config], k: int, timeout: float, spares: int, start_s: float = 0.0
) -> _Ours:
    """Fault-free and faulty batches, ``repeats`` times each, on one warm PrecompileExecutor."""
    w = ctx.workers
    name = "PrecompileExecutor (warm)" + (f", spare_workers={spares}" if spares else "")
    extra = {"spare_workers": spares} if spares else {}
    ex = _batch.new_executor(w, **extra)
    view = ex.options(timeout=timeout)
    faulty: list[FaultRun] = []
    clean: list[float] = []
    try:
        for _ in range(ctx.repeats):
            _batch.warm_workers(ex)
            if spares:
                _wait_for_spares(w + spares, start_s)
            ctx.log(f"s3: {name}, fault-free")
            clean.append(_batch.on_executor(view, cfgs, ctx.fresh_dir("ff")).wall_s)
            _batch.warm_workers(ex)
            if spares:
                _wait_for_spares(w + spares, start_s)
            ctx.log(f"s3: {name}, with faults")
            log = ctx.fresh_dir("log") + "/starts.log"
            tasks = faulty_batch(cfgs, ctx.fresh_dir("faulty"), log, k, k)
            faulty.append(_submit_all(view.submit, tasks, log))
        stats = ex.statistics()
    finally:
        ex.shutdown()
    return _Ours(name, faulty, clean, stats)


def _wait_for_spares(processes: int, start_s: float) -> None:
    """Wait until this process has ``processes`` loky worker children, then for one start-up.

    Spares are not visible through the executor's public API; a spare that exists but is still
    importing torch would not help the batch, so the wait adds one measured worker start.
    """
    end = time.monotonic() + 120
    while time.monotonic() < end:
        workers = [
            p
            for p in descendants().values()
            if "loky" in " ".join(_cmdline(p)) and "resource_tracker" not in " ".join(_cmdline(p))
        ]
        if len(workers) >= processes:
            break
        time.sleep(0.1)
    time.sleep(start_s)


def _cmdline(proc: Any) -> list[str]:
    try:
        return list(proc.cmdline())
    except Exception:  # noqa: BLE001 - gone meanwhile
        return []


def _warm_task(_: int) -> int:
    return warm_compile(0.2)


def _errors(runs: list[FaultRun]) -> str:
    total: collections.Counter[str] = collections.Counter()
    for r in runs:
        total.update(r.errors)
    n = max(1, len(runs))
    return ", ".join(f"{name} ×{count / n:g}" for name, count in total.most_common()) or "—"
