"""CPython's own ``max_tasks_per_child`` tests, run against ``PrecompileExecutor``.

Adapted from CPython's ``Lib/test/test_concurrent_futures/test_process_pool.py`` (class
``ProcessPoolExecutorTest``; python/cpython, main branch as of commit 05a627cc4fb8; Copyright
Python Software Foundation, PSF License Agreement), to check stdlib parity.
What changed, and only that:

* ``self.executor_type(n, mp_context=context, max_tasks_per_child=k)`` →
  ``PrecompileExecutor(n, start=self.start, max_tasks_per_child=k)``; the mixins over
  multiprocessing start methods become two classes over our start modes (``template``,
  ``interpreter``). The ``fork`` start method's ``ValueError`` branches and skips are gone: no
  start mode here is incompatible (every worker is a process of its own, forked from a
  single-threaded template or a fresh interpreter).
* ``len(executor._processes)`` → ``executor.statistics().workers_alive``;
  ``support.SHORT_TIMEOUT`` → :data:`SHORT_TIMEOUT`; ``context.Manager()`` → a ``spawn``
  context's manager; the cleanup joining ``executor._executor_manager_thread`` is dropped (there
  is no such thread).
* ``_run_stranded_worker_exit_test(drop_reference=True)``: the stdlib fails the remaining
  futures with ``BrokenProcessPool`` ("garbage collected"); here an executor dropped without
  ``shutdown()`` still runs every task it took (docs/design.md, "Process lifecycle"), so those
  futures are checked for their results instead.
* Not taken: ``test_max_tasks_per_child_defaults_to_spawn_context`` (it reads the private
  ``_mp_context``), ``test_force_shutdown_during_max_tasks_worker_exit`` and
  ``test_failed_worker_replacement_breaks_pool`` (they patch private internals of the stdlib's
  pool: ``_force_shutting_down``, ``_spawn_worker``).
"""

from __future__ import annotations

import multiprocessing
import os
import unittest
import weakref

import pytest

from precompile_executor import PrecompileExecutor

pytestmark = pytest.mark.timeout(180)

SHORT_TIMEOUT = 30.0


def mul(x: int, y: int) -> int:
    return x * y


def _report_wait_return(queue, event, value):  # type: ignore[no-untyped-def]
    """Used as part of _run_stranded_worker_exit_test"""
    queue.put(value)
    event.wait()
    return value


