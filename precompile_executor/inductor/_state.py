"""Everything the Inductor integration keeps for the whole process, in one object: :data:`STATE`.

* **Which executor** Inductor's compiles use — :attr:`InductorState.scope`, a
  :class:`~precompile_executor._scope.Scope` holding the open ``use()`` blocks and the
  ``install()`` installation, under the rule of every integration (``_scope.py``). The seam
  (:mod:`._seam`, above this module) connects its patch and its restore
  (:meth:`InductorState.connect`): Inductor's attributes are replaced when the first holder
  arrives and put back when the last leaves; what they held meanwhile is in
  :attr:`InductorState.saved`.
* **The default executor** (:mod:`._default`): the executor ``use()``/``install()`` build when
  given none, and its background warm-up thread.
* **The compile counts** (:data:`._compiles.COUNTS`): how many compiles of each kind ran on an
  executor, and in the caller while it was not ready, what
  :func:`~precompile_executor.inductor.statistics` reports.
* **The readiness probes** (:data:`._compiles.READINESS`): each executor's answer to Inductor's
  readiness probe, which gates its compiles as stock gates its own pool.

:meth:`InductorState.reset` is the documented way (for tests) to put all of it back as if the
integration had never been used.

Lock order: the scope's lock, then :attr:`InductorState.lock`; nothing that holds ``lock`` asks
the scope.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .._scope import OFF, Scope
from ._compiles import COUNTS, ORDERING, READINESS, Counts, Readiness

if TYPE_CHECKING:
    from .. import PrecompileExecutor

RESET_JOIN_S = 30.0
"""Longest :meth:`InductorState.reset` waits for the default executor's warm-up thread (its
``warm_up()`` ends once the executor is stopped)."""


class InductorState:
    """The integration's process-wide state (see the module docstring); one instance,
    :data:`STATE`, exported as ``precompile_executor.inductor.state``.

    Attributes:
        scope: the open ``use()`` blocks and the installation; ``None`` as a block's executor
            means the default executor.
        saved: ``(class, attribute, what was in its __dict__)`` for every attribute the seam
            replaced, while it is patched (empty otherwise).
        counts: the compiles sent to an executor, per kind, those that failed, and those run
            in the caller while the executor was not ready.
        readiness: each executor's readiness probe.
        lock: guards :attr:`default` and :attr:`warming` (never held while asking the scope).
        default: the default executor, once built.
        warming: the default executor's background warm-up thread, once started.
    """

    def __init__(self) -> None:
        self.scope = Scope("inductor", connected_by="precompile_executor.inductor._seam")
        self.saved: list[tuple[type, str, Any]] = []
        self.counts: Counts = COUNTS
        self.readiness: Readiness = READINESS
        self.lock = threading.Lock()
        self.default: PrecompileExecutor | None = None
        self.warming: threading.Thread | None = None

    @property
    def in_submission_order(self) -> bool:
        """Whether Inductor's compiles start in the order Inductor sent them (the default, as in
        Inductor's own pool), each just below the executor's own priority; ``False``: in the
        executor's own order (priority, then the longest predicted). See
        ``docs/inductor.md``, "Order of the compiles"."""
        return ORDERING.in_submission_order

    @in_submission_order.setter
    def in_submission_order(self, value: bool) -> None:
        ORDERING.in_submission_order = value

    def executor(self) -> Any:
        """The scope's executor for a compile starting now in this context: an executor,
        ``None`` (the default executor) or :data:`~precompile_executor._scope.OFF`."""
        return self.scope.current()

    def reset(self) -> None:
        """Put the process back as if the integration had never been used (for tests).

        In this order, it:

        1. closes every ``use()`` block and the installation (their owners' later exits do
           nothing) and puts Inductor's attributes back;
        2. stops the default executor, if one was built: ``terminate_workers()`` shuts it down,
           cancels its queued compiles and stops its workers (a running compile gets SIGTERM,
           then SIGKILL after a grace) and its warm template, so none is left warm in the
           process's pool; then ``shutdown(wait=True)``, which that stop has made short;
        3. waits (at most :data:`RESET_JOIN_S`) for the default executor's background warm-up
           thread, which that stop ends;
        4. forgets the default executor and its warm-up thread (the next ``use()`` builds a new
           one) and every readiness probe, sets the compile counts back to zero and
           :attr:`in_submission_order` back to ``True``.
        """
        self.scope.reset()
        with self.lock:
            default, warming = self.default, self.warming
            self.default = self.warming = None
        if default is not None:
            default.terminate_workers()
            default.shutdown(wait=True, cancel_futures=True)
        if warming is not None:
            warming.join(RESET_JOIN_S)
        self.readiness.reset()
        self.counts.reset()
        self.in_submission_order = True


STATE = InductorState()
"""The Inductor integration's process-wide state (``precompile_executor.inductor.state``)."""

__all__ = ["OFF", "RESET_JOIN_S", "STATE", "InductorState"]
