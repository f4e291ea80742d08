"""Scheduling decisions as pure functions: no locks, no processes, no clocks.

The scheduler (:mod:`._scheduling`) calls these with plain numbers and keys taken under its lock
and acts on what they return, so every rule here is unit-tested without starting a process
(tests/test_scheduler.py).

Rules:
* capacity is counted in tasks in flight (sent, started, or being forked), both paths together,
  never in processes: a fork joins the process table only after ``fork()`` returns;
* among queued tasks the smallest sort key goes first (higher priority, then the longest
  predicted, then older: ``Task.sort_key``); a spawn task waits while no spawn worker is idle,
  and a fork task may pass it meanwhile;
* workers start only for spawn tasks that no idle or starting worker will take, and never
  beyond ``max_workers`` spawn workers;
* pinned workers are spread over devices: new ones go to the device with the fewest, tasks to
  an idle worker on the device with the fewest busy ones;
* a task with a memory limit starts only while what the running limited tasks may still take,
  plus its own limit, fits in the available memory (always when none runs);
* with no worker idle, the head may be sent *ahead* to a busy worker whose task is predicted to
  take at most ``AHEAD_BELOW_S`` in all: the one predicted to end first; more than one task
  waits ahead of a worker only while they and its task are predicted to take at most
  ``AHEAD_BATCH_S`` together (docs/design.md, "Sending ahead").
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Literal, TypeVar

K = TypeVar("K")
D = TypeVar("D", bound=Hashable)


def free_slots(max_workers: int, in_flight: int) -> int:
    """How many more tasks may be dispatched now."""
    return max(0, max_workers - in_flight)


def next_path(
    spawn_key: K | None, fork_key: K | None, spawn_worker_idle: bool
) -> Literal["spawn", "fork"] | None:
    """Which queue's head to dispatch next, or ``None`` to dispatch nothing.

    Args:
        spawn_key: sort key of the spawn queue's head (``None``: empty).
        fork_key: sort key of the fork queue's head (``None``: empty).
        spawn_worker_idle: whether an idle spawn worker can take the spawn head now.
    """
    spawn_ok = spawn_key is not None and spawn_worker_idle
    if spawn_ok and fork_key is not None:
        return "spawn" if spawn_key < fork_key else "fork"  # type: ignore[operator]
    if spawn_ok:
        return "spawn"
    return "fork" if fork_key is not None else None


AHEAD_BELOW_S = 0.25
"""The longest predicted task a worker may hold another one behind. The gain of sending ahead is
the time this process takes to answer a ``Done`` with the next ``Run``: well under a millisecond
when it is quiet, tens of milliseconds while another thread holds the GIL (a compile or a
benchmark in the caller: ``benchmarks/gil_probe.py``) — a large share of a short task, little of
a long one. Its risk is the task ahead waiting behind one that turns out long; bounded by this,
a prediction that is wrong by a few times costs a fraction of a second."""


AHEAD_BATCH_S = 0.002
"""The most a worker's task and every task ahead of it may be predicted to take together for
one more to go ahead (up to :data:`AHEAD_MAX_TASKS`): tasks this short take less than the
caller's monitor thread spends answering a ``Done``, so a worker that waits for each next
``Run`` idles most of the time, and the tasks decided in one monitor round reach it in one
write (docs/design.md, "Per-task overhead"). A task waits behind the others for at most this
long (if the predictions hold), so ``cancel()`` is refused only for tasks about to start."""

AHEAD_MAX_TASKS = 8
"""The most tasks ahead of one worker's task (see :data:`AHEAD_BATCH_S`)."""


def ahead_of(
    predicted_s: Sequence[float],
    remaining_s: Sequence[float],
    ahead_s: Sequence[float] | None = None,
    ahead_n: Sequence[int] | None = None,
    head_s: float = 0.0,
) -> int | None:
    """Index of the busy worker to send the queue's head to ahead of need, or ``None``.

    A worker with no task ahead takes one behind a task predicted at most ``AHEAD_BELOW_S``; one
    with tasks ahead takes another only while its task, those ahead and the head are all
    predicted (none unknown) to take at most ``AHEAD_BATCH_S`` together, and fewer than
    ``AHEAD_MAX_TASKS`` wait. Among those allowed: the one predicted to be free first.

    Args:
        predicted_s: each candidate worker's task, its predicted whole duration (0: unknown).
        remaining_s: what is predicted to remain of it now (may be negative: overdue).
        ahead_s: the predicted durations of the tasks already ahead of it, summed (``inf``: one
            is unknown); ``None``: none anywhere.
        ahead_n: how many tasks are already ahead of it; ``None``: none anywhere.
        head_s: the queue's head, its predicted duration (0: unknown).
    """
    best: int | None = None
    best_at = 0.0
    for i, (whole, left) in enumerate(zip(predicted_s, remaining_s, strict=True)):
        n = ahead_n[i] if ahead_n is not None else 0
        queued = ahead_s[i] if ahead_s is not None else 0.0
        if n == 0:
            allowed = 0 < whole <= AHEAD_BELOW_S
        else:
            allowed = (
                n < AHEAD_MAX_TASKS
                and whole > 0
                and head_s > 0
                and whole + queued + head_s <= AHEAD_BATCH_S
            )
        free_at = left + queued
        if allowed and (best is None or free_at < best_at):
            best, best_at = i, free_at
    return best


def workers_to_start(
    *, waiting: int, idle: int, starting: int, spawn_workers: int, in_flight: int, max_workers: int
) -> int:
    """How many spawn workers to start for ``waiting`` queued spawn tasks.

    Args:
        waiting: queued spawn tasks.
        idle: idle spawn workers of this executor.
        starting: its spawn workers still starting.
        spawn_workers: all its live spawn workers (starting, idle, busy).
        in_flight: its tasks in flight, both paths.
        max_workers: its cap.
    """
    want = min(waiting, free_slots(max_workers, in_flight)) - idle - starting
    room = max_workers - spawn_workers
    return max(0, min(want, room))


def least_loaded(devices: Sequence[D], load: Mapping[D, int]) -> D:
    """The device with the smallest load; ties go to the earliest in ``devices``."""
    return min(devices, key=lambda d: load.get(d, 0))


def pick_idle(idle_devices: Sequence[D], busy: Mapping[D, int]) -> int:
    """Index of the idle worker to use: the last one (warmest), or with devices pinned, one on
    the device with the fewest busy workers.

    Args:
        idle_devices: the device of each idle worker, in the order they became idle.
        busy: busy workers per device.
    """
    if not idle_devices:
        raise ValueError("no idle worker to pick")
    best = len(idle_devices) - 1
    for i in range(len(idle_devices) - 1, -1, -1):
        if busy.get(idle_devices[i], 0) < busy.get(idle_devices[best], 0):
            best = i
    return best


def fits_in_memory(limit: int, running: Sequence[tuple[int, int]], available: int) -> bool:
    """Whether a task with a memory limit of ``limit`` bytes may start now.

    The tasks with limits already running may each still grow to its limit: what they may yet
    take, Σ (limit − held now), plus ``limit`` must fit in ``available`` (the machine's free
    memory, which already excludes what they hold). With none running, the task starts whatever
    it asks, so a batch never stalls on a limit larger than the free memory: it runs one at a
    time.

    Args:
        limit: the new task's limit in bytes.
        running: ``(limit, held)`` in bytes of each running task with a limit.
        available: bytes the machine has available now.
    """
    if not running:
        return True
    may_take = sum(max(0, lim - held) for lim, held in running)
    return may_take + limit <= available