class _MaxTasksTests:
    start = "template"

    def executor_type(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return PrecompileExecutor(*args, start=self.start, **kwargs)

    def get_context(self):  # type: ignore[no-untyped-def]
        return multiprocessing.get_context("spawn")

    def test_max_tasks_per_child(self):  # type: ignore[no-untyped-def]
        # not using self.executor as we need to control construction.
        # arguably this could go in another class w/o that mixin.
        executor = self.executor_type(1, max_tasks_per_child=3)
        f1 = executor.submit(os.getpid)
        original_pid = f1.result()
        # The worker pid remains the same as the worker could be reused
        f2 = executor.submit(os.getpid)
        self.assertEqual(f2.result(), original_pid)
        self.assertEqual(executor.statistics().workers_alive, 1)
        f3 = executor.submit(os.getpid)
        self.assertEqual(f3.result(), original_pid)

        # A new worker is spawned, with a statistically different pid,
        # while the previous was reaped.
        f4 = executor.submit(os.getpid)
        new_pid = f4.result()
        self.assertNotEqual(original_pid, new_pid)
        self.assertEqual(executor.statistics().workers_alive, 1)

        executor.shutdown()

    def test_max_tasks_per_child_pending_tasks_gh115634(self):  # type: ignore[no-untyped-def]
        # gh-115634: A worker exiting at its max_tasks_per_child limit left a
        # stale token in the idle worker semaphore, so no replacement worker
        # was spawned and the remaining queued tasks deadlocked.  Submit more
        # tasks than the pool can run at once so a backlog is queued while
        # workers hit their task limit.
        for max_workers, max_tasks, num_tasks in [(1, 2, 6), (2, 2, 8)]:
            with self.subTest(max_workers=max_workers, max_tasks=max_tasks):
                executor = self.executor_type(max_workers, max_tasks_per_child=max_tasks)
                try:
                    futures = [executor.submit(mul, i, 2) for i in range(num_tasks)]
                    # If the deadlock regresses, the result() calls time out,
                    # and the shutdown below hangs until the test timeout.
                    results = [f.result(timeout=SHORT_TIMEOUT) for f in futures]
                    self.assertEqual(results, [i * 2 for i in range(num_tasks)])
                finally:
                    executor.shutdown(wait=True, cancel_futures=True)

    def _run_stranded_worker_exit_test(self, *, shutdown, drop_reference):  # type: ignore[no-untyped-def]
        # A worker exits upon reaching its max_tasks_per_child limit while
        # more submitted work is queued.  While the executor object is
        # alive a replacement worker must be spawned and the remaining
        # work executed; once it has been garbage collected the remaining
        # work still runs here (see the module docstring).
        context = self.get_context()
        manager = context.Manager()
        self.addCleanup(manager.join)
        self.addCleanup(manager.shutdown)
        started = manager.Queue()
        gate = manager.Event()

        executor = self.executor_type(1, max_tasks_per_child=1)
        futs = [executor.submit(_report_wait_return, started, gate, i) for i in range(3)]
        # Wait until the worker is inside the first task so that it exits
        # at its task limit only after the executor has been shut down
        # and/or garbage collected below.
        self.assertEqual(started.get(timeout=SHORT_TIMEOUT), 0)
        if shutdown:
            executor.shutdown(wait=False)
        if drop_reference:
            executor_ref = weakref.ref(executor)
            executor = None
            import gc
            import time

            end = time.monotonic() + SHORT_TIMEOUT
            while time.monotonic() < end:
                gc.collect()
                if executor_ref() is None:
                    break
                time.sleep(0.01)
        gate.set()

        self.assertEqual(futs[0].result(timeout=SHORT_TIMEOUT), 0)
        results = [f.result(timeout=SHORT_TIMEOUT) for f in futs[1:]]
        self.assertEqual(results, [1, 2])

    def test_shutdown_no_wait_max_tasks_gh119592(self):  # type: ignore[no-untyped-def]
        # gh-119592: shutdown(wait=False) used to clear executor state that
        # worker replacement relied on.  A worker exiting at its
        # max_tasks_per_child limit afterwards could not be replaced, so
        # the remaining submitted work never ran, and a racing worker exit
        # could crash the manager thread on the partially cleared state.
        for drop_reference in (False, True):
            with self.subTest(drop_reference=drop_reference):
                self._run_stranded_worker_exit_test(shutdown=True, drop_reference=drop_reference)

    def test_gc_during_max_tasks_worker_exit_gh152967(self):  # type: ignore[no-untyped-def]
        # gh-152967: If the executor was garbage collected without
        # shutdown() while its last worker exited at its
        # max_tasks_per_child limit, no replacement worker could be
        # spawned and the remaining futures were never resolved.
        self._run_stranded_worker_exit_test(shutdown=False, drop_reference=True)

    def test_max_tasks_early_shutdown(self):  # type: ignore[no-untyped-def]
        # not using self.executor as we need to control construction.
        # arguably this could go in another class w/o that mixin.
        executor = self.executor_type(3, max_tasks_per_child=1)
        futures = []
        for i in range(6):
            futures.append(executor.submit(mul, i, i))
        executor.shutdown()
        for i, future in enumerate(futures):
            self.assertEqual(future.result(), mul(i, i))


class TemplateMaxTasksTest(_MaxTasksTests, unittest.TestCase):
    start = "template"


class InterpreterMaxTasksTest(_MaxTasksTests, unittest.TestCase):
    start = "interpreter"
