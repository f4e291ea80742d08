"""Helion's benchmark subprocess, started when the autotune starts instead of at its first
measurement.

Helion 1.5.1 measures every config in a long-lived spawn subprocess by default
(``autotune_benchmark_subprocess``; ``helion.autotuner.benchmark_worker.BenchmarkWorker``), and
starts it lazily: the first measurement pays a new interpreter, ``import torch, helion``, a CUDA
context and Triton's driver — 17–20 s on the H200 machine, in native fork mode and in ours alike,
on the autotuner's critical path (docs/gpu-runs.md, session 9: the first measurement of every
run). Here the provider starts that same worker when it is built and sends it :class:`WarmUp` on
a background thread, so the cold start overlaps the baseline, the codegen and the compiles. The
worker is Helion's own object and process, used afterwards exactly as Helion uses it (its
timeouts, respawn after a timeout or a sticky CUDA error, shutdown in ``cleanup``).

Earlier still, forked: most of that cold start is a new interpreter importing torch and Helion.
:func:`start_spare` (called by ``use()`` and ``install()``) forks the worker's process from the
caller instead — it inherits what is imported, in milliseconds — when that is safe: no CUDA
context in this process yet (a CUDA context does not survive a fork) and no other thread (one
holding a lock at the fork would leave it held in the child). The provider adopts that spare
(:func:`start_early`) and warms it (the CUDA context opens then); otherwise it spawns one as
Helion would. A spare no provider adopted is shut down when the last installation ends.

Threads: the process is started on the installing or constructing thread — Helion's worker sets
``PR_SET_PDEATHSIG``, which fires when the thread that started it exits, so a short-lived thread
must not start it — and only the warm-up job's round trip runs on the ``precompile-bench-warm``
thread. :class:`AfterWarmUp` makes every read of the provider's ``_benchmark_worker`` wait for
that round trip first, so two jobs never share the worker's pipe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import sys
import threading
import time
from typing import Any

_log = logging.getLogger(__name__)

STARTS_EARLY = True
"""``False``: leave Helion's worker to its own lazy start (the A/B: ``helion_bench``'s
``ours-fork-lateworker`` mode)."""

WARM_UP_TIMEOUT_FLOOR_S = 120.0
"""The warm-up job's timeout is at least this, and at least twice Helion's
``autotune_benchmark_timeout`` (30 s by default, "raised automatically on environments with a
heavier subprocess cold-start"): it is all cold start. Past it Helion's worker kills the process
and the first measurement starts a new one, as without this module."""


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """The job a new benchmark worker runs first: what every later job needs once.

    Attributes:
        device: the kernel's device (``"cuda:1"``); tensors that Helion saves for its jobs load
            back onto it, so its CUDA context is the one to open.
    """

    device: str

    def __call__(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        import helion.autotuner.benchmark_job  # noqa: F401  (what each BenchmarkJob imports)
        import torch
        from triton import runtime

        device = torch.device(self.device)
        if device.type == "cuda":
            torch.empty(1, device=device)  # the CUDA context, on the kernel's device
            torch.cuda.synchronize(device)
            runtime.driver.active.get_device_interface()  # Triton's driver and its utilities
        return {"pid": os.getpid(), "seconds": time.perf_counter() - t0}


class EarlyWorker:
    """A started ``BenchmarkWorker`` whose warm-up round trip runs on a background thread.

    Attributes:
        forked: its process is a spare forked by :func:`start_spare` (else spawned now).
    """

    def __init__(self, worker: Any, job: WarmUp, timeout: float, *, forked: bool) -> None:
        self.worker = worker
        self.forked = forked
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.ended: float | None = None
        if not forked:
            worker._start()  # on this thread: see the module's docstring (PR_SET_PDEATHSIG)
        self._thread = threading.Thread(
            target=self._warm, args=(job, timeout), name="precompile-bench-warm", daemon=True
        )
        self._thread.start()

    def _warm(self, job: WarmUp, timeout: float) -> None:
        try:
            self.result = self.worker.run(job, timeout=timeout)
        except BaseException as error:  # Helion's first real job restarts it, as without this
            self.error = error
            _log.debug("Helion's benchmark worker did not warm up: %r", error)
        finally:
            self.ended = time.perf_counter()

    def stop(self) -> None:
        """Kill the worker's process if its warm-up is still running, then wait for the round
        trip to end (it ends at once: the pipe closes)."""
        if self.ended is None:
            process = getattr(self.worker, "_process", None)
            if process is not None:
                with contextlib.suppress(Exception):
                    process.kill()
        self.join()

    def join(self) -> None:
        """Wait for the warm-up round trip (the worker's pipe is free after it)."""
        if self._thread is not threading.current_thread():
            self._thread.join()


def start_early(settings: Any, device: Any) -> EarlyWorker | None:
    """Start Helion's benchmark worker now (or adopt the spare), if Helion will measure in one."""
    import torch.distributed as dist
    from helion.autotuner.benchmark_worker import BenchmarkWorker

    if not STARTS_EARLY or dist.is_initialized():
        return None
    if not getattr(settings, "autotune_benchmark_subprocess", False):
        return None
    timeout = max(WARM_UP_TIMEOUT_FLOOR_S, 2.0 * float(settings.autotune_benchmark_timeout))
    worker = BenchmarkWorker(device=None)
    spare = _take_spare()
    if spare is not None:  # Helion's worker, its process and pipe made by start_spare()
        worker._process, worker._parent_connection = spare
    return EarlyWorker(worker, WarmUp(str(device)), timeout, forked=spare is not None)


_spare_lock = threading.Lock()
_spare: tuple[Any, Any, int] | None = None
"""The forked spare: (its ``multiprocessing`` process, the parent's end of its pipe, the pid
that forked it)."""

_FALSE = {"0", "false", "no", "off"}


def start_spare() -> bool:
    """Fork Helion's benchmark worker's process now, for the next provider to adopt, if that is
    safe (see the module's docstring) and Helion's environment does not turn its benchmark
    subprocess off. Returns whether a spare exists now."""
    global _spare
    with _spare_lock:
        if _spare is not None:
            return True
        if not STARTS_EARLY or threading.active_count() != 1:
            return False
        if os.environ.get("HELION_AUTOTUNE_BENCHMARK_SUBPROCESS", "1").strip().lower() in _FALSE:
            return False
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return False
        context = multiprocessing.get_context("fork")
        parent, child = context.Pipe(duplex=True)
        process = context.Process(
            target=_serve, args=(child,), name="helion-benchmark-worker", daemon=True
        )
        process.start()
        child.close()
        _spare = (process, parent, os.getpid())
        return True


def _take_spare() -> tuple[Any, Any] | None:
    """The spare's process and pipe, for a provider of the process that forked it; else None
    (a dead spare is reaped)."""
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is None:
        return None
    process, connection, pid = spare
    if pid != os.getpid():  # a fork of the installing process: not its child
        return None
    if not process.is_alive():
        _close(process, connection)
        return None
    return process, connection


def discard_spare() -> None:
    """Shut down a spare that no provider adopted (the last installation ended)."""
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is None or spare[2] != os.getpid():
        return
    process, connection, _pid = spare
    with contextlib.suppress(OSError):
        connection.send(None)  # Helion's worker loop returns on None
    process.join(timeout=5)
    _close(process, connection)


def _close(process: Any, connection: Any) -> None:
    if process.is_alive():
        process.kill()
        process.join(timeout=5)
    with contextlib.suppress(OSError):
        connection.close()


def _serve(connection: Any) -> None:
    """The spare's process: Helion's own worker loop (it imports Helion if the fork did not
    carry it)."""
    from helion.autotuner.benchmark_worker import _worker_loop

    _worker_loop(connection, None)


class AfterWarmUp:
    """The provider's ``_benchmark_worker``: reading it waits for an early worker's warm-up."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = f"_after_warm_up_{name}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        early: EarlyWorker | None = obj.__dict__.get("_early_benchmark_worker")
        if early is not None:
            early.join()
        return obj.__dict__.get(self._key)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self._key] = value
