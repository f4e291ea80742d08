"""Scenario 4: timeout kill latency — from the deadline to the future resolved and the group gone.

Each task starts a ``sleep`` grandchild in its own process group (as ptxas would be), records
when it started, then hangs: in Python (a busy loop), in C with the GIL held (``sleep`` through
``ctypes.PyDLL``), or ignoring SIGTERM (only SIGKILL ends it). The deadline is the task's own
start + the timeout. "Resolved" is when the future got its exception (a done-callback's clock);
"group gone" is when psutil no longer finds the task's process or the grandchild alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

import precompile_executor as pe

from . import _pools, _seed
from ._common import Context, is_gone, median, wait_gone
from ._report import Section, Table, Target
from ._tasks import hang_with_grandchild

GONE_WAIT_S = 2.5
"""How long past the deadline (at least) the group may take to disappear before it counts as a
survivor: well past the 0.5 s + kill grace the target allows."""

KINDS = ("python", "c", "ignore-term")


class _Result:
    def __init__(self) -> None:
        self.resolved: list[float] = []
        self.gone: list[float] = []
        self.survivors = 0
        self.errors: set[str] = set()


def _read_info(path: str, timeout_s: float = 30.0) -> dict[str, Any]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError), open(path) as f:
            return json.load(f)  # type: ignore[no-any-return]
        time.sleep(0.005)
    raise TimeoutError(f"the task never wrote {path}")


def _measure_future(
    submit: Callable[[str], Future[Any]], info_path: str, timeout: float, result: _Result
) -> None:
    resolved: list[float] = []
    future = submit(info_path)
    future.add_done_callback(lambda _f: resolved.append(time.monotonic()))
    info = _read_info(info_path)
    try:
        future.result(timeout=timeout + 60)
        result.errors.add("returned!")
    except Exception as exc:  # noqa: BLE001 - the expected timeout error, whichever pool
        result.errors.add(type(exc).__name__)
    _finish(info, resolved[0] if resolved else time.monotonic(), timeout, result)


def _finish(info: dict[str, Any], resolved_at: float, timeout: float, result: _Result) -> None:
    deadline = info["start"] + timeout
    pids = [info["pid"], info["grandchild"]]
    gone_at = wait_gone(pids, max(0.5, deadline + GONE_WAIT_S - time.monotonic()))
    result.resolved.append(resolved_at - deadline)
    if gone_at is None:
        result.survivors += 1
        for pid in pids:  # clean up what the pool left behind
            if not is_gone(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        wait_gone(pids, 5.0)
    else:
        result.gone.append(gone_at - deadline)


def run(ctx: Context) -> Section:
    timeout = 0.5 if ctx.quick else 1.0
    reps = 1 if ctx.quick else ctx.repeats
    rows: dict[str, _Result] = {}
    ctx.log(f"s4: timeout {timeout}s, {reps} run(s) per row")

    ex = pe.PrecompileExecutor(1, timeout=timeout)
    try:
        for path in ("spawn", "fork"):
            view = ex.options(path=path)
            for kind in KINDS:
                name = f"PrecompileExecutor, {path} path, {kind} hang"
                ctx.log(f"s4: {name}")
                res = rows.setdefault(name, _Result())
                for _ in range(reps):
                    if path == "spawn":
                        ex.warm_up(timeout=120)  # the replacement worker is up before we time
                    info = os.path.join(ctx.fresh_dir("kill"), "info.json")
                    _measure_future(
                        partial(view.submit, hang_with_grandchild, kind),
                        info,
                        timeout,
                        res,
                    )
    finally:
        ex.terminate_workers()

    for kind in ("python", "ignore-term"):
        name = f"seed fork mode, {kind} hang"
        ctx.log(f"s4: {name}")
        res = rows.setdefault(name, _Result())
        for _ in range(reps):
            info = os.path.join(ctx.fresh_dir("kill"), "info.json")
            outcome = _seed.run_forked([(hang_with_grandchild, (kind, info))], 1, timeout=timeout)[
                0
            ]
            res.errors.add("timeout" if outcome.timed_out else outcome.error)
            _finish(_read_info(info), outcome.ended, timeout, res)

    skipped = []
    why = _pools.missing("pebble")
    if why:
        skipped.append(f"pebble: skipped, {why}")
    else:
        pool = _pools.start("pebble", 1)
        assert isinstance(pool, _pools._PebblePool)
        pool.timeout = timeout
        try:
            for kind in ("python", "ignore-term"):
                name = f"pebble ProcessPool, {kind} hang"
                ctx.log(f"s4: {name}")
                res = rows.setdefault(name, _Result())
                for _ in range(reps):
                    pool.submit(os.getpid).result(timeout=60)  # a worker is up
                    info = os.path.join(ctx.fresh_dir("kill"), "info.json")
                    _measure_future(
                        partial(pool.submit, hang_with_grandchild, kind),
                        info,
                        timeout,
                        res,
                    )
        finally:
            pool.close()

    limit = 0.5 + pe.KILL_GRACE_S
    table = Table(
        f"Timeout {timeout}s; latency past the deadline in seconds (median (max) of {reps}); "
        f"target for PrecompileExecutor: resolved ≤ 0.5 + KILL_GRACE_S = {limit:.1f}s",
        [
            "pool and hang",
            "future resolved",
            "process group gone",
            "grandchild survived",
            "error raised",
        ],
    )
    worst = 0.0
    for name, res in rows.items():
        if name.startswith("PrecompileExecutor") and res.resolved:
            worst = max(worst, max(res.resolved), max(res.gone, default=0.0))
        gone = "—" if not res.gone else f"{median(res.gone):.3f} ({max(res.gone):.3f})"
        table.add(
            name,
            f"{median(res.resolved):.3f} ({max(res.resolved):.3f})" if res.resolved else "—",
            gone,
            f"{res.survivors} of {reps}" if res.survivors else "no",
            ", ".join(sorted(res.errors)),
        )
    survivors = sum(r.survivors for n, r in rows.items() if n.startswith("PrecompileExecutor"))
    section = Section(
        "s4",
        "4. Timeout kill latency",
        __doc__.split("\n\n", 1)[1].replace("\n", " ").strip()
        + f" PrecompileExecutor sends SIGTERM to the group, waits up to KILL_GRACE_S = "
        f"{pe.KILL_GRACE_S}s, then SIGKILLs it. Grandchildren that outlive a pool are killed by "
        "the benchmark afterwards.",
        tables=[table],
        targets=[
            Target(
                "worst PrecompileExecutor latency past the deadline (resolved or group gone)",
                worst,
                "<=",
                limit,
                unit="s",
                why="the kill or the monitor thread's deadline check ran late",
            ),
            Target(
                "PrecompileExecutor grandchildren that survived a timeout",
                float(survivors),
                "<=",
                0,
                unit="",
                why="a process of the task's group outlived the kill",
            ),
        ],
        notes=skipped,
    )
    labels = [n for n, r in rows.items() if r.resolved]
    section.plot = {
        "title": f"4. Timeout kill: future resolved, s past the deadline (timeout {timeout}s)",
        "labels": [n.replace(", ", ",\n", 1) for n in labels],
        "values": [median(rows[n].resolved) for n in labels],
        "xlabel": "seconds after the deadline",
        "fmt": "{:.3f}",
        "colors": ["tab:orange" if n.startswith("Precompile") else "tab:blue" for n in labels],
        "lines": [{"x": limit, "label": "target", "color": "tab:red"}],
    }
    return section
