"""Tasks and result types for the interleaving tests and the soak (importable by workers)."""

from __future__ import annotations

import os
import sys
import time


def noop(x: int) -> int:
    return x


def pid_and_interval(delay: float) -> tuple[int, float, float]:
    """Sleep ``delay`` and return (pid, start, end) on the system-wide monotonic clock."""
    start = time.monotonic()
    time.sleep(delay)
    return os.getpid(), start, time.monotonic()


def sleep_then_build(delay: float) -> str:
    """Called while the parent unpickles a :class:`SlowToUnpickle` result."""
    time.sleep(delay)
    return "built"


class SlowToUnpickle:
    """Pickles at once in the worker; unpickling it in the parent takes ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __reduce__(self) -> tuple[object, tuple[float]]:
        return (sleep_then_build, (self.delay,))


def slow_to_unpickle(delay: float) -> SlowToUnpickle:
    time.sleep(0.1)  # lets the caller add a done-callback first
    return SlowToUnpickle(delay)


class ExitsOnUnpickle:
    """Unpickling it runs ``sys.exit(1)``: a ``SystemExit`` in whatever thread unpickles it."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (sys.exit, (1,))


def exits_on_unpickle() -> ExitsOnUnpickle:
    return ExitsOnUnpickle()


class MyBase(BaseException):
    """An exception outside the ``Exception`` hierarchy."""


def raise_system_exit(code: int) -> None:
    raise SystemExit(code)


def raise_my_base() -> None:
    raise MyBase("not an Exception")


class Obj:
    """A plain result object (supports weak references)."""

    def __init__(self, i: int) -> None:
        self.i = i


def make_obj(i: int) -> Obj:
    return Obj(i)


def failing_init(path: str) -> None:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    raise RuntimeError("initializer fails on purpose")


# -- the soak's task ------------------------------------------------------------------------------

BEAT_S = 0.02


def marked_task(marker_dir: str, task_id: int, duration: float) -> int:
    """Leave markers in ``marker_dir`` that tell the soak when and where this task ran.

    ``<id>.start`` is created with O_EXCL at the first line ("pid start-time"); a second run of
    the same id finds it and leaves ``<id>.double`` instead. While the task works it rewrites
    ``<id>.beat`` every ``BEAT_S``, so a killed task still shows when it was last alive.
    ``<id>.end`` holds the end time. Times are ``time.monotonic()``, the same clock in every
    process of the machine.
    """
    start = time.monotonic()
    base = os.path.join(marker_dir, str(task_id))
    try:
        fd = os.open(base + ".start", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        with open(base + ".double", "a") as f:
            f.write(f"{os.getpid()} {start!r}\n")
        raise RuntimeError(f"task {task_id} ran a second time") from None
    os.write(fd, f"{os.getpid()} {start!r}\n".encode())
    os.close(fd)
    beat = os.open(base + ".beat", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            now = time.monotonic()
            os.pwrite(beat, f"{now!r:<30}".encode(), 0)
            left = start + duration - now
            if left <= 0:
                break
            time.sleep(min(BEAT_S, left))
    finally:
        os.close(beat)
    with open(base + ".end", "w") as f:
        f.write(repr(time.monotonic()))
    return task_id
