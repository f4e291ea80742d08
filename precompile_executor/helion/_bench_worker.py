"""Helion's benchmark subprocess, started when the autotune starts instead of at its first
measurement.

Helion 1.5.1 measures every config in a long-lived spawn subprocess by default
(``autotune_benchmark_subprocess``; ``helion.autotuner.benchmark_worker.BenchmarkWorker``), and
starts it lazily: the first measurement pays a new interpreter, ``import torch, helion``, a CUDA
context and Triton's driver — 17–23 s on the H200 machine, in native fork mode and in ours alike,
on the autotuner's critical path (docs/gpu-runs.md, session 9: the first measurement of every
run). Here the provider starts that same worker when it is built and sends it :class:`WarmUp` on
a background thread, so the cold start overlaps the baseline, the codegen and the compiles. The
worker is Helion's own object and process, used afterwards exactly as Helion uses it (its
timeouts, respawn after a timeout or a sticky CUDA error, shutdown in ``cleanup``).

Threads: the process is started on the constructing (autotuner's) thread — Helion's worker sets
``PR_SET_PDEATHSIG``, which fires when the thread that started it exits, so a short-lived thread
must not start it — and only the warm-up job's round trip runs on the ``precompile-bench-warm``
thread. :class:`AfterWarmUp` makes every read of the provider's ``_benchmark_worker`` wait for
that round trip first, so two jobs never share the worker's pipe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
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
    """A started ``BenchmarkWorker`` whose warm-up round trip runs on a background thread."""

    def __init__(self, worker: Any, job: WarmUp, timeout: float) -> None:
        self.worker = worker
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.ended: float | None = None
        worker._start()  # on this thread: see the module's docstring (PR_SET_PDEATHSIG)
        self._thread = threading.Thread(
            target=self._warm, args=(job, timeout), name="precompile-bench-warm", daemon=True
        )
        self._thread.start()

    def _warm(self, job: WarmUp, timeout: float) -> None:
        try:
            self.result = self.worker.run(job, timeout=timeout)
        except BaseException as error:
            # A worker that cannot open its CUDA context would fail every config's measurement:
            # stop it, and Helion's first real job starts a new one, as without this module.
            self.error = error
            _log.warning("Helion's benchmark worker did not warm up (%r); restarting it", error)
            self._kill()  # not alive() after it: the next run() starts anew
        finally:
            self.ended = time.perf_counter()

    def _kill(self) -> None:
        process = getattr(self.worker, "_process", None)
        if process is not None:
            with contextlib.suppress(Exception):
                process.kill()
                process.join(timeout=5)

    def stop(self) -> None:
        """Kill the worker's process if its warm-up is still running, then wait for the round
        trip to end (it ends at once: the pipe closes). After the warm-up: nothing to stop."""
        if self.ended is None:
            self._kill()
        self.join()

    def join(self) -> None:
        """Wait for the warm-up round trip (the worker's pipe is free after it)."""
        if self._thread is not threading.current_thread():
            self._thread.join()


def start_early(settings: Any, device: Any) -> EarlyWorker | None:
    """Start Helion's benchmark worker now, if Helion will measure in one."""
    import torch.distributed as dist
    from helion.autotuner.benchmark_worker import BenchmarkWorker

    if not STARTS_EARLY or dist.is_initialized():
        return None
    if not getattr(settings, "autotune_benchmark_subprocess", False):
        return None
    timeout = max(WARM_UP_TIMEOUT_FLOOR_S, 2.0 * float(settings.autotune_benchmark_timeout))
    return EarlyWorker(BenchmarkWorker(device=None), WarmUp(str(device)), timeout)


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
