"""The executor ``use()`` and ``install()`` use when given none, warmed in the background.

:func:`default_executor` builds it once per process: as many workers as Inductor's own pool
would have (:func:`compile_threads`), forked from a template that ran
:func:`~._worker.import_inductor`. It starts the workers on a daemon thread (``warm_up()``, the
executor's public API) the first time it is asked for, before ``use()``/``install()`` import
Inductor to check and patch it, so the template's ``import torch`` and Inductor's imports run
while the caller imports, traces and compiles its first kernels itself (Inductor compiles in the
caller until a worker answers: ``_compiles.Readiness``). The warm-up runs inside
``_base.in_background``: the caller's work is what the process waits for meanwhile, so the
switch interval stays the program's (docs/inductor.md, "Readiness").

The executor and its warm-up thread are kept in ``_state.STATE`` (``state.reset()`` stops and
forgets them).

Threads: builders run on any thread under the state's lock; the warm-up thread only calls
``warm_up()`` and logs its failure (the compiles then stay in the caller: the readiness probe
fails and warns).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from .. import PrecompileExecutor
from .._base import in_background
from ._state import STATE
from ._worker import import_inductor

log = logging.getLogger("precompile_executor.inductor")

WARM_UP_TIMEOUT_S = 300.0
"""How long the background warm-up waits for every worker (a template imports torch: seconds
on an idle machine, a minute on a loaded 2-core one)."""

MAX_COMPILE_THREADS = 32
"""Inductor's own cap on its pool's workers (``config.decide_compile_threads``)."""


def compile_threads() -> int:
    """How many workers Inductor's own pool would have, without importing Inductor.

    ``torch._inductor.config.compile_threads`` if Inductor's config is already imported (a
    program may have set it); else Inductor's own rule (``decide_compile_threads`` in torch 2.11
    and 2.13): ``TORCHINDUCTOR_COMPILE_THREADS``, else 1 on Windows, else the CPUs this process
    may run on (its affinity, as ``torch._utils.cpu_count``), at most
    :data:`MAX_COMPILE_THREADS`.

    Raises:
        ValueError: ``TORCHINDUCTOR_COMPILE_THREADS`` is not a whole number (Inductor's own
            import fails on it alike).
    """
    config = sys.modules.get("torch._inductor.config")
    configured = getattr(config, "compile_threads", None)
    if isinstance(configured, int) and not isinstance(configured, bool):
        return configured
    given = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    if given is not None:
        try:
            return int(given)
        except ValueError:
            raise ValueError(
                f"TORCHINDUCTOR_COMPILE_THREADS must be a whole number of compile workers, got "
                f"{given!r}; set it to 1 to compile in the caller, or unset it for one per CPU"
            ) from None
    if sys.platform == "win32":
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(MAX_COMPILE_THREADS, cpus or 1)


def default_executor() -> PrecompileExecutor:
    """The process's executor for Inductor's compiles, built (and its warm-up started) once.

    With one compile thread (``TORCHINDUCTOR_COMPILE_THREADS=1``) Inductor compiles in the
    caller on purpose, and so does the integration: the executor is built but not warmed.
    """
    with STATE.lock:
        if STATE.default is None:
            workers = compile_threads()
            STATE.default = PrecompileExecutor(max(1, workers), initializer=import_inductor)
            if workers > 1:
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
        with in_background():
            executor.warm_up(WARM_UP_TIMEOUT_S)
    except Exception:
        log.debug("warming the default executor for Inductor failed", exc_info=True)
