"""Where the time from a worker crash to its replacement taking the next task goes.

Usage (from the repository root)::

    python -m benchmarks._replace_latency             # 20 crashes, template start
    python -m benchmarks._replace_latency --kill      # 20 timeout kills (0.5 s timeout)
    python -m benchmarks._replace_latency --import benchmarks.s8_starts
    python -m benchmarks._replace_latency -n 40 --start interpreter

One warm 1-worker executor whose initializer imports torch and triton (as scenario 8's
``solo``); then, ``n`` times, what ``s8_starts._replacement_s`` measures: a task that SIGKILLs
its own worker (or hangs past its timeout), then a task that returns ``time.monotonic()``,
counted from the first submit (``--kill``: submit + timeout) to the second task's start in its
worker. ``--import MODULE``: both tasks import ``MODULE`` first, as a task whose function lives
in a module the template never imported does when it is unpickled.

The steps come from the tasks' :class:`TaskTimeline` records, a stamp the crashing task writes
just before it kills itself, and stamps taken by wrapping a few methods of the hub's parts in
this process (nothing in the library changes): the kill's group snapshot and signal, the end of
file seen, the fork request to the template, its ``Forked`` and ``Exited`` (the template reaped
the dead worker), the replacement's ``Hello``, the crashed task's failure reported. Each step is
printed as the median (min, max) over the rounds of its time from the origin.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import precompile_executor as pe
from precompile_executor import _process, _processes

from . import _tasks
from ._common import median
from ._report import Table

_events: list[tuple[str, float]] = []
_TEMPLATE_MESSAGES = {"Forked", "Exited", "ForkRefused", "Hello"}


def _wrap(
    cls: type, name: str, label_of: Callable[..., str | None], *, after: bool = False
) -> None:
    """Stamp ``cls.name``'s call (``after``: its return) as ``label_of(*args)`` (``None``: no
    stamp)."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        label = label_of(*args)
        if label and not after:
            _events.append((label, time.monotonic()))
        try:
            return original(self, *args, **kwargs)
        finally:
            if label and after:
                _events.append((label, time.monotonic()))

    setattr(cls, name, wrapper)


def instrument() -> None:
    """Wrap the hub's methods (once per process)."""
    descendants = _process.descendants

    def stamped_descendants(pid: int) -> Any:
        _events.append(("kill job starts", time.monotonic()))
        try:
            return descendants(pid)
        finally:  # kill_group signals right after this snapshot
            _events.append(("group signalled", time.monotonic()))

    _process.descendants = stamped_descendants
    _wrap(_processes.Hub, "eof", lambda conn: "eof")
    _wrap(_processes.Launcher, "_ask_fork", lambda template, workers: "fork asked")

    def message_label(conn: Any, message: Any) -> str | None:
        name = type(message).__name__
        return name.lower() if name in _TEMPLATE_MESSAGES else None

    _wrap(_processes.Hub, "dispatch", message_label)
    _wrap(
        _processes.Reaper,
        "reap",
        lambda worker, task: None if task is None else "crash reported",
        after=True,
    )


def _first(name: str, since: float) -> float | None:
    return next((t for n, t in _events if n == name and t >= since), None)


def one_round(
    ex: pe.PrecompileExecutor, *, kill: bool, timeout: float, module: str | None
) -> dict[str, float | None]:
    """One crash (or timeout kill) and the next task; each step's time from the origin."""
    stamp_file = tempfile.mktemp(prefix="replace-latency-")
    view = ex.options(timeout=timeout)
    first: tuple[Any, ...] = (_tasks.hang,) if kill else (_tasks.stamp_then_sigkill, stamp_file)
    second: tuple[Any, ...] = (_tasks.now,)
    if module is not None:
        first, second = (
            (_tasks.imported_then, module, *first),
            (_tasks.imported_then, module, *second),
        )
    _events.clear()
    t0 = time.monotonic()
    failed, nxt = view.submit(*first), view.submit(*second)
    error = failed.exception(timeout=600)
    assert isinstance(error, (pe.WorkerCrashedError, pe.TaskTimeoutError)), error
    start: float = nxt.result(timeout=600)
    lines = {t.future: t for t in ex.timeline() if t.future in (failed, nxt)}
    bad, good = lines[failed], lines[nxt]
    killed: float | None = None
    if not kill:
        try:
            with open(stamp_file) as f:
                killed = float(f.read())
            os.unlink(stamp_file)
        except (OSError, ValueError):
            pass  # died before the stamp (an import in --import failed?)
    steps = {
        "failing task sent": bad.sent,
        "its Started in parent": bad.started,
        "worker kills itself": killed,
        **{k: _first(k, t0) for k in ("kill job starts", "group signalled")},
        "eof in parent": _first("eof", t0),
        "fork asked": _first("fork asked", t0),
        "Exited in parent": _first("exited", t0),
        "crash reported": _first("crash reported", t0),
        "crash settled": bad.settled,
        "Forked in parent": _first("forked", t0),
        "Hello in parent": _first("hello", t0),
        "next sent": good.sent,
        "next Started in parent": good.started,
        "next starts in worker": start,
    }
    origin = t0 + timeout if kill else t0
    return {k: None if v is None else v - origin for k, v in steps.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks._replace_latency")
    p.add_argument("-n", type=int, default=20, help="rounds (default 20)")
    p.add_argument("--kill", action="store_true", help="a timeout kill instead of a crash")
    p.add_argument("--timeout", type=float, default=0.5, help="--kill: the timeout (0.5 s)")
    p.add_argument("--start", default="template", choices=("template", "interpreter"))
    p.add_argument("--import", dest="module", help="both tasks import this module first")
    args = p.parse_args(argv)
    instrument()
    ex = pe.PrecompileExecutor(
        1,
        initializer=_tasks.import_torch_triton,
        initargs=(f"latency-{time.monotonic()}",),  # a worker kind of its own
        start=args.start,
    )
    try:
        ex.warm_up(timeout=600)
        timeout = args.timeout if args.kill else 600.0
        rounds = [
            one_round(ex, kill=args.kill, timeout=timeout, module=args.module)
            for _ in range(args.n)
        ]
    finally:
        ex.shutdown()
        pe.stop_idle_workers()
    origin = "submit + timeout" if args.kill else "the first submit"
    rows = []
    for key in rounds[0]:
        if values := [v * 1e3 for r in rounds if (v := r[key]) is not None]:
            rows.append(
                {
                    f"step (ms from {origin})": key,
                    "median": f"{median(values):.1f}",
                    "min": f"{min(values):.1f}",
                    "max": f"{max(values):.1f}",
                    "rounds": len(values),
                }
            )
    what = "timeout kill" if args.kill else "crash"
    extra = f", tasks import {args.module}" if args.module else ""
    print(
        Table.of(
            f"{what} -> next task starts (start={args.start}{extra}), {args.n} rounds", rows
        ).text()
    )


if __name__ == "__main__":
    main()
