"""The executor that ``use()`` and ``install()`` build when given none, warmed off the clock.

:func:`default_executor` builds it once per process, set up as ``docs/helion.md`` recommends:
:func:`~precompile_executor.helion.import_helion` in the warm template (with a tiny compile for
this GPU's Triton target), spawn workers pinned to the current CUDA device, and as many workers
as Helion's ``autotune_precompile_jobs`` (default: the CPU count, as Helion's).

:func:`start_default_warm_up` starts its workers on a background thread (``warm_up()``, the
executor's public API), once: :func:`~precompile_executor.helion.use` calls it at once when
Helion's default precompile mode is spawn, and the streaming provider calls it when a kernel's
settings say spawn — before Helion's baseline run and codegen, which it overlaps. A batch does not
wait for the warm-up: its tasks start on whichever workers are ready. In fork mode the workers
are not needed (the fork path forks the autotuning process) and nothing is warmed.

**Before Helion is imported** (:func:`start_before_helion`): ``install()`` called at the top of
a program, ahead of ``import helion``, with ``HELION_AUTOTUNE_PRECOMPILE=spawn`` in the
environment, builds the executor from the environment alone — jobs from
``HELION_AUTOTUNE_PRECOMPILE_JOBS`` (else the CPU count, as Helion's default), pinned to the
first GPU this process sees (the first entry of ``CUDA_VISIBLE_DEVICES``, else GPU 0), no
prewarm target (naming it would mean asking CUDA) — and starts warming it before this process
imports Helion to check it: the template's ``import helion``, most of the warm-up
(``docs/helion.md``, "Warm-up off the clock"), runs beside the program's own. If the check then
refuses, :func:`discard_early` shuts that executor down, so a refusal leaves nothing built.

**The autotuning process's own Triton** (:func:`start_caller_warm_up`): a background thread
computes one compile cache key, so that every fork-mode child forked after it inherits Triton's
installation hash instead of computing it in its own compile (docs/helion.md, "Fork mode").

**Which executor an autotune uses** (:func:`current_executor`): the scope's, under the scope
rule (``docs/helion.md``, "Which executor: the scope rule"), ``None`` resolved to the default
executor.

State: everything this module keeps lives in ``_state.STATE`` (the default executor, its
warm-up thread, the early device, the caller's warm-up threads, the warm-up's times).

Threads: builders and starters run on any thread, under ``STATE.lock``; the warm-up thread only
calls ``warm_up()``; the caller's warm-up thread only hashes (it takes no lock).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from .. import PrecompileExecutor
from .._cluster_executor import ClusterExecutor
from . import _bench_worker
from ._state import OFF, STATE

log = logging.getLogger("precompile_executor.helion")


HelionExecutor = PrecompileExecutor | ClusterExecutor[Any]
"""What Helion's precompiles run on: a local executor (fork and spawn mode) or a cluster
executor (fork mode's compiles on the nodes: docs/helion.md, "On a cluster")."""


def current_executor() -> HelionExecutor:
    """The executor an autotune starting now, on this thread, precompiles on: the innermost
    open ``use()`` block of this context, else the newest open block anywhere, else
    ``install()``'s (the scope rule); ``None`` there is the default executor.

    Raises:
        RuntimeError: no block and no installation is open (Helion's own methods are back).
    """
    executor = STATE.executor()
    if executor is OFF:
        raise RuntimeError(
            "precompile_executor.helion is not in use: no use() block and no install() is open "
            "(an autotune that outlives the block it started in, on another thread, ends up "
            "here: keep the block open until the autotune returns)"
        )
    return default_executor() if executor is None else executor


def uses(executor: HelionExecutor) -> bool:
    """Whether ``executor`` is the one an autotune starting now, on this thread, uses."""
    found = STATE.executor()
    if found is None:
        with STATE.lock:
            found = STATE.default
    return found is executor


def default_executor() -> PrecompileExecutor:
    """The process's executor for Helion, built on first use (see the module docstring)."""
    with STATE.lock:
        if STATE.default is None:
            from helion.runtime.settings import Settings

            from ._spawn_task import import_helion

            jobs = Settings().autotune_precompile_jobs or os.cpu_count() or 1
            device, target = _cuda_device()
            STATE.default = PrecompileExecutor(
                jobs,
                initializer=import_helion,
                initargs=(target,),
                devices=None if device is None else [device],
            )
        return STATE.default


def _cuda_device() -> tuple[int | str | None, str | None]:
    """The current CUDA device (for ``devices=``) and its Triton target (``"cuda:90"``), or
    ``(None, None)`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    index = torch.cuda.current_device()
    target = _triton_target(torch.cuda, index)
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        # This process's index 0 need not be the machine's GPU 0: name it by its UUID.
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return (uuid if uuid.startswith("GPU-") else "GPU-" + uuid), target
    return index, target


def default_mode_is_spawn() -> bool:
    """Whether Helion's default settings (its environment variables) precompile in spawn mode."""
    from helion.runtime.settings import Settings

    return bool(Settings().autotune_precompile == "spawn")


def start_default_warm_up() -> None:
    """Start warming the default executor in the background (once; a no-op if it is not the
    executor in use)."""
    with STATE.lock:
        executor = STATE.default
    if executor is None or not uses(executor):  # asked outside the lock (_state: lock order)
        return
    with STATE.lock:
        if STATE.warming is None and STATE.default is executor:
            _start_warming(executor)


def _start_warming(executor: PrecompileExecutor) -> None:
    # Under STATE.lock.
    STATE.warming = threading.Thread(
        target=_warm_up,
        args=(executor,),
        name="precompile-executor-helion-warm-up",
        daemon=True,
    )
    STATE.warming.start()


SPAWN_VARIABLE = "HELION_AUTOTUNE_PRECOMPILE"
JOBS_VARIABLE = "HELION_AUTOTUNE_PRECOMPILE_JOBS"


def start_before_helion() -> bool:
    """Before Helion is imported in this process: if the environment says spawn mode, build the
    default executor from the environment and start warming it (see the module docstring).

    Returns whether it did. Does nothing when Helion is imported already (the caller's
    :func:`default_executor` then builds it from Helion's settings), when an executor was built
    already, or when the environment says fork mode or holds a value Helion itself will refuse
    with its own message.
    """
    if "helion" in sys.modules or os.environ.get(SPAWN_VARIABLE, "").strip() != "spawn":
        return False
    if _bench_worker.bootstrapping():  # a spawn child importing its parent's main module
        return False
    jobs_text = os.environ.get(JOBS_VARIABLE, "").strip()
    try:
        jobs = int(jobs_text) if jobs_text else os.cpu_count() or 1
    except ValueError:
        return False  # Helion's Settings() raises "... must be an integer" for it
    if jobs < 1:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = visible.split(",")[0].strip() if visible is not None else "0"
    if not device or device.startswith("-"):
        return False  # no GPU visible: nothing to pin; default_executor() decides later
    from ._spawn_task import import_helion

    with STATE.lock:
        if STATE.default is not None:
            return False
        STATE.default = PrecompileExecutor(
            jobs, initializer=import_helion, initargs=(None,), devices=[device]
        )
        STATE.early_device = device
        STATE.times["built"] = time.monotonic()
        _start_warming(STATE.default)
    return True


def discard_early() -> None:
    """Shut down an executor :func:`start_before_helion` built (the check refused Helion)."""
    with STATE.lock:
        executor, thread = (
            (STATE.default, STATE.warming) if STATE.early_device is not None else (None, None)
        )
        if executor is None:
            return
        STATE.default = STATE.warming = STATE.early_device = None
    executor.shutdown(wait=True, cancel_futures=True)
    executor.terminate_workers()
    if thread is not None:
        thread.join(timeout=30)


def early_device_mismatch(kernel_device: Any) -> str | None:
    """Why the default executor, built before Helion was imported, runs on another GPU than
    ``kernel_device`` (a ``torch.device``), or ``None`` when it does not (or was not built so).

    It was pinned to the first GPU this process sees; a kernel on ``cuda:1`` of this process
    would have its configs run once on the other GPU (a valid check, but not on its own GPU).
    """
    with STATE.lock:
        device = STATE.early_device
    index = getattr(kernel_device, "index", None)
    if device is None or getattr(kernel_device, "type", None) != "cuda" or not index:
        return None
    return (
        f"precompile_executor.helion.install() was called before Helion was imported and pinned "
        f"its spawn workers to this process's first GPU ({device}); this kernel runs on "
        f"cuda:{index}, so its configs run once on the other GPU. Call install() after "
        "torch.cuda.set_device(), or pass an executor of your own: install(PrecompileExecutor("
        f"..., devices=[...]))."
    )


# -- the autotuning process's own Triton, warmed before its first fork ----------------------------

CALLER_WARM_UP_WAIT_S = 10.0
"""Longest a fork-mode precompile waits for :func:`start_caller_warm_up`'s thread before it forks
anyway (the hash takes 0.3–0.5 s; a stuck one must not stall an autotune)."""

FALLBACK_TARGET = "cuda:90"
"""The target warmed while this process has no CUDA context to ask (``install()`` before the
program's imports): Triton's installation hash, the costly part, is the same for every target
(docs/gpu-runs.md, "Helion, fork mode")."""

WARMS_CALLER = True
"""``False``: :func:`start_caller_warm_up` does nothing — the A/B of it (``helion_bench``'s
``install-fork-coldcaller`` mode)."""


def caller_target() -> str:
    """This process's Triton target (``"cuda:90"``) if it has a CUDA context already, else
    :data:`FALLBACK_TARGET` (asking would create one)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    hip = getattr(getattr(torch, "version", None), "hip", None)
    if cuda is None or hip or not cuda.is_initialized():
        return FALLBACK_TARGET
    return _triton_target(cuda, cuda.current_device())


def _triton_target(cuda: Any, index: int) -> str:
    """The Triton target of CUDA device ``index`` (``"cuda:90"``); ``cuda`` is ``torch.cuda``."""
    major, minor = cuda.get_device_capability(index)
    return f"cuda:{major}{minor}"


def start_caller_warm_up(target: str | None = None) -> None:
    """Pay this process's cold first compile on a background thread, once per target.

    A child forked from a process that never compiled pays Triton's cold start in every
    compile: the hash of Triton's installation (``triton_key``) and the backend's set-up, 0.3–0.5 s
    per child, about five times a small compile's own time (docs/gpu-runs.md, "Helion, fork mode";
    on the H200, Helion's first batch compiled at 0.58 s a config against native fork's 0.27 s,
    whose baseline had compiled before it forked). Computing one cache key here
    (``triton._prewarm.warm_caller``: no compile, nothing written, no CUDA) makes
    every child forked after it inherit that work; fork-mode precompiles wait for it
    (:func:`wait_caller_warm_up`).
    """
    if not WARMS_CALLER:
        return
    target = target or caller_target()
    with STATE.lock:
        if target in STATE.caller_warms:
            return
        thread = threading.Thread(
            target=_warm_caller,
            args=(target,),
            name="precompile-executor-helion-caller-warm-up",
            daemon=True,
        )
        thread.start()  # before a waiter can see it: join() refuses a thread not started
        STATE.caller_warms[target] = thread


def _warm_caller(target: str) -> None:
    try:
        from ..triton._prewarm import warm_caller

        warm_caller(target)
    except Exception as error:  # noqa: BLE001 - only a lost head start: children pay it
        log.debug("warming this process's Triton for %s failed: %s", target, error)


def wait_caller_warm_up(timeout: float = CALLER_WARM_UP_WAIT_S) -> bool:
    """Wait (at most ``timeout`` seconds) for :func:`start_caller_warm_up`'s threads; return
    whether none is still running. Called before a fork: a child forked while another thread
    hashes would start cold, and that thread holds locks the child would inherit held."""
    with STATE.lock:
        threads = list(STATE.caller_warms.values())
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def _warm_up(executor: PrecompileExecutor) -> None:
    times = STATE.times  # reset() replaces the dict: a discarded warm-up writes to its own
    times["started"] = time.monotonic()
    try:
        executor.warm_up()
    except Exception as error:  # noqa: BLE001 - tasks start workers on demand anyway
        with STATE.lock:
            discarded = executor is not STATE.default
        if not discarded:  # a discarded executor's warm-up ends in an error by design
            log.warning(
                "warming Helion's precompile workers failed (they start on demand): %s", error
            )
    finally:
        times["ended"] = time.monotonic()


def warm_up_times() -> dict[str, float]:
    """When the background warm-up started and ended, and when :func:`start_before_helion`
    built the executor (``time.monotonic()``), as far as known."""
    with STATE.lock:
        return dict(STATE.times)


def is_default(executor: HelionExecutor) -> bool:
    """Whether ``executor`` is the process's executor for Helion that this module built."""
    with STATE.lock:
        return executor is STATE.default


def warming() -> bool:
    """Whether the default executor's background warm-up was started."""
    with STATE.lock:
        return STATE.warming is not None
