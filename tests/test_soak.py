"""A seeded, randomized interleaving soak: submits, cancels, idle expiry, kills and shutdown at once.

Each task leaves marker files (see ``interleave_helpers.marked_task``), so after the run the test
knows which tasks started, where, and when. It runs in epochs (one executor each, with random
settings) of rounds; between rounds, when every future of the round is resolved, it SIGKILLs
idle workers and at once lets the submitter threads go, so a task of the next round that fails
with ``WorkerCrashedError`` without a start marker never started: a violation. During a round it
SIGKILLs only workers whose task has started and not ended. An epoch ends with ``shutdown`` from
another thread while the submitters still run.

Replay a failure with ``PE_SOAK_SEED=<seed>`` (printed, and named in the failure message);
``PE_SOAK_SECONDS`` sets the length (default 150 s).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import itertools
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import interleave_helpers as helpers
import pytest

from precompile_executor import (
    KILL_GRACE_S,
    PrecompileExecutor,
    TaskTimeoutError,
    WorkerCrashedError,
    stop_idle_workers,
)

SUBMITTERS = 3
RESOLVE_TIMEOUT_S = 60.0
DEADLINE_SLACK_S = 0.5 + KILL_GRACE_S


@dataclasses.dataclass(eq=False)
class _Record:
    tid: int
    epoch: int
    round: int
    kind: str  # "short", "long", "hang" (with a timeout), "fork"
    duration: float
    timeout: float | None
    future: cf.Future[int] | None = None
    cancelled_by_us: bool = False
    done_calls: int = 0
    done_at: float | None = None


@dataclasses.dataclass(frozen=True)
class _Start:
    pid: int
    at: float | None  # None: the marker exists but the task died before writing it


class _Soak:
    def __init__(self, seed: int, marker_dir: Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.dir = marker_dir
        self.lock = threading.Lock()
        self.records: list[_Record] = []
        self.ids = itertools.count(1)
        self.violations: list[str] = []
        self.busy_kills: dict[int, int] = {}  # tid -> pid killed while that task ran
        self.killed_at: dict[int, float] = {}  # tid -> just after its busy kill was sent
        self.ambiguous_pids: set[int] = set()  # a busy kill whose task ended around the kill
        self.epoch_workers: dict[int, int] = {}

    # -- markers ----------------------------------------------------------------------------------

    def start_of(self, tid: int) -> _Start | None:
        try:
            words = (self.dir / f"{tid}.start").read_text().split()
        except FileNotFoundError:
            return None
        if len(words) < 2:
            return _Start(0, None)
        return _Start(int(words[0]), float(words[1]))

    def end_of(self, tid: int) -> float | None:
        for suffix in (".end", ".beat"):  # a killed task: its last heartbeat
            try:
                text = (self.dir / f"{tid}{suffix}").read_text().strip()
            except FileNotFoundError:
                continue
            if text:
                return float(text)
        return None

    # -- submitting -------------------------------------------------------------------------------

    def _on_done(self, record: _Record, _future: cf.Future[int]) -> None:
        now = time.monotonic()
        with self.lock:
            record.done_calls += 1
            if record.done_at is None:
                record.done_at = now

    def submit_one(
        self, executor: PrecompileExecutor, rng: random.Random, epoch: int, round_: int
    ) -> None:
        """Submit one random task; lets ``RuntimeError`` (after shutdown) through."""
        roll = rng.random()
        timeout: float | None = None
        target = executor
        if roll < 0.08:
            kind, duration = "hang", 100.0
            timeout = round(rng.uniform(0.3, 0.8), 2)
            target = executor.options(timeout=timeout)
        elif roll < 0.18:
            kind, duration = "long", rng.uniform(0.5, 1.0)
            target = executor.options(timeout=60)
        elif roll < 0.24:
            kind, duration = "fork", rng.uniform(0.0, 0.1)
            target = executor.options(path="fork")
        else:
            kind, duration = "short", rng.uniform(0.0, 0.15)
            if rng.random() < 0.5:
                target = executor.options(priority=rng.uniform(-1, 1))
        with self.lock:
            record = _Record(next(self.ids), epoch, round_, kind, duration, timeout)
        future = target.submit(helpers.marked_task, str(self.dir), record.tid, duration)
        record.future = future
        with self.lock:
            self.records.append(record)
        future.add_done_callback(functools.partial(self._on_done, record))
        if rng.random() < 0.1:
            record.cancelled_by_us = future.cancel()

    # -- killing ----------------------------------------------------------------------------------

    def kill_idle(self, executor: PrecompileExecutor) -> None:
        """All futures are resolved: every worker is idle. Kill some of them."""
        pids = executor.warm_up(timeout=60)
        choice = self.rng.random()
        victims = pids if choice < 0.15 else [self.rng.choice(pids)] if choice < 0.6 else []
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # its idle timeout stopped it first

    def kill_busy(self, round_records: list[_Record], until: float) -> None:
        """Kill the worker of one task of this round that has started and not ended."""
        while time.monotonic() < until:
            with self.lock:
                candidates = [r for r in round_records if r.kind in ("long", "hang")]
            for record in candidates:
                start = self.start_of(record.tid)
                if start is None or start.at is None or record.tid in self.busy_kills:
                    continue
                if (self.dir / f"{record.tid}.end").exists():
                    continue
                if time.monotonic() - start.at > 0.25:
                    continue  # may be about to end (or be timed out): keep the kill unambiguous
                try:
                    os.kill(start.pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.busy_kills[record.tid] = start.pid
                self.killed_at[record.tid] = time.monotonic()
                if (self.dir / f"{record.tid}.end").exists():
                    self.ambiguous_pids.add(start.pid)  # it ended just before the kill
                return
            time.sleep(0.01)

    # -- running ----------------------------------------------------------------------------------

    def wait_resolved(self, records: list[_Record], what: str) -> bool:
        # Not cf.wait(): it counts a future cancelled with cancel() as done only once the
        # executor has also called set_running_or_notify_cancel() on it.
        futures = [r.future for r in records if r.future is not None]
        deadline = time.monotonic() + RESOLVE_TIMEOUT_S
        while True:
            not_done = {f for f in futures if not f.done()}
            if not not_done or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if not_done:
            stuck = [r for r in records if r.future in not_done]
            self.violations.append(
                f"{what}: {len(stuck)} futures unresolved after {RESOLVE_TIMEOUT_S:g}s: "
                + ", ".join(
                    f"task {r.tid} ({r.kind}, started: {self.start_of(r.tid) is not None}, "
                    f"{r.future!r})"
                    for r in stuck[:8]
                )
            )
            return False
        return True

    def run_round(self, executor: PrecompileExecutor, epoch: int, round_: int) -> bool:
        try:
            self.kill_idle(executor)
        except Exception as exc:  # noqa: BLE001 - report it with the seed, like the rest
            self.violations.append(f"epoch {epoch} round {round_}: warm_up() raised {exc!r}")
            return False
        barrier = threading.Barrier(SUBMITTERS + 1)
        before = len(self.records)
        errors: list[str] = []

        def submitter(seed: int) -> None:
            rng = random.Random(seed)
            barrier.wait(timeout=30)
            for _ in range(rng.randint(2, 5)):
                try:
                    self.submit_one(executor, rng, epoch, round_)
                except RuntimeError as exc:
                    errors.append(f"epoch {epoch} round {round_}: submit raised {exc!r}")
                    return

        threads = [
            threading.Thread(target=submitter, args=(self.rng.randrange(1 << 30),))
            for _ in range(SUBMITTERS)
        ]
        for t in threads:
            t.start()
        barrier.wait(timeout=30)  # right after the idle kills
        if self.rng.random() < 0.4:
            time.sleep(0.05)
            with self.lock:
                mine = self.records[before:]
            self.kill_busy(mine, until=time.monotonic() + 1.0)
        for t in threads:
            t.join(timeout=60)
        self.violations += errors
        with self.lock:
            mine = self.records[before:]
        return self.wait_resolved(mine, f"epoch {epoch} round {round_}")

    def run_final(self, executor: PrecompileExecutor, epoch: int) -> bool:
        before = len(self.records)
        stop = threading.Event()
        wait = self.rng.random() < 0.5
        cancel = self.rng.random() < 0.5
        delay = self.rng.uniform(0.1, 0.6)
        shutdown_done = threading.Event()

        def submitter(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                try:
                    self.submit_one(executor, rng, epoch, -1)
                except RuntimeError:
                    return  # shut down: fine
                time.sleep(rng.uniform(0.0, 0.05))

        def shutter() -> None:
            time.sleep(delay)
            executor.shutdown(wait=wait, cancel_futures=cancel)
            shutdown_done.set()

        threads = [
            threading.Thread(target=submitter, args=(self.rng.randrange(1 << 30),))
            for _ in range(SUBMITTERS)
        ]
        closer = threading.Thread(target=shutter)
        for t in [*threads, closer]:
            t.start()
        closer.join(timeout=120)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        if not shutdown_done.is_set():
            self.violations.append(
                f"epoch {epoch}: shutdown(wait={wait}, cancel_futures={cancel}) from another "
                "thread did not return within 120 s"
            )
            return False
        with self.lock:
            mine = self.records[before:]
        ok = self.wait_resolved(mine, f"epoch {epoch} after shutdown(wait={wait}, cancel={cancel})")
        deadline = time.monotonic() + 5
        while True:
            stats = executor.statistics()
            if (stats.running, stats.queued) == (0, 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if (stats.running, stats.queued) != (0, 0):
            self.violations.append(f"epoch {epoch}: every future resolved, yet {stats}")
        return ok

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        for epoch in itertools.count():
            if time.monotonic() > end:
                return
            max_workers = self.rng.choice([2, 3])
            idle_timeout = self.rng.choice([0.03, 0.06, 10.0])
            self.epoch_workers[epoch] = max_workers
            print(f"epoch {epoch}: max_workers={max_workers} idle_timeout={idle_timeout}")
            executor = PrecompileExecutor(max_workers, idle_timeout=idle_timeout)
            ok = True
            for round_ in range(self.rng.randint(4, 8)):
                ok = self.run_round(executor, epoch, round_)
                if not ok or time.monotonic() > end:
                    break
            ok = ok and self.run_final(executor, epoch)
            if not ok:  # a stuck future: stop here, the rest would only repeat it
                executor.kill_workers()
                return
            executor.shutdown(wait=False)

    # -- checking ---------------------------------------------------------------------------------

    def check(self) -> None:
        doubles = sorted(p.name for p in self.dir.glob("*.double"))
        for name in doubles:
            self.violations.append(f"task {name.split('.')[0]} ran twice")
        spans: dict[int, list[tuple[float, float, int]]] = {}
        for r in self.records:
            assert r.future is not None
            label = f"task {r.tid} ({r.kind}, epoch {r.epoch} round {r.round})"
            start = self.start_of(r.tid)
            if r.future.done() and r.done_calls != 1:
                self.violations.append(f"{label}: done-callbacks ran {r.done_calls} times")
            if not r.future.done():
                continue  # reported by wait_resolved
            if r.future.cancelled():
                if start is not None:
                    self.violations.append(f"{label}: cancelled, yet it started")
                continue
            error = r.future.exception()
            if start is not None and start.at is not None:
                # Killed before its first heartbeat: it ran until the kill at the latest.
                end = self.end_of(r.tid) or self.killed_at.get(r.tid) or start.at
                spans.setdefault(r.epoch, []).append((start.at, end, r.tid))
            if error is None:
                if r.future.result() != r.tid:
                    self.violations.append(f"{label}: returned {r.future.result()!r}")
                continue
            if isinstance(error, WorkerCrashedError):
                if start is None and error.worker_pid not in self.ambiguous_pids:
                    self.violations.append(
                        f"{label}: never started (no start marker), yet failed as crashed: {error}"
                    )
                continue
            if isinstance(error, TaskTimeoutError) and r.kind == "hang":
                assert r.timeout is not None and r.done_at is not None
                if start is not None and start.at is not None:
                    late = r.done_at - start.at
                    if late > r.timeout + DEADLINE_SLACK_S:
                        self.violations.append(
                            f"{label}: timeout {r.timeout}s reported {late:.2f}s after its start "
                            f"(allowed: {r.timeout + DEADLINE_SLACK_S:.2f}s)"
                        )
                continue
            self.violations.append(f"{label}: unexpected {type(error).__name__}: {error}")
        for epoch, epoch_spans in spans.items():
            peak, at = _peak_overlap(epoch_spans)
            if peak > self.epoch_workers[epoch]:
                self.violations.append(
                    f"epoch {epoch}: {peak} tasks ran at once with max_workers="
                    f"{self.epoch_workers[epoch]}: tasks {at}"
                )


def _peak_overlap(spans: list[tuple[float, float, int]]) -> tuple[int, list[int]]:
    """The most spans that overlap, and their tasks. At one instant, spans that end there end
    before those that start there (back to back is one slot); a span of zero length (a task
    killed before its first heartbeat) starts and then ends at its instant."""
    events: list[tuple[float, int, int]] = []  # (time, order at that time, tid); order 1: start
    for start, end, tid in spans:
        events.append((start, 1, tid))
        events.append((end, 0, tid) if end > start else (start, 2, tid))
    events.sort()
    running: set[int] = set()
    peak, at = 0, []
    for _, order, tid in events:
        if order == 1:
            running.add(tid)
        else:
            running.discard(tid)
        if len(running) > peak:
            peak, at = len(running), sorted(running)
    return peak, at


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_randomized_interleavings_keep_every_invariant(tmp_path: Path) -> None:
    seed = int(os.environ.get("PE_SOAK_SEED") or random.SystemRandom().randrange(1 << 32))
    seconds = float(os.environ.get("PE_SOAK_SECONDS", "150"))
    print(f"soak seed {seed} (replay: PE_SOAK_SEED={seed}), {seconds:g} s")
    soak = _Soak(seed, tmp_path)
    stop_idle_workers()
    try:
        soak.run(seconds)
    finally:
        stop_idle_workers()
    soak.check()
    summary = _summary(soak.records)
    print(f"soak: {summary}, busy kills {len(soak.busy_kills)}")
    assert not soak.violations, (
        f"soak seed {seed} (replay: PE_SOAK_SEED={seed}); {summary}; "
        f"{len(soak.violations)} violations:\n" + "\n".join(soak.violations[:40])
    )


def test_peak_overlap_counts_a_task_killed_before_its_first_beat_only_while_it_ran() -> None:
    """A task killed before it wrote a heartbeat has a span of zero length when nothing better
    is known: it must not count as running for the rest of the epoch."""
    spans = [(1.0, 1.0, 38), (1.1, 1.2, 36), (1.15, 1.3, 41)]
    assert _peak_overlap(spans) == (2, [36, 41])
    assert _peak_overlap([(1.0, 2.0, 1), (2.0, 3.0, 2)]) == (1, [1])  # back to back: one slot
    assert _peak_overlap([(1.0, 2.0, 1), (1.5, 1.5, 2), (1.2, 1.8, 3)]) == (3, [1, 2, 3])


def _summary(records: list[_Record]) -> str:
    counts: dict[str, int] = {}
    for r in records:
        f: Any = r.future
        outcome = (
            "pending"
            if not f.done()
            else "cancelled"
            if f.cancelled()
            else type(f.exception()).__name__
            if f.exception()
            else "ok"
        )
        counts[outcome] = counts.get(outcome, 0) + 1
    return f"{len(records)} tasks: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
