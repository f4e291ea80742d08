"""Every use of a private name of the standard library, in one place.

The library relies on six things the stdlib does not document; each is read or called only
through a function here, and ``tests/test_stdlib.py`` fails loudly, naming the thing, when a
Python changes one of them:

* ``concurrent.futures.Future._condition`` — the future's ``threading.Condition`` (over an
  ``RLock``), which ``set_result``, ``set_exception`` and ``add_done_callback`` take. Holding
  it, the settler checks that no user done-callback was added and sets a plain result on the
  monitor thread, so a callback added meanwhile waits and then runs on its adder's thread,
  never on the monitor (:func:`future_condition`; docs/design.md, "Threads: who owns what").
* ``concurrent.futures.Future._waiters`` and ``threading.Condition._waiters`` — who waits for
  a future: ``wait()``/``as_completed()`` put a waiter on the first, ``result()`` and
  ``exception()`` block in the second. The monitor, having set a result someone waits for,
  lets that thread have the interpreter lock at once (:func:`has_waiters`; docs/design.md,
  "The monitor thread").
* ``concurrent.futures.Future._done_callbacks`` — the list ``add_done_callback`` appends to,
  read (never changed) to tell the library's own callbacks (marked by :func:`own_callback`)
  from the user's (:func:`done_callbacks`, :func:`user_callbacks`).
* ``threading._register_atexit`` — a hook that runs at interpreter exit *before* non-daemon
  threads are joined and while thread pools still take work (the stdlib's own
  ``concurrent.futures.thread`` registers its exit with it, bpo-39812), so the hub can let
  submitted tasks finish and stop its workers (:func:`register_before_thread_pools_exit`).
* ``atexit._run_exitfuncs`` — runs the ``atexit`` hooks now, as the interpreter's exit would
  (each hook's exception reported and skipped), so a template or a worker started as an
  interpreter can run its hooks and then end with ``os._exit``, skipping the teardown
  (:func:`run_exit_hooks`; docs/design.md, "Process lifecycle").
* ``multiprocessing.resource_tracker._resource_tracker`` and its ``_fd`` and ``_pid`` — the
  process's tracker and the pipe to it, which loky hands every process it starts; a warm worker
  closes the inherited pipe and marks the tracker not started (:func:`drop_tracker_pipe`;
  docs/design.md, "Process lifecycle"). loky's tracker is a subclass with the same fields.

Checked: the same names, with the same meaning, in CPython 3.11.7, 3.12.1 and 3.13.0 (run
here), and in CPython's main-branch sources for 3.14: ``Lib/concurrent/futures/_base.py`` (the
one with ``Executor.map(buffersize=)``, new in 3.14) still creates ``_condition`` and
``_done_callbacks`` in ``Future.__init__`` and takes the condition in ``add_done_callback`` and
``set_result``; ``Lib/multiprocessing/resource_tracker.py`` (the JSON message format) still
keeps ``_resource_tracker`` with ``_fd`` and ``_pid``; ``threading._register_atexit`` is what
``Lib/concurrent/futures/thread.py`` calls at import; ``Modules/atexitmodule.c`` still defines
``_run_exitfuncs``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar


def future_condition(future: Future[Any]) -> threading.Condition:
    """The condition ``future``'s own methods take (re-entrant: ``set_result`` may run under
    it)."""
    return future._condition  # typeshed declares it


def has_waiters(future: Future[Any]) -> bool:
    """Whether a thread waits for ``future``: blocked in its ``result()``/``exception()``, or in
    ``wait()``/``as_completed()`` over it (read under :func:`future_condition`)."""
    condition_waiters = future._condition._waiters  # type: ignore[attr-defined]
    return bool(condition_waiters) or bool(future._waiters)


def done_callbacks(future: Future[Any]) -> list[Callable[[Future[Any]], object]]:
    """The done-callbacks ``future`` will call, in order (read them, never change them)."""
    callbacks: list[Callable[[Future[Any]], object]] = future._done_callbacks  # type: ignore[attr-defined]
    return callbacks


def run_exit_hooks() -> None:
    """Run and clear this process's ``atexit`` hooks, last registered first, as the
    interpreter's exit does (a hook that raises is reported on stderr and the others still
    run)."""
    atexit._run_exitfuncs()


def register_before_thread_pools_exit(fn: Callable[[], None]) -> None:
    """Call ``fn()`` at interpreter exit, before non-daemon threads are joined; hooks run last
    registered first, so one registered after ``concurrent.futures.thread`` was imported runs
    while its thread pools still take work."""
    threading._register_atexit(fn)  # type: ignore[attr-defined]


def resource_tracker() -> Any:
    """This process's ``multiprocessing`` resource tracker."""
    from multiprocessing import resource_tracker as tracker_module

    return tracker_module._resource_tracker  # typeshed declares it


def drop_tracker_pipe(tracker: Any) -> None:
    """Close ``tracker``'s pipe inherited from the parent and mark the tracker not started, so
    this process starts its own on first use and never waits for the parent's."""
    fd = getattr(tracker, "_fd", None)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    tracker._fd = None
    tracker._pid = None  # not this process's child: never waited for here


OWN_CALLBACK = "_precompile_executor_own"
"""The attribute that marks a done-callback as the library's own (:func:`own_callback`)."""

_F = TypeVar("_F", bound=Callable[..., Any])


def own_callback(fn: _F) -> _F:
    """Mark ``fn`` as a done-callback the library attaches itself: quick, takes no lock held
    across a wait, runs no user code — so a future carrying only such callbacks may be set on
    the monitor (:meth:`._scheduling.Settler.settle_now`; tests/test_settle.py pins which ones
    a future carries). Marks the function; its bound methods and ``functools.partial`` of it
    count too, and so do the instances of a class it marks."""
    setattr(fn, OWN_CALLBACK, True)
    return fn


def user_callbacks(future: Future[Any]) -> bool:
    """Whether ``future`` carries a done-callback that is not the library's own."""
    for callback in done_callbacks(future):
        fn = callback.func if isinstance(callback, functools.partial) else callback
        if not getattr(fn, OWN_CALLBACK, False):
            return True
    return False
