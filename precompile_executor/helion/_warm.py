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

Threads: builders and starters run on any thread, under ``_lock``; the warm-up thread only
calls ``warm_up()``.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from .. import PrecompileExecutor
from . import _installed

log = logging.getLogger("precompile_executor.helion")

_lock = threading.Lock()
_default: PrecompileExecutor | None = None
_warming: threading.Thread | None = None


def default_executor() -> PrecompileExecutor:
    """The process's executor for Helion, built on first use (see the module docstring)."""
    global _default
    with _lock:
        if _default is None:
            from helion.runtime.settings import Settings

            from ._spawn_task import import_helion

            jobs = Settings().autotune_precompile_jobs or os.cpu_count() or 1
            device, target = _cuda_device()
            _default = PrecompileExecutor(
                jobs,
                initializer=import_helion,
                initargs=(target,),
                devices=None if device is None else [device],
            )
        return _default


def _cuda_device() -> tuple[int | str | None, str | None]:
    """The current CUDA device (for ``devices=``) and its Triton target (``"cuda:90"``), or
    ``(None, None)`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    target = f"cuda:{major}{minor}"
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
    global _warming
    with _lock:
        executor = _default
        if executor is None or _warming is not None or not _installed.uses(executor):
            return
        _warming = threading.Thread(
            target=_warm_up,
            args=(executor,),
            name="precompile-executor-helion-warm-up",
            daemon=True,
        )
        _warming.start()


_times: dict[str, float] = {}
"""``time.monotonic()`` when the warm-up started and ended (statistics for benchmarks)."""


def _warm_up(executor: PrecompileExecutor) -> None:
    _times["started"] = time.monotonic()
    try:
        executor.warm_up()
    except Exception as error:  # noqa: BLE001 - tasks start workers on demand anyway
        log.warning("warming Helion's precompile workers failed (they start on demand): %s", error)
    finally:
        _times["ended"] = time.monotonic()


def warm_up_times() -> dict[str, float]:
    """When the background warm-up started and ended (``time.monotonic()``), as far as known."""
    return dict(_times)


def warming() -> bool:
    """Whether the default executor's background warm-up was started."""
    with _lock:
        return _warming is not None
