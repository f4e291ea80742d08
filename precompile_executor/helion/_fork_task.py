"""Fork mode, child side: run Helion's compile-only precompiler and report failure as failure.

Runs in a child forked by the executor's fork path (never in the parent). The parent has already
run the generated host code with a launcher that raises, to capture the launch arguments, and
built Helion's precompiler closure (``finish_it``) around them; the child inherits it as it is in
memory. ``finish_it()`` compiles into the on-disk Triton cache of the parent's environment (the
child inherits ``TRITON_CACHE_DIR``) and loads nothing onto a GPU.

Helion 1.5.1's own fork child records a failed compile as ok: ``finish_it`` catches the compile
error, asks ``classify_triton_exception`` about it and calls ``sys.exit(1)``, and the child's
``finally: os._exit(status)`` exits with status 0. Here the child wraps the module-global
``classify_triton_exception`` that ``finish_it`` calls (only in this child's copy of memory) to
keep the exception, turns the ``SystemExit`` back into it, and so the task fails with the
compiler's own exception type and message: the parent classifies it as Helion would.

The child compiles at :data:`NICENESS` below the autotuning process: streamed, the parent
generates code and measures configs while the children compile, and with Helion's default
``autotune_precompile_jobs`` (the CPU count) the children alone fill every core; the parent's
work is the critical path (docs/helion.md, "Streaming").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from typing import Any

NICENESS = 5
"""How much lower than the autotuning process a precompile child runs (``os.nice`` increment):
under contention the parent gets about three times a child's share of a core (CFS weights)."""

IDLE_PRIORITY = False
"""``True``: the child compiles under ``SCHED_IDLE`` instead (a CFS weight of 3 against the
parent's 1024, so it takes only CPU time that no normal-priority task wants) — the A/B of a
parent that never shares its core (``helion_bench``'s ``ours-fork-idle`` mode). Not the default:
a compile starved by other busy processes on the machine runs into its compile timeout."""


class CompileFailed(RuntimeError):
    """Helion's precompiler reported a failed compile without an exception we could keep."""


@dataclasses.dataclass(frozen=True)
class ForkCompile:
    """The fork-path task for one config: ``finish_it()`` of Helion's precompiler.

    Attributes:
        precompiler: Helion's ``finish_it`` closure (compile only, no CUDA).
        label: the config's decorator text, for messages.
    """

    precompiler: Callable[[], bool]
    label: str

    def __call__(self) -> bool:
        """Compile; return True, or raise the compiler's exception."""
        from helion.runtime import precompile_shim

        with contextlib.suppress(OSError):  # a sandbox may refuse; the compile still runs
            if IDLE_PRIORITY:  # this child only: it exits after this one compile
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            else:
                os.nice(NICENESS)

        seen: list[BaseException] = []
        original = precompile_shim.classify_triton_exception

        def keep(err: BaseException) -> Any:
            seen.append(err)
            return original(err)

        precompile_shim.classify_triton_exception = keep  # this child's copy only
        try:
            ok = self.precompiler()
        except SystemExit as stop:
            if seen:
                raise seen[-1] from None
            raise CompileFailed(f"compile failed for {self.label} (exit {stop.code})") from None
        finally:
            precompile_shim.classify_triton_exception = original
        if ok is False:
            if seen:
                raise seen[-1]
            raise CompileFailed(f"compile failed for {self.label}")
        return True
