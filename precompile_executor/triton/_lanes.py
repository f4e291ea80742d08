"""Caller compile lanes: a tune's queued compiles run on threads of this process while no worker
is ready for them, and the tune's own thread benchmarks them as they land.

::

    tune's thread                    executor's queue            lanes (precompile-caller-lane-N)
    -------------                    ----------------            --------------------------------
    Feeder.fill(): no task of the    shortest predicted ──────►  compile_request(request)
      tune running in a worker,        task.cancel() is True       triton.compile straight into
      a lane free                      (CompileJob.reroute)        this process's cache
    benchmarks what has landed ◄──── the job's future ◄───────── CompileJob._finish, as a worker's
                                                                 then Feeder.fill() again, here

A process's first tune meets an executor whose workers are still starting (an interpreter,
``import torch, triton``: seconds). Compiling its configs one at a time on the tune's thread
(``Tune._steal``) makes that tune serial; a lane compiles beside the tune's thread instead, and
up to :func:`lane_count` of them at once: much of a compile runs without the GIL (``ptxas`` is a
subprocess; Triton's LLVM passes run in C++).

Guarantees:

* A compile moves to a lane only through ``CompileJob.reroute``, whose ``cancel()`` proves no
  worker has it or ever will: every config compiles once.
* No lane compile starts once a worker runs any compile of the tune (the check precedes each
  move); lane compiles already running finish. From then on the workers compile and the tune's
  thread only benchmarks, as with ``_steal``.
* A lane slot is taken before a compile is submitted, so the lane pool never holds more
  compiles than it has threads. At interpreter exit Python joins a ``ThreadPoolExecutor``'s
  threads: idle lanes end at once, and exit waits at most for one compile per lane, already
  started — nothing can stop a Triton compile midway, in a lane as in stock Triton. Nothing
  else keeps a lane (or a tune) waiting at exit.
* A compile in a lane is not isolated: one that crashes takes this process down, as it would in
  stock Triton (``_autotune_tune.STEALS = False``: no lanes, every config in the executor).

Threads: :meth:`Feeder.fill` runs on the tune's thread and on a lane's thread as its compile
lands; the feeder's lock makes taking a job and a slot one step.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ._state import STATE
from ._submit import CompileJob

CALLER_LANES: int | None = None
"""How many compiles of a tune may run at once in this process's lanes; ``None``: from the CPUs
this process may run on, at most 4 and a quarter of them (at least 1). A quarter, because the
executor's template and workers start on the same cores meanwhile (``import torch`` is
CPU-bound) and the tune's thread needs one to launch its benchmarks; at most 4, because a small
compile's ``ptxas`` and LLVM halves already keep two threads busy (2 threads compiled 8 configs
in 0.57–1.27× one thread's time on a loaded 2-core box, Triton 3.9, sm_90). ``0``: no lanes, the
tune's thread compiles one config at a time itself (``Tune._steal``)."""

LANE_THREAD_NAME = "precompile-caller-lane"
"""The lane threads' name prefix (``threading.current_thread().name`` in a lane's compile)."""


def lane_count() -> int:
    """The number of lanes: :data:`CALLER_LANES`, or its default for this process's CPUs."""
    if CALLER_LANES is not None:
        return max(0, CALLER_LANES)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    return min(4, max(1, cpus // 4))


class CallerLanes:
    """The process-wide lanes: a ``ThreadPoolExecutor`` of :attr:`size` threads and as many
    slots; kept in ``STATE.lanes``, built on first use, shut down by ``STATE.reset()``.

    Attributes:
        size: the number of threads and slots.
        pool: the threads (named :data:`LANE_THREAD_NAME`).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.pool = ThreadPoolExecutor(size, thread_name_prefix=LANE_THREAD_NAME)
        self._slots = threading.BoundedSemaphore(size)

    def take(self) -> bool:
        """Take a free slot, without waiting; ``False`` if every lane is busy."""
        return self._slots.acquire(blocking=False)

    def give(self) -> None:
        """Give a slot back."""
        self._slots.release()

    def shutdown(self) -> None:
        """Refuse new compiles; running ones finish on their threads (no wait here)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def lanes() -> CallerLanes | None:
    """The process's lanes, built on first use; ``None`` when :func:`lane_count` is 0."""
    size = lane_count()
    if size == 0:
        return None
    with STATE.lock:
        found = STATE.lanes
        if not isinstance(found, CallerLanes) or found.size != size:
            if isinstance(found, CallerLanes):
                found.shutdown()  # a test changed CALLER_LANES
            found = STATE.lanes = CallerLanes(size)
        return found


class Feeder:
    """Moves one tune's queued compiles to the lanes, shortest predicted first, while none of
    the tune's compiles runs in a worker.

    Args:
        lanes: the process's lanes.
        jobs: the tune's compile jobs, each with its predicted compile time in seconds.
    """

    def __init__(self, lanes: CallerLanes, jobs: Iterable[tuple[float, CompileJob]]) -> None:
        self._lanes = lanes
        ranked = sorted(jobs, key=lambda one: one[0])
        self._jobs = [job for _, job in ranked]
        self._queue = list(reversed(self._jobs))  # pop() takes the shortest predicted
        self._lock = threading.Lock()
        self._in_flight = 0
        self._stopped = False

    @property
    def in_flight(self) -> int:
        """The tune's compiles running (or about to) in lanes now."""
        with self._lock:
            return self._in_flight

    def fill(self) -> int:
        """Move queued compiles to free lanes until none is free, none is left, or a worker
        runs a compile of the tune; return how many moved."""
        moved = 0
        while True:
            with self._lock:
                if self._stopped or self._worker_compiling() or not self._lanes.take():
                    return moved
                job = self._next()
                if job is None:
                    self._lanes.give()
                    return moved
                self._in_flight += 1
            task = job.reroute(self._lanes.pool)
            if task is None:  # a worker took it meanwhile, or the tune ended
                self._release()
                continue
            moved += 1
            task.add_done_callback(self._landed)

    def stop(self) -> None:
        """Move nothing more (the tune ended, or went to stock Triton)."""
        with self._lock:
            self._stopped = True

    def _worker_compiling(self) -> bool:
        """Whether a worker runs a compile of the tune (lanes' compiles are not workers')."""
        for job in self._jobs:
            task = job.task_future
            if not job.rerouted and task is not None and task.running():
                return True
        return False

    def _next(self) -> CompileJob | None:
        """The shortest predicted job whose task is still queued (under the lock)."""
        while self._queue:
            job = self._queue.pop()
            task = job.task_future
            if task is not None and not job.rerouted and not task.done() and not task.running():
                return job
        return None

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lanes.give()

    def _landed(self, _: Future[Any]) -> None:
        self._release()
        self.fill()  # on the lane's thread: the next compile starts before the tune's wakes
