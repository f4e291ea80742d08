"""The private stdlib names the library relies on (:mod:`precompile_executor._stdlib`), checked on
the running Python: a Python that changes one fails here, naming it, rather than as a hang or a
callback run on the wrong thread somewhere else."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing import resource_tracker
from typing import Any

import pytest

from precompile_executor import _stdlib

pytestmark = pytest.mark.timeout(60)


def test_a_futures_condition_is_what_its_setters_and_add_done_callback_take() -> None:
    future: Future[int] = Future()
    condition = _stdlib.future_condition(future)
    assert isinstance(condition, threading.Condition), "Future._condition changed"
    seen: list[bool] = []
    with condition:  # re-entrant: set_result takes it again on this thread
        future.set_result(1)
    future.add_done_callback(lambda f: seen.append(True))
    assert seen == [True]
    # Held by another thread, the condition makes add_done_callback wait: the callback then
    # sees the future done and runs on its adder's thread (what settle_now relies on).
    pending: Future[int] = Future()
    ran_on: list[str] = []
    added = threading.Event()

    def add() -> None:
        pending.add_done_callback(lambda f: ran_on.append(threading.current_thread().name))
        added.set()

    adder = threading.Thread(target=add, name="adder")
    with _stdlib.future_condition(pending):
        adder.start()
        assert not added.wait(0.2), "add_done_callback no longer takes Future._condition"
        pending.set_result(2)
    adder.join(timeout=10)
    assert ran_on == ["adder"]


def _waited_by(block: Callable[[Future[int]], object]) -> bool:
    """Whether ``has_waiters`` sees a thread blocked in ``block(future)``; the future is then
    set and the thread joined."""
    future: Future[int] = Future()
    thread = threading.Thread(target=block, args=(future,))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with _stdlib.future_condition(future):
                if _stdlib.has_waiters(future):
                    return True
            time.sleep(0.005)
        return False
    finally:
        future.set_result(0)
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_has_waiters_sees_result_exception_wait_and_as_completed_and_nothing_else() -> None:
    assert _waited_by(lambda f: f.result(timeout=30)), "Condition._waiters changed"
    assert _waited_by(lambda f: f.exception(timeout=30)), "Condition._waiters changed"
    assert _waited_by(lambda f: concurrent.futures.wait([f], timeout=30)), "Future._waiters changed"
    assert _waited_by(lambda f: list(concurrent.futures.as_completed([f], timeout=30))), (
        "Future._waiters changed"
    )
    alone: Future[int] = Future()
    with _stdlib.future_condition(alone):
        assert not _stdlib.has_waiters(alone)
    alone.add_done_callback(lambda f: None)
    with _stdlib.future_condition(alone):
        assert not _stdlib.has_waiters(alone)  # a callback is not a waiter


def test_done_callbacks_lists_what_add_done_callback_added_in_order() -> None:
    future: Future[int] = Future()
    assert _stdlib.done_callbacks(future) == [], "Future._done_callbacks changed"

    def first(f: Future[Any]) -> None: ...

    def second(f: Future[Any]) -> None: ...

    future.add_done_callback(first)
    future.add_done_callback(second)
    assert _stdlib.done_callbacks(future) == [first, second]


def test_the_exit_hook_runs_before_non_daemon_threads_are_joined() -> None:
    # In a fresh interpreter: a non-daemon thread waits for an event only the hook sets; if the
    # hook ran after the join (or never), the interpreter would hang and the timeout fail it.
    code = textwrap.dedent(
        """
        import threading
        from precompile_executor import _stdlib
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        _stdlib.register_before_thread_pools_exit(lambda: (print("hook"), stop.set()))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hook"], "threading._register_atexit changed"


def test_the_resource_tracker_keeps_its_pipe_in_fd_and_pid() -> None:
    tracker = _stdlib.resource_tracker()
    assert tracker is resource_tracker._resource_tracker
    assert isinstance(tracker, resource_tracker.ResourceTracker)
    assert hasattr(tracker, "_fd") and hasattr(tracker, "_pid"), "ResourceTracker changed"


def test_dropping_the_tracker_pipe_closes_it_and_marks_it_not_started() -> None:
    tracker = resource_tracker.ResourceTracker()  # a fresh one: never this process's own
    read, write = os.pipe()
    tracker._fd = write
    tracker._pid = 12345
    _stdlib.drop_tracker_pipe(tracker)
    assert tracker._fd is None and tracker._pid is None
    assert os.read(read, 1) == b""  # the write end is closed: end of file
    os.close(read)
    _stdlib.drop_tracker_pipe(tracker)  # not started: nothing to do


def test_run_exit_hooks_runs_the_atexit_hooks_last_registered_first_and_clears_them() -> None:
    # In a fresh interpreter that then leaves with os._exit: a hook that ran twice (not cleared),
    # or not at all, shows in the output.
    code = textwrap.dedent(
        """
        import atexit, os, sys
        from precompile_executor import _stdlib
        atexit.register(print, "first registered")
        atexit.register(print, "last registered")
        _stdlib.run_exit_hooks()
        sys.stdout.flush()
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["last registered", "first registered"]
