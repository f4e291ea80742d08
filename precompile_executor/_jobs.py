"""A bounded pool of background threads that end when idle.

The hub runs two kinds of background work: jobs (start a worker, kill a process group, reap a
dead worker; a kill waits out its grace period, so many may run at once) and settling (decode a
result and set its future). Both come in bursts — a batch, a wave of timeouts — and then nothing
for minutes while an autotuner benchmarks. A ``ThreadPoolExecutor`` never gives a thread back,
so a process that once had a burst of 64 kills keeps 64 idle threads for its whole life. Here a
thread that found nothing to do for ``idle_s`` ends; starting one again costs about 0.1 ms,
far below any task's round trip.

Guarantees:

* at most ``max_threads`` threads run jobs at once; a job submitted while every thread is busy
  waits in the queue (FIFO) and the next free thread takes it;
* a job is never stranded: a new thread starts whenever the queued jobs outnumber the idle
  threads (and the cap allows), and an idle thread about to end checks the queue under the same
  lock a submitter holds while queueing (see :meth:`JobPool._loop`);
* a job's exception is logged, never raised into the pool, and never ends its thread;
* no job object (and so no task result) is referenced by an idle thread.

No ``Future`` per job: a settle is one small job per task, and a future plus its condition per
job would cost more than the job.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("precompile_executor")

THREAD_IDLE_S = 1.0
"""A background thread with nothing to do for this long ends: a new one starts in ~0.1 ms,
while an idle thread holds a stack and counts against the process's thread limit forever."""


class JobPool:
    """Runs ``fn(*args)`` jobs on at most ``max_threads`` threads that end when idle.

    Args:
        max_threads: most jobs running at once.
        name: thread name prefix (``precompile-job-3``).
        idle_s: seconds a thread waits for a job before it ends.
    """

    def __init__(self, max_threads: int, name: str, idle_s: float = THREAD_IDLE_S) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self._max = max_threads
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting in _loop for a job
        self._closed = False
        self._ids = iter(range(1 << 62))

    def threads(self) -> int:
        """Threads alive now (busy or idle)."""
        with self._lock:
            return len(self._threads)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; a free thread runs it.

        Raises:
            RuntimeError: the pool is shut down, or no thread can be started (the interpreter
                is exiting) and none is alive to take the job: run it yourself.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit a job after shutdown")
            self._queue.append((fn, args))
            if self._idle:
                self._wakeup.notify()
            if len(self._queue) <= self._idle or len(self._threads) >= self._max:
                return  # an idle thread, or the next busy one to finish, takes it
            thread = threading.Thread(
                target=self._loop, name=f"{self._name}-{next(self._ids)}", daemon=True
            )
            self._threads.add(thread)
            try:
                thread.start()
            except RuntimeError:  # "can't create new thread at interpreter shutdown"
                self._threads.discard(thread)
                if not self._threads:
                    self._queue.pop()
                    raise

    def _loop(self) -> None:
        me = threading.current_thread()
        lock = self._lock
        lock.acquire()
        try:
            while True:
                end = time.monotonic() + self._idle_s
                while not self._queue:
                    left = end - time.monotonic()
                    if self._closed or left <= 0:
                        # Decided under the lock a submitter holds to queue: a job queued
                        # after this point sees one thread fewer and starts another.
                        self._threads.discard(me)
                        self._wakeup.notify_all()  # shutdown(wait=True) may be waiting
                        return
                    self._idle += 1
                    self._wakeup.wait(left)
                    self._idle -= 1
                fn, args = self._queue.popleft()
                lock.release()
                try:
                    fn(*args)
                except BaseException:  # noqa: BLE001 - a job never ends its thread
                    log.exception("background job %r raised", fn)
                finally:
                    del fn, args  # hold nothing of the job while idle
                    lock.acquire()
        finally:
            lock.release()

    def shutdown(self, wait: bool = True, timeout_s: float = 30.0) -> None:
        """Refuse new jobs; threads finish the queued ones and end. With ``wait``, block until
        they have (at most ``timeout_s``)."""
        with self._lock:
            self._closed = True
            self._wakeup.notify_all()
            if not wait:
                return
            end = time.monotonic() + timeout_s
            while self._threads:
                left = end - time.monotonic()
                if left <= 0:
                    log.warning("%d background threads still busy at shutdown", len(self._threads))
                    return
                self._wakeup.wait(left)
