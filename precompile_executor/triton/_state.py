"""Everything the Triton integration keeps for the whole process, in one object: :data:`STATE`.

* **Which executor** ``@triton.autotune`` uses — :attr:`TritonState.scope`, a
  :class:`~precompile_executor._scope.Scope` holding the open ``autotune.use()`` blocks and the
  ``autotune.install()`` installation, under the scope rule (``docs/triton.md``, "Which autotunes
  a block covers"). The seam (:mod:`._autotune_seam`, above this module) connects its patch and
  its restore (:meth:`TritonState.connect`): Triton's ``Autotuner`` methods are replaced when the
  first holder arrives and put back when the last leaves; the replaced originals stay in
  :attr:`TritonState.originals`, never dropped, so a tune still running on another thread when
  the last block closes finishes with them.
* **The default executor** (:mod:`._submit`): the executor ``precompile()``, ``warm()``,
  ``async_compile_executor()`` and ``autotune.use()``/``install()`` build when given none, and
  its background warm-up thread.
* **What was announced** (:mod:`._preimport`): the kernel modules each executor's workers were
  asked to import ahead of their configs.
* **Where each kernel's configs compiled** (:mod:`._autotune_guard`): per autotuned kernel, the
  configs compiled in workers, in lanes, here and failed, and whether its tunes now go to stock
  Triton.
* **The caller lanes** (:mod:`._lanes`): the threads of this process that compile a tune's
  queued configs while no worker is ready for them, built on first use.
* **Which autotuners were told they are not screened** (:mod:`._autotune_tune`,
  ``screening_benchmarker``): the INFO line is logged once per autotuner.

The A/B switches ``_autotune_tune.STEALS``, ``_autotune_tune.CONFIRM_MARGIN``,
``_lanes.CALLER_LANES`` and ``_preimport.PREIMPORTS`` are settings, not state: they stay module
constants beside the code they steer, and :meth:`TritonState.reset` leaves them as they are.
Caches that only memoise (``_kernel_ref``'s kernel references and loaded kernels,
``_autotune_tune``'s per-autotuner locks, weakly keyed) hold nothing a test could observe and are
not reset either.

:meth:`TritonState.reset` is the documented way (for tests) to put all of it back as if the
integration had never been used.

Lock order: the scope's lock, then :attr:`TritonState.lock`; nothing that holds ``lock`` asks
the scope.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Executor
from typing import Any

from .._scope import OFF, Scope

RESET_JOIN_S = 30.0
"""Longest :meth:`TritonState.reset` waits for the default executor's warm-up thread (it ends
once its executor is stopped: its ``warm_up()`` fails, its module scan is one pass over
``sys.modules``)."""


class TritonState:
    """The integration's process-wide state (see the module docstring); one instance,
    :data:`STATE`, exported as ``precompile_executor.triton.state``.

    Attributes:
        scope: the open ``autotune.use()`` blocks and the installation; ``None`` as a block's
            executor means the default executor.
        originals: Triton's ``Autotuner.run``, ``prune_configs`` and ``_bench`` as found before
            the seam replaced them (empty: never patched); kept after they are put back.
        lock: guards :attr:`default`, :attr:`warming`, :attr:`announced`, :attr:`lanes` and
            :attr:`unscreened` and :attr:`refused` (never held while asking the scope).
        default: the default executor, once built (a ``PrecompileExecutor``).
        warming: the default executor's background warm-up thread, once started.
        announced: per executor (weakly), the kernel modules its workers were asked to import.
        compiles: per ``@triton.jit`` function (weakly), its ``_autotune_guard.KernelCompiles``.
        lanes: the caller lanes (a ``_lanes.CallerLanes``), once built.
        unscreened: the autotuners (weakly) already told that screening cannot shorten their
            timings.
        refused: the executors (weakly) already reported for refusing a tune's compiles (shut
            down or broken): each is reported once.
    """

    def __init__(self) -> None:
        self.scope = Scope(
            "triton_autotune", connected_by="precompile_executor.triton._autotune_seam"
        )
        self.originals: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.default: Executor | None = None
        self.warming: threading.Thread | None = None
        self.announced: weakref.WeakKeyDictionary[Executor, set[str]] = weakref.WeakKeyDictionary()
        self.compiles: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.lanes: Any = None
        self.unscreened: weakref.WeakSet[Any] = weakref.WeakSet()
        self.refused: weakref.WeakSet[Any] = weakref.WeakSet()

    def executor(self) -> Any:
        """The scope's executor for an autotune starting now in this context: an executor,
        ``None`` (the default executor) or :data:`~precompile_executor._scope.OFF`."""
        return self.scope.current()

    def reset(self) -> None:
        """Put the process back as if the integration had never been used (for tests).

        In this order, it:

        1. closes every ``autotune.use()`` block and the installation (their owners' later
           exits do nothing) and puts Triton's ``Autotuner`` methods back;
        2. stops the default executor, if one was built: ``terminate_workers()`` shuts it down,
           cancels its queued compiles and stops its workers (a running compile gets SIGTERM,
           then SIGKILL after a grace) and its warm template, so none is left warm in the
           process's pool; then ``shutdown(wait=True)``, which that stop has made short;
        3. waits (at most :data:`RESET_JOIN_S`) for the default executor's background warm-up
           thread, which that stop ends;
        4. shuts the caller lanes down (compiles running in them finish on their threads);
        5. forgets the default executor, its warm-up thread, the lanes, every announced module,
           where each kernel's configs compiled (kernels sent to stock Triton by the guard
           are tuned through the integration again), which autotuners were told they are
           not screened and which executors were reported for refusing compiles (they are told
           again): the next ``precompile()`` or
           ``autotune.use()`` builds a new executor and announces again. :attr:`originals` and
           the settings (``STEALS``, ``CONFIRM_MARGIN``, ``CALLER_LANES``, ``PREIMPORTS``) are
           left as they are.
        """
        self.scope.reset()
        with self.lock:
            default, warming, lanes = self.default, self.warming, self.lanes
            self.default = self.warming = self.lanes = None
            self.announced = weakref.WeakKeyDictionary()
            self.compiles = weakref.WeakKeyDictionary()
            self.unscreened = weakref.WeakSet()
            self.refused = weakref.WeakSet()
        if default is not None:
            terminate = getattr(default, "terminate_workers", None)
            if callable(terminate):
                terminate()
            default.shutdown(wait=True, cancel_futures=True)
        if warming is not None:
            warming.join(RESET_JOIN_S)
        if lanes is not None:
            lanes.shutdown()


STATE = TritonState()
"""The Triton integration's process-wide state (``precompile_executor.triton.state``)."""

__all__ = ["OFF", "RESET_JOIN_S", "STATE", "TritonState"]
