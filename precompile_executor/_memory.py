"""Per-task memory limits: what a task's process group holds, sampled; admission against memory.

**What is measured** (docs/design.md, "Memory limits"). A task's charge is the resident memory
of its worker's process group — the worker and every descendant (a compiler it spawned, a
grandchild that called ``setsid``) — minus the pages the worker shared with other processes
when the task started:

    charge = Σ RSS(member)  −  shared(worker at the task's start)

RSS comes from ``/proc/<pid>/statm`` (microseconds per process, so every group is sampled every
:data:`SAMPLE_INTERVAL_S`); ``shared`` is ``Shared_Clean + Shared_Dirty`` of
``/proc/<pid>/smaps_rollup``, read once per task on a job thread (milliseconds: it walks the
page tables; a batch starting 16 tasks at once must not hold up the other groups' samples). The
result is close to the group's USS — the memory its death gives back — which is the measure a
limit should use here: a worker forked from a warm template shares the template's pages (torch,
Triton: hundreds of MB) copy-on-write, so its RSS charges every worker for the same pages (and a
limit would have to include them), and its PSS changes with how many siblings exist. USS itself
(``smaps_rollup`` every round) costs milliseconds per process per sample — 77 ms for a 300 MB
process on a loaded 2-core machine — far too slow for a 50 ms check. What the cheap form misses:
a template page the task writes to (copied on write: the RSS does not change) is not charged.
A fork-path child shares the caller's pages likewise; there the leader counts its anonymous
resident memory less the caller's at the fork (``statm``: a fork copies the page tables of
anonymous memory, so the child starts with exactly the caller's), and ``smaps_rollup`` — whose
cost grows with the caller — is never read.

**Admission.** A task with a limit starts only while the tasks with limits already running,
each counted at its limit less what it holds now, plus this one fit in the memory the machine
has available (``psutil.virtual_memory().available``, which already excludes what they hold):
:func:`._policy.fits_in_memory`. With nothing limited running, the head task starts anyway,
so a limit larger than the free memory slows a batch to one task at a time but never stalls it.

**Threads.** One watcher thread samples while something is watched or a scheduler waits for
memory, and ends after :data:`._jobs.THREAD_IDLE_S` with nothing to do. It never holds the
hub's lock while it reads ``/proc``; a group past its limit is handed to the hub
(``on_exceeded``), which orders the task's kill (a ``KillOrder``) and kills the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from . import _policy
from ._jobs import THREAD_IDLE_S

SAMPLE_INTERVAL_S = 0.02
"""Seconds between two samples of a group: well inside the 50 ms the limit promises, at a
cost of ~20 µs per process read."""

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (``/proc/<pid>/statm``), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def anon_bytes(pid: int) -> int:
    """Anonymous resident memory of ``pid`` (``statm``: resident less file-backed and shmem)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def shared_bytes(pid: int) -> int:
    """Resident pages ``pid`` shares with other processes now (``smaps_rollup``: milliseconds)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        try:
            return int(psutil.Process(pid).memory_info().shared)  # no smaps_rollup: older kernel
        except psutil.Error:
            return 0
    shared = 0
    for line in text.splitlines():
        if line.startswith((b"Shared_Clean:", b"Shared_Dirty:")):
            shared += int(line.split()[1]) * 1024
    return shared


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/<pid>/task/<tid>/children``: any thread may fork)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError),
                open(f"/proc/{pid}/task/{tid}/children", "rb") as f,
            ):
                kids += [int(k) for k in f.read().split()]
    return kids


def group_members(pid: int) -> list[int]:
    """``pid`` and every descendant alive now (also those that left its process group)."""
    members, frontier = [pid], [pid]
    while frontier:
        found = [kid for parent in frontier for kid in _children(parent)]
        members += found
        frontier = found
    return members


def kill_now(pid: int) -> None:
    """SIGKILL the group ``pid`` leads and every descendant, at once: the members are found
    through the children lists (microseconds), not by a scan of every process (psutil's
    ``children()``: tens of ms on a busy machine), so the memory comes back sooner. The caller
    still waits for them with :func:`._process.kill_group`."""
    members = group_members(pid)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    for member in members:
        with contextlib.suppress(OSError):
            os.kill(member, signal.SIGKILL)


def group_rss(pid: int) -> int:
    """Σ RSS of ``pid`` and its descendants."""
    return sum(rss_bytes(member) for member in group_members(pid))


class _Watched:
    __slots__ = ("fork_anon", "key", "last", "limit", "peak", "pid", "shared")

    def __init__(self, key: Any, pid: int, limit: int, fork_anon: int | None) -> None:
        self.key = key
        self.pid = pid
        self.limit = limit
        self.fork_anon = fork_anon  # a fork-path child: the caller's anonymous memory at the fork
        self.shared: int | None = None  # measured on the watcher thread, before the first check
        self.last = 0  # the latest charge
        self.peak = 0


class MemoryGuard:
    """Reservations, samples and the watcher thread for every task with a memory limit.

    Args:
        lock: the hub's lock (reservations change under it).
        on_exceeded: called (watcher thread, no lock held) with ``(key, pid, peak_bytes)`` when
            a watched group's charge passes its limit; it decides and kills.
        repump: called (watcher thread, no lock held) for each scheduler waiting for memory, every
            sample round, so memory freed elsewhere — another executor, another program —
            lets its queue go on.
        submit: runs ``fn(*args)`` on a background job thread (the hub's job pool).
    """

    def __init__(
        self,
        lock: threading.RLock,
        on_exceeded: Callable[[Any, int, int], None],
        repump: Callable[[Any], None],
        submit: Callable[..., None],
    ) -> None:
        self._lock = lock
        self._on_exceeded = on_exceeded
        self._repump = repump
        self._submit = submit
        self._reserved: dict[Any, int] = {}  # key (a task) → its limit, from dispatch to close
        self._watched: dict[Any, _Watched] = {}  # key → what is sampled (a started task)
        self._waiting: set[Any] = set()  # schedulers whose head task waits for memory
        self._thread: threading.Thread | None = None
        self._to_measure: list[_Watched] = []  # watched, their shared pages not read yet
        self.pending = False
        """Something for :meth:`start_pending`: a thread or a job to start (read without the
        lock by :meth:`._processes.Hub.run`, so a task with no memory limit costs no call)."""

    # -- under the hub's lock ----------------------------------------------------------------

    def admits(self, limit: int) -> bool:
        """Whether a task with ``limit`` may start now (lock held)."""
        held = [(r, self.charge(k)) for k, r in self._reserved.items()]
        available = psutil.virtual_memory().available
        return _policy.fits_in_memory(limit, held, available)

    def reserved(self) -> int:
        """Bytes reserved by tasks with limits in flight (lock held)."""
        return sum(self._reserved.values())

    def reserve(self, key: Any, limit: int) -> None:
        """``key`` was dispatched with ``limit`` (lock held)."""
        self._reserved[key] = limit

    def release(self, key: Any) -> None:
        """``key`` is done: its reservation and its watch end (lock held)."""
        self._reserved.pop(key, None)
        self._watched.pop(key, None)

    def watch(self, key: Any, pid: int, limit: int, *, fork_anon: int | None = None) -> None:
        """``key`` started in the group of ``pid``: sample it from now on (lock held).
        ``fork_anon``: ``pid`` is a fork-path child, forked when the caller held that much
        anonymous memory (:func:`anon_bytes` just before the fork)."""
        entry = _Watched(key, pid, limit, fork_anon)
        self._watched[key] = entry
        if fork_anon is None:
            self._to_measure.append(entry)  # sampled once it is known
        self.pending = True

    def wait_for_memory(self, scheduler: Any, waiting: bool) -> None:
        """Mark ``scheduler`` as waiting for memory (its queue head did not fit) or not (lock
        held)."""
        if waiting:
            self._waiting.add(scheduler)
            self.pending = True
        else:
            self._waiting.discard(scheduler)

    def charge(self, key: Any) -> int:
        """The latest charge sampled for ``key`` (0 if none yet; lock held)."""
        watched = self._watched.get(key)
        return watched.last if watched is not None else 0

    # -- with the hub's lock released ---------------------------------------------------------

    def start_pending(self) -> None:
        """Start what :meth:`watch` and :meth:`wait_for_memory` asked for: the reads of the new
        tasks' shared pages (jobs) and the watcher thread. Called with the hub's lock released
        (:meth:`Hub.run`, and after the hub's own blocks that watch a task): a thread started
        under it waits for the new thread while holding it, and a garbage collection in the new
        thread's start that runs a finalizer needing the lock would never end (docs/design.md,
        "Threads: who owns what")."""
        if not self.pending:
            return  # whoever sets it calls this once it has released the lock
        with self._lock:
            self.pending = False
            measure, self._to_measure = self._to_measure, []
            thread = None
            current = self._thread
            # A thread created but not started yet has no ident; one that died (an error in a
            # sample) is replaced.
            dead = current is not None and current.ident is not None and not current.is_alive()
            if (self._watched or self._waiting) and (current is None or dead):
                thread = self._thread = threading.Thread(
                    target=self._loop, name="precompile-memory", daemon=True
                )
        for entry in measure:
            self._submit(self._measure_shared, entry)
        if thread is not None:
            try:
                thread.start()
            except RuntimeError:  # the interpreter is exiting: no more threads
                with self._lock:
                    if self._thread is thread:
                        self._thread = None

    # -- the watcher thread ------------------------------------------------------------------

    def _loop(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self._lock:
                watched = list(self._watched.values())
                waiting = list(self._waiting)
                if watched or waiting:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > THREAD_IDLE_S:
                    self._thread = None
                    return
            round_start = time.monotonic()
            for entry in watched:
                self._sample(entry)
            for scheduler in waiting:
                self._repump(scheduler)
            time.sleep(max(0.0, SAMPLE_INTERVAL_S - (time.monotonic() - round_start)))

    @staticmethod
    def _measure_shared(entry: _Watched) -> None:
        """What the worker shares when its task starts (a job thread: milliseconds)."""
        entry.shared = shared_bytes(entry.pid)

    def _sample(self, entry: _Watched) -> None:
        if entry.fork_anon is not None:
            members = group_members(entry.pid)
            leader = anon_bytes(entry.pid) - entry.fork_anon
            charge = max(0, leader + sum(rss_bytes(m) for m in members[1:]))
        else:
            shared = entry.shared
            if shared is None:
                return  # its baseline is being read (a job); until then nothing is known
            charge = max(0, group_rss(entry.pid) - shared)
        entry.last = charge
        entry.peak = max(entry.peak, charge)
        if charge > entry.limit:
            with self._lock:
                current = self._watched.get(entry.key)
                if current is not entry:
                    return  # done meanwhile
                del self._watched[entry.key]
            self._on_exceeded(entry.key, entry.pid, entry.peak)
