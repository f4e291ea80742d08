"""Workers import a kernel's module before its configs reach them, off the critical path.

A worker that meets a kernel it has not loaded imports the kernel's module first (by reference,
``_kernel_ref.load_kernel``): for a library such as flash-linear-attention that is seconds, the
whole package. Paid inside the first config's task, the config waits for it while it could have
been compiled by an idle worker or in this process. So each module is *announced* once
per executor, as soon as it is seen — when a tune meets a kernel of a module not yet announced,
and once the default executor's workers are up after a ``use()``/``install()`` block opened
(every module already loaded that holds an autotuned kernel) — as one high-priority task per
worker that imports it (``_worker.import_modules``). Queued ahead of the configs, those tasks
go to workers as they become ready; the configs stay queued meanwhile, where the caller lanes
(``_lanes.py``) or the tune's thread (``Tune._steal``) may take them: a worker importing is not
compiling for the tune. A worker that never gets one imports the module in its first
config of it.

Never announced: ``__main__``, kernels defined in functions, and packages that call kernels while
they import (``_kernel_ref.imports_that_launch``; their kernels travel by source) or that are
importing right now.

Threads: :func:`announce` runs on any thread; the announced names live in one set per executor
(``_state.TritonState.announced``) under the state's lock; ``state.reset()`` forgets them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

from ._kernel_ref import initializing_modules, launches_at_import, unwrap_jit_function
from ._state import STATE
from ._worker import import_modules

PREIMPORT_PRIORITY = 1e9
"""Above any config's: a ready worker imports the announced modules before it compiles."""

PREIMPORTS = True
"""``False``: announce nothing (every worker imports a module in its first config of it)."""

_SKIPPED_PACKAGES = ("torch", "triton", "precompile_executor")
"""Imported in every worker's template already, or not a kernel library."""

log = logging.getLogger("precompile_executor.triton.autotune")


def module_of(kernel: Any) -> str | None:
    """The module a worker imports to find ``kernel`` (an autotuner or ``JITFunction``)."""
    try:
        fn = unwrap_jit_function(kernel).fn
    except Exception:  # noqa: BLE001 - not a kernel we can send: nothing to import
        return None
    if "<locals>" in fn.__qualname__:
        return None
    return str(fn.__module__)


def announce(executor: Executor, modules: Iterable[str | None]) -> None:
    """Have ``executor``'s workers import ``modules`` (those not announced to it before)."""
    if not PREIMPORTS:
        return
    wanted = []
    for name in modules:
        if not name or name == "__main__" or name.split(".")[0] in _SKIPPED_PACKAGES:
            continue
        if launches_at_import(name) or initializing_modules(name):
            continue
        wanted.append(name)
    if not wanted:
        return
    with STATE.lock:
        try:
            seen = STATE.announced.setdefault(executor, set())
        except TypeError:  # an executor that cannot be weakly referenced: do not track it
            return
        new = tuple(sorted(set(wanted) - seen))
        seen.update(new)
    if not new:
        return
    workers = getattr(executor, "max_workers", None)
    options = getattr(executor, "options", None)
    if not isinstance(workers, int) or not callable(options):
        # A stdlib pool (threads share this process's imports), an unknown executor, or a
        # cluster executor (no ``max_workers``): a cluster places a task on any node and any of
        # its pool's workers, so one import task per slot would not reach every worker, and
        # each node's pool imports a module once per worker in its first config of it anyway
        # (docs/triton.md, "On a cluster").
        return
    try:
        submit = options(priority=PREIMPORT_PRIORITY).submit
        for _ in range(workers):
            submit(import_modules, new, os.getpid())
    except Exception:  # noqa: BLE001 - only a lost head start: the compiles import it
        log.debug("announcing %s to %r failed", new, executor, exc_info=True)


def loaded_kernel_modules() -> list[str]:
    """Return the modules of the autotuned kernels (``@triton.autotune``, under
    ``@triton.heuristics`` too) that loaded modules hold at top level."""
    from triton.runtime.jit import KernelInterface

    found: set[str] = set()
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] in _SKIPPED_PACKAGES:
            continue
        try:
            values = list(vars(module).values())
        except TypeError:
            continue
        for value in values:
            if isinstance(value, KernelInterface) and _autotuned(value):
                own = module_of(value)
                if own is not None:
                    found.add(own)
    return sorted(found)


def _autotuned(kernel: Any) -> bool:
    """Whether ``kernel`` is an ``Autotuner`` or wraps one (``Heuristics`` over it)."""
    from triton.runtime.autotuner import Autotuner

    for _ in range(8):  # a wrapper chain is a few levels deep at most
        if isinstance(kernel, Autotuner):
            return True
        kernel = getattr(kernel, "fn", None)
        if kernel is None:
            return False
    return False
