"""The GIL's hand-off while tasks are in flight: the process's switch interval, lowered.

Every result of a task reaches its future through a thread of the caller: the monitor thread
reads the worker's socket (the local executor), a dask client's IO loop and callback threads
fetch it (the dask backend). Such a thread sleeps in ``select``/``epoll`` without the GIL and
needs it back to go on; while another thread of the program runs Python — an autotuner
generating the next config's code, benchmarking in a Python loop, Inductor lowering a graph —
CPython hands the GIL over only after ``sys.getswitchinterval()`` (5 ms by default) has passed,
at each step. A message that takes one step costs 5 ms; dask's round trip takes dozens of steps.

So from the moment a task of any executor of this library is in flight until the last such task
is done, the interval is at most :data:`BUSY_SWITCH_INTERVAL_S`; then it is put back as it was,
unless the program set its own meanwhile (then its own stays). It changes nothing while no other
thread waits for the GIL, and nothing for code that holds the GIL in one C call (those threads
are served by the held reads of :mod:`._held_io`). Why and measured: docs/design.md, "A busy
caller: the GIL's hand-off"; switched off with ``set_busy_switch_interval(None)``. Test:
tests/test_handoff.py.

Work started inside :func:`in_background` (a warm-up, a readiness probe) is not counted: an
integration whose caller compiles by itself until the workers answer (Inductor) has nobody
waiting for that work, and the caller's own work is what the process waits for.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from ._scheduler import own_callback

BUSY_SWITCH_INTERVAL_S = 0.001
"""The switch interval while tasks are in flight (Python's default: 0.005 s)."""


_background: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "precompile_executor_background", default=False
)
"""Set by :func:`in_background`: this context's tasks and warm-ups are not counted."""


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Within the block, on this thread (this context), tasks submitted and ``warm_up()`` calls
    do not lower the switch interval.

    For work nobody waits on while the caller works: an integration's background warm-up, or a
    readiness probe whose answer the caller polls without waiting, because until it comes the
    caller does the work itself (the Inductor integration: docs/inductor.md, "Readiness"). A
    faster start there would only take the GIL from the caller, whose work is the critical path.
    Whoever waits for workers to start (Helion's autotune, an explicit ``warm_up()``) keeps the
    lower interval: that start is its critical path.
    """
    token = _background.set(True)
    try:
        yield
    finally:
        _background.reset(token)


class Handoff:
    """Counts the tasks in flight in this process, over every executor; lowers the switch
    interval from the first to the last (see the module docstring)."""

    def __init__(self, interval: float | None) -> None:
        self._lock = threading.Lock()  # taken alone, never while calling out
        self._interval = interval
        self._in_flight = 0
        self._saved: float | None = None  # the interval to put back; None: ours not in force
        self._ours = 0.0  # what sys reported after we set it
        self._generation = 0  # a forked child's count starts anew: its parent's futures

    def in_flight(self) -> int:
        """Tasks submitted whose futures are not done yet, and ``holding()`` blocks open."""
        return self._in_flight

    def configure(self, interval: float | None) -> None:
        with self._lock:
            self._interval = interval
            if self._in_flight:
                self._restore()
                self._lower()

    def track(self, future: Future[Any]) -> None:
        """Count ``future`` in flight until it is done (a done-callback of the library's own);
        not inside :func:`in_background`."""
        if _background.get():
            return
        future.add_done_callback(functools.partial(self._done, self._begin()))

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Count one more in flight for the block: workers starting (``warm_up()``) send their
        hellos to the monitor while the caller may be busy; not inside :func:`in_background`."""
        if _background.get():
            yield
            return
        generation = self._begin()
        try:
            yield
        finally:
            self._done(generation, None)

    def _begin(self) -> int:
        """Count one more in flight; return the generation its end must match."""
        with self._lock:
            self._in_flight += 1
            if self._in_flight == 1:
                self._lower()
            return self._generation

    @own_callback
    def _done(self, generation: int, future: Future[Any] | None) -> None:
        with self._lock:
            if generation != self._generation:
                return  # counted by the parent this process was forked from
            self._in_flight -= 1
            if self._in_flight == 0:
                self._restore()

    def _lower(self) -> None:
        current = sys.getswitchinterval()
        if self._interval is not None and current > self._interval:
            sys.setswitchinterval(self._interval)
            self._saved, self._ours = current, sys.getswitchinterval()

    def forget_in_child(self) -> None:
        """A forked child inherits the count of its parent's tasks, which it never sees end,
        and maybe the lock held: it starts from zero at the program's own interval."""
        self._lock = threading.Lock()
        self._in_flight = 0
        self._generation += 1
        self._restore()

    def _restore(self) -> None:
        if self._saved is not None and sys.getswitchinterval() == self._ours:
            sys.setswitchinterval(self._saved)
        self._saved = None


handoff = Handoff(BUSY_SWITCH_INTERVAL_S)
"""The process's one count (the interval is process-wide)."""
os.register_at_fork(after_in_child=handoff.forget_in_child)


def set_busy_switch_interval(seconds: float | None) -> None:
    """Set the process's switch interval while tasks of this library are in flight
    (``sys.setswitchinterval``; default :data:`BUSY_SWITCH_INTERVAL_S`, 1 ms), or with ``None``
    leave the interval alone. A thread that waits for the GIL — the one that brings each task's
    result back — gets it this soon from a thread busy in Python. The interval is never raised,
    and is put back when the last task in flight is done (unless the program set its own
    meanwhile).

    Raises:
        TypeError, ValueError: ``seconds`` is not a positive finite number of seconds or None.
    """
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(
                f"seconds must be a number of seconds or None, got {type(seconds).__name__}"
            )
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"seconds must be a positive finite number of seconds, got {seconds}")
    handoff.configure(None if seconds is None else float(seconds))
