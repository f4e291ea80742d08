"""Scenario 4: timeout kill latency — from the deadline to the future resolved and the group gone.

Each task starts a ``sleep`` grandchild in its own process group (as ptxas would be), records
when it started, then hangs: in Python (a busy loop), in C with the GIL held (``sleep`` through
``ctypes.PyDLL``), or ignoring SIGTERM (only SIGKILL ends it). The deadline is the task's own
start + the timeout. "Resolved" is when the future got its exception (a done-callback's clock);
"group gone" is when psutil no longer finds the task's process or the grandchild alive.
PrecompileExecutor sends SIGTERM to the group, waits up to ``KILL_GRACE_S``, then SIGKILLs it.
Grandchildren that outlive a pool are killed by the benchmark afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import precompile_executor as pe

from . import _helion_modes, _pools
from ._common import Context, is_gone, median, wait_gone
from ._report import Section, Table, Target, bars, intro
from ._tasks import hang_with_grandchild

GONE_WAIT_S = 2.5
"""How long past the deadline (at least) the group may take to disappear before it counts as a
survivor: well past the 0.5 s + kill grace the target allows."""


def _read_info(path: str, timeout_s: float = 30.0) -> dict[str, Any]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError), open(path) as f:
            return json.load(f)  # type: ignore[no-any-return]
        time.sleep(0.005)
    raise TimeoutError(f"the task never wrote {path}")


def _via_future(submit: Callable[..., Future[Any]], kind: str, info: str) -> tuple[float, str]:
    """Submit the hang; return when its future resolved and with what error."""
    resolved: list[float] = []
    future = submit(hang_with_grandchild, kind, info)
    future.add_done_callback(lambda _f: resolved.append(time.monotonic()))
    try:
        future.result(timeout=600)
        return time.monotonic(), "returned!"
    except Exception as exc:  # noqa: BLE001 - the expected timeout error, whichever pool
        return resolved[0] if resolved else time.monotonic(), type(exc).__name__


def _once(row: dict[str, Any], ended: tuple[float, str], info_path: str, timeout: float) -> None:
    """Add one kill to ``row``: latency of the resolution and of the group's end, or a survivor
    (then killed here)."""
    info = _read_info(info_path)
    deadline = info["start"] + timeout
    pids = [info["pid"], info["grandchild"]]
    gone_at = wait_gone(pids, max(0.5, deadline + GONE_WAIT_S - time.monotonic()))
    row["resolved"].append(ended[0] - deadline)
    row["errors"].add(ended[1])
    if gone_at is None:
        row["survivors"] += 1
        for pid in pids:
            if not is_gone(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        wait_gone(pids, 5.0)
    else:
        row["gone"].append(gone_at - deadline)


def measure(ctx: Context, timeout: float, reps: int) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []

    def kills(name: str, once: Callable[[str, str], tuple[float, str]], kind: str) -> None:
        ctx.log(f"s4: {name}")
        row = {"name": name, "resolved": [], "gone": [], "survivors": 0, "errors": set()}
        for _ in range(reps):
            info = os.path.join(ctx.fresh_dir("kill"), "info.json")
            _once(row, once(kind, info), info, timeout)
        rows.append(row)

    ex = pe.PrecompileExecutor(1, timeout=timeout)
    try:
        for path in ("spawn", "fork"):
            view = ex.options(path=path)

            def ours(kind: str, info: str, view: Any = view, path: str = path) -> tuple[float, str]:
                if path == "spawn":
                    ex.warm_up(timeout=120)  # the replacement worker is up before we time
                return _via_future(view.submit, kind, info)

            for kind in ("python", "c", "ignore-term"):
                kills(f"PrecompileExecutor, {path} path, {kind} hang", ours, kind)
    finally:
        ex.terminate_workers()

    def forked(kind: str, info: str) -> tuple[float, str]:
        out = _helion_modes.run_forked([(hang_with_grandchild, (kind, info))], 1, timeout=timeout)[
            0
        ]
        return out.ended, "timeout" if out.timed_out else out.error

    for kind in ("python", "ignore-term"):
        kills(f"Helion's fork mode, {kind} hang", forked, kind)
    skipped: list[str] = []
    for pool in _pools.each(["pebble"], 1, ctx, skipped):
        with pool:
            pool.timeout = timeout

            def pebble(kind: str, info: str, pool: Any = pool) -> tuple[float, str]:
                pool.submit(os.getpid).result(timeout=60)  # a worker is up
                return _via_future(pool.submit, kind, info)

            for kind in ("python", "ignore-term"):
                kills(f"pebble ProcessPool, {kind} hang", pebble, kind)
    return rows, skipped


def run(ctx: Context) -> Section:
    timeout = 0.5 if ctx.quick else 1.0
    reps = ctx.repeats
    ctx.log(f"s4: timeout {timeout}s, {reps} run(s) per row")
    rows, skipped = measure(ctx, timeout, reps)
    limit = 0.5 + pe.KILL_GRACE_S

    def stat(values: list[float]) -> str:
        return f"{median(values):.3f} ({max(values):.3f})" if values else "—"

    table = Table.of(
        f"Timeout {timeout}s; latency past the deadline in seconds (median (max) of {reps}); "
        f"target for PrecompileExecutor: resolved ≤ 0.5 + KILL_GRACE_S = {limit:.1f}s",
        [
            {
                "pool and hang": r["name"],
                "future resolved": stat(r["resolved"]),
                "process group gone": stat(r["gone"]),
                "grandchild survived": f"{r['survivors']} of {reps}" if r["survivors"] else "no",
                "error raised": ", ".join(sorted(r["errors"])),
            }
            for r in rows
        ],
    )
    ours = [r for r in rows if r["name"].startswith("PrecompileExecutor")]
    worst = max(max(r["resolved"] + r["gone"]) for r in ours)
    survivors = sum(r["survivors"] for r in ours)
    section = Section(
        "s4",
        "4. Timeout kill latency",
        intro(__doc__) + f" (KILL_GRACE_S = {pe.KILL_GRACE_S}s.)",
        [table],
        [
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
    section.plot = bars(
        f"4. Timeout kill: future resolved, s past the deadline (timeout {timeout}s)",
        [r["name"].replace(", ", ",\n", 1) for r in rows],
        {"": ([median(r["resolved"]) for r in rows], "")},
        "seconds after the deadline",
        fmt="{:.3f}",
        lines=[{"x": limit, "label": "target", "color": "tab:red"}],
    )
    return section
