"""Measuring in the autotuning process while Helion's benchmark subprocess starts.

Helion 1.5.1 measures every config in its benchmark subprocess (``_bench_worker``), whose cold
start — a new interpreter, ``import torch, helion``, a CUDA context — takes 17–24 s on the H100
and H200 machines. Under ``with use():`` entered after the program's imports it starts with the
autotune, and the first measurement waited for it (docs/gpu-runs.md, the bmm rows). The rule
(docs/helion.md, "Measured here while the benchmark subprocess starts"):

* while the provider's worker is still **starting** (its :class:`~._bench_worker.WarmUp` round
  trip has not answered; asked without waiting: :meth:`~._bench_worker.EarlyWorker.starting`),
  a config Helion would measure in the subprocess is measured in this process instead, by
  Helion's own in-process path (``LocalBenchmarkProvider._benchmark_function`` with the
  subprocess path off for that call: its timing, its accuracy check, its classification, its
  log lines and metrics);
* once the round trip has answered (or failed, or the worker was stopped), every later
  measurement goes to the subprocess, as Helion sends it; the worker never starts again for
  this provider, so nothing comes back here (Helion's own fallbacks to in-process aside);
* a worker that is warm when the provider is built (``install()``'s spare, a worker kept from
  the last autotune), a provider that starts none (``autotune_benchmark_subprocess`` off,
  distributed runs), and a block with ``measure_while_worker_starts=False`` change nothing.

What a config measured here gives up is the subprocess's isolation: Helion's in-process path
has no timeout (a kernel that hangs the GPU hangs the autotune), a sticky CUDA error poisons
this process's context (Helion raises ``TritonUnrecoverableRuntimeError`` and the autotune
ends), and an error Helion classifies "raise" ends the autotune as with the subprocess off
(the subprocess path would skip the config).

Threads: :class:`WhileStarting` is the provider's, used on the autotuner's thread only.
"""

from __future__ import annotations

import logging
from typing import Any

from ._state import STATE

log = logging.getLogger("precompile_executor.helion")

OPTION = "measure_while_worker_starts"
"""The keyword of ``use()`` and ``install()``, kept as their block's option (the scope rule)."""


def options(measure_while_worker_starts: Any) -> dict[str, bool]:
    """The block's options for ``use()``/``install()``, checked before anything is opened."""
    if not isinstance(measure_while_worker_starts, bool):
        raise TypeError(f"{OPTION} must be True or False, not {measure_while_worker_starts!r:.80}")
    return {OPTION: measure_while_worker_starts}


def allowed_now() -> bool:
    """The option of the block (or installation) an autotune starting now uses, by the scope
    rule; ``True`` where none is open (a provider built by hand)."""
    block = STATE.scope.current_block()
    return True if block is None else bool(block.options.get(OPTION, True))


class WhileStarting:
    """One provider's rule and record: whether its next measurement runs here, how many did.

    Attributes:
        early: the provider's benchmark worker (``_bench_worker.EarlyWorker``), or ``None``
            where it started none.
        allowed: the block's ``measure_while_worker_starts``.
        measured: configs measured in this process while the worker was starting (``3``).
        handed_over: whether a measurement has gone to the subprocess after those.
    """

    __slots__ = ("allowed", "early", "handed_over", "measured", "_said")

    def __init__(self, early: Any, *, allowed: bool) -> None:
        self.early = early
        self.allowed = allowed
        self.measured = 0
        self.handed_over = False
        self._said = False  # the autotune's one INFO line is out

    def here(self) -> bool:
        """Whether a measurement starting now runs in this process (the worker still starts)."""
        return self.allowed and self.early is not None and self.early.starting()

    def count(self) -> None:
        """One config measured here (the integration's statistics count it too)."""
        self.measured += 1
        STATE.count_measured_while_starting(first=self.measured == 1)

    def hand_over(self) -> None:
        """A measurement goes to the subprocess: after configs measured here, say so once."""
        if not self.measured or self.handed_over:
            return
        self.handed_over = True
        self._say(f"later configs are measured in the subprocess, warm {self._warm_up()}")

    def end(self) -> None:
        """The autotune ended (the provider's ``cleanup``): say so if it never handed over."""
        if self.measured and not self._said:
            self._say("the subprocess was not warm before the autotune's measurements ended")

    def _warm_up(self) -> str:
        seconds = None if self.early is None else self.early.warm_up_s()
        took = "" if seconds is None else f"after {seconds:.1f} s"
        if self.early is not None and self.early.error is not None:
            return f"{took} (its warm-up failed: Helion starts a new one)".strip()
        return took

    def _say(self, then: str) -> None:
        self._said = True
        log.info(
            "%d config(s) measured in the autotuning process while Helion's benchmark "
            "subprocess started; %s (measure_while_worker_starts=False keeps every "
            "measurement in the subprocess)",
            self.measured,
            then,
        )
