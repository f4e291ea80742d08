"""The executor ``use()`` and ``install()`` use when given none, warmed in the background.

:func:`default_executor` builds it once per process: as many workers as Inductor's own pool
would have (``compile_threads``: ``TORCHINDUCTOR_COMPILE_THREADS``, else the CPU count up to
32), forked from a template that ran :func:`~._worker.import_inductor`. :func:`start_warm_up`
starts its workers on a daemon thread (``warm_up()``, the executor's public API) the first time
it is asked for, so the template's ``import torch`` and Inductor's imports run while the caller
traces its model; a compile submitted before the warm-up ends starts on whichever worker is
ready.

The executor and its warm-up thread are kept in ``_state.STATE`` (``state.reset()`` stops and
forgets them).

Threads: builders run on any thread under the state's lock; the warm-up thread only calls
``warm_up()`` and logs its failure (the compiles then pay the start, or fail with the
executor's error).
"""

from __future__ import annotations

import logging
import threading

from .. import PrecompileExecutor
from ._state import STATE
from ._worker import import_inductor

log = logging.getLogger("precompile_executor.inductor")

WARM_UP_TIMEOUT_S = 300.0
"""How long the background warm-up waits for every worker (a template imports torch: seconds
on an idle machine, a minute on a loaded 2-core one)."""


def default_executor() -> PrecompileExecutor:
    """The process's executor for Inductor's compiles, built (and its warm-up started) once."""
    with STATE.lock:
        if STATE.default is None:
            from torch._inductor.async_compile import get_compile_threads

            STATE.default = PrecompileExecutor(
                max(1, get_compile_threads()), initializer=import_inductor
            )
            STATE.warming = threading.Thread(
                target=_warm_up,
                args=(STATE.default,),
                name="precompile-executor-inductor-warm-up",
                daemon=True,
            )
            STATE.warming.start()
        return STATE.default


def _warm_up(executor: PrecompileExecutor) -> None:
    try:
        executor.warm_up(WARM_UP_TIMEOUT_S)
    except Exception:
        log.debug("warming the default executor for Inductor failed", exc_info=True)
