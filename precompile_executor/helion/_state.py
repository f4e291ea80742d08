"""Everything the Helion integration keeps for the whole process, in one object: :data:`STATE`.

* **Which executor** — :attr:`HelionState.scope`, a :class:`~precompile_executor._scope.Scope`
  holding the open ``use()`` blocks and the ``install()`` installation, under the scope rule
  (``docs/helion.md``, "Which executor: the scope rule"). The seam (:mod:`._seam`, above this
  module) connects its patch and its restore (:meth:`HelionState.connect`): Helion's methods are
  replaced when the first holder arrives and put back when the last leaves; the replaced
  originals stay in :attr:`HelionState.originals`.
* **The default executor** (:mod:`._warm`): the executor ``use()``/``install()`` build when
  given none, its background warm-up thread, the GPU it was pinned to before Helion was imported,
  the caller's Triton warm-up threads and the warm-up's timestamps.
* **Helion's benchmark worker** (:mod:`._bench_worker`): the spare waiting for a provider, and
  the guardian process that SIGKILLs every benchmark worker's process group if this process dies
  (the same :class:`~precompile_executor._process.Guardian` as the executor's workers'; one of
  the integration's own, since a spare starts before any executor and may outlive it).
* **Counts** (:meth:`HelionState.statistics`): configs measured in the autotuning process while
  Helion's benchmark subprocess was starting (:mod:`._while_starting`).

:meth:`HelionState.reset` is the documented way (for tests) to put all of it back as if the
integration had never been used.

Lock order: the scope's lock, then :attr:`HelionState.lock`; nothing that holds ``lock`` asks
the scope (``Scope.current``, ``active``), so a deactivation (run under the scope's lock, which
takes ``lock`` to doom the spare) cannot deadlock with a reader of the spare.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._process import Guardian
from .._scope import OFF, Scope

if TYPE_CHECKING:
    from .. import PrecompileExecutor


RESET_JOIN_S = 30.0
"""Longest :meth:`HelionState.reset` waits for each warm-up thread (a warm-up ends once its
executor is stopped; a caller's warm-up computes one cache key, 0.3–0.5 s)."""


@dataclasses.dataclass(frozen=True)
class HelionStatistics:
    """What the Helion integration counted in this process (:meth:`HelionState.statistics`).

    Attributes:
        measured_while_starting: configs measured in the autotuning process, by Helion's
            in-process path, while Helion's benchmark subprocess was still starting
            (docs/helion.md, "Measured here while the benchmark subprocess starts").
        autotunes_measured_while_starting: autotunes that measured at least one config so.
    """

    measured_while_starting: int = 0
    autotunes_measured_while_starting: int = 0


@dataclasses.dataclass(frozen=True)
class Originals:
    """Helion's attributes as found before the seam replaced them (the objects themselves: the
    ``staticmethod`` wrappers of ``PrecompileFuture.create``/``wait_for_all``, and
    ``BaseSearch._prepare``)."""

    create: Any
    wait_for_all: Any
    prepare: Any


class HelionState:
    """The integration's process-wide state (see the module docstring); one instance,
    :data:`STATE`.

    Attributes:
        scope: the open ``use()`` blocks and the installation; ``None`` as a block's executor
            means the default executor.
        lock: guards every attribute below (never held while asking the scope).
        originals: what the seam replaced, kept after it is put back (``None``: never patched).
        default: the default executor, once built.
        warming: the default executor's background warm-up thread, once started.
        early_device: the GPU the default executor was pinned to when it was built before
            Helion was imported (``"3"``); ``None`` otherwise.
        caller_warms: the caller's Triton warm-up thread of each target (``"cuda:90"``).
        times: ``time.monotonic()`` of the warm-up's start and end, and of an early build.
        spare: the benchmark worker started ahead, waiting for a provider.
        arriving: ``use()``/``install()`` calls between their start and their holding the
            scope: a spare they may have started is not doomed by a concurrent last exit.
        doomed: spares the last holder's exit took away, to be killed outside the locks.
        guardian: kills every benchmark worker's process group if this process dies.
        counts: what :meth:`statistics` reports.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.scope = Scope("helion", activate=self._activate, deactivate=self._deactivate)
        self._patch: Callable[[], Originals] | None = None
        self._restore: Callable[[Originals], None] | None = None
        self.originals: Originals | None = None
        self.default: PrecompileExecutor | None = None
        self.warming: threading.Thread | None = None
        self.early_device: str | None = None
        self.caller_warms: dict[str, threading.Thread] = {}
        self.times: dict[str, float] = {}
        # _bench_worker.EarlyWorker, which sits above this module (imports go one way)
        self.spare: Any = None
        self.arriving = 0
        self.doomed: list[Any] = []
        self.guardian = Guardian()
        self.counts = HelionStatistics()

    def connect(self, patch: Callable[[], Originals], restore: Callable[[Originals], None]) -> None:
        """Called once by the seam at its import: how to patch Helion and put it back."""
        self._patch, self._restore = patch, restore

    # -- the scope's activation --------------------------------------------------------------

    def _activate(self) -> None:
        assert self._patch is not None, "precompile_executor.helion._seam is not imported"
        self.originals = self._patch()

    def _deactivate(self) -> None:
        if self._restore is not None and self.originals is not None:
            self._restore(self.originals)
        # The last holder left: a spare nobody took has no autotune to serve. Killed by the
        # leaving thread after the scope's lock is released (discard_doomed), not under it.
        with self.lock:
            if self.spare is not None and self.arriving == 0:
                self.doomed.append(self.spare)
                self.spare = None

    # -- reading it --------------------------------------------------------------------------

    def executor(self) -> Any:
        """The scope's executor for an autotune starting now in this context: an executor,
        ``None`` (the default executor) or :data:`~precompile_executor._scope.OFF`."""
        return self.scope.current()

    def active(self) -> bool:
        """Whether a ``use()`` block or an installation is open (Helion is patched)."""
        return self.scope.active()

    def helion_wait_for_all(self) -> Any:
        """Helion's own ``PrecompileFuture.wait_for_all`` (the function)."""
        if self.originals is None:
            from helion.autotuner.precompile_future import PrecompileFuture

            return PrecompileFuture.wait_for_all
        return self.originals.wait_for_all.__func__

    def discard_doomed(self) -> None:
        """Kill the spares a last exit doomed (outside every lock: a kill waits for the process)."""
        with self.lock:
            doomed, self.doomed = self.doomed, []
        for spare in doomed:
            spare.discard()

    def statistics(self) -> HelionStatistics:
        """A snapshot of the integration's counts in this process."""
        with self.lock:
            return self.counts

    def count_measured_while_starting(self, *, first: bool) -> None:
        """One config measured in the autotuning process while the benchmark subprocess
        started; ``first``: the first of its autotune."""
        with self.lock:
            counts = self.counts
            self.counts = dataclasses.replace(
                counts,
                measured_while_starting=counts.measured_while_starting + 1,
                autotunes_measured_while_starting=counts.autotunes_measured_while_starting + first,
            )

    # -- for tests ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Put the process back as if the integration had never been used (for tests).

        In this order, it:

        1. closes every ``use()`` block and the installation (their owners' later exits do
           nothing) and puts Helion's methods back;
        2. kills the spare benchmark worker, if any (its process group), and waits for its
           warm-up round trip to end;
        3. shuts the default executor down and stops its workers and its warm template
           (``terminate_workers()``), so none is left warm in the process's pool;
        4. waits (at most :data:`RESET_JOIN_S` each) for the default executor's background
           warm-up, which that stop ends, and the caller's Triton warm-up threads (one cache
           key each);
        5. stops the guardian: it SIGKILLs what is still registered (a benchmark worker a
           provider still holds) and exits; the next benchmark worker starts a new one;
        6. forgets all of it: the default executor, the early device, the warm-up threads and
           times, the counts. Module flags (``STARTS_EARLY``, ``WARMS_CALLER``) are left as
           they are.
        """
        self.scope.reset()
        with self.lock:
            spares = [s for s in (self.spare, *self.doomed) if s is not None]
            self.spare, self.doomed, self.arriving = None, [], 0
            default, warming = self.default, self.warming
            callers = list(self.caller_warms.values())
            self.default = self.warming = self.early_device = None
            self.caller_warms = {}
            self.times = {}
            self.counts = HelionStatistics()
        for spare in spares:
            spare.discard()
        if default is not None:
            default.shutdown(wait=True, cancel_futures=True)
            default.terminate_workers()
        for thread in (warming, *callers):
            if thread is not None:
                thread.join(RESET_JOIN_S)
        self.guardian.stop()

    def after_fork_in_child(self) -> None:
        """A forked child (a data-loader worker, a fork-path compile child) does not own the
        parent's spare (multiprocessing refuses to even test a process that is not its child)
        nor its guardian; a lock another thread held at the fork would never be released."""
        self.lock = threading.RLock()
        self.spare, self.doomed, self.arriving = None, [], 0
        self.guardian = Guardian()


STATE = HelionState()
"""The Helion integration's process-wide state (``precompile_executor.helion.state``)."""

os.register_at_fork(after_in_child=STATE.after_fork_in_child)

__all__ = ["OFF", "STATE", "HelionState", "HelionStatistics", "Originals"]
