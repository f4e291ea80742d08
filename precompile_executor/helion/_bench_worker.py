"""Helion's benchmark subprocess, started before the autotune needs it.

Helion 1.5.1 measures every config in a long-lived spawn subprocess by default
(``autotune_benchmark_subprocess``; ``helion.autotuner.benchmark_worker.BenchmarkWorker``), and
starts it lazily: the first measurement pays a new interpreter, ``import torch, helion``, a CUDA
context and Triton's driver — 17–24 s on the H200 machine, in native fork mode and in ours alike,
on the autotuner's critical path (docs/gpu-runs.md, "Helion, fork mode": first measurement in every
run). A worker here is that same process — Helion's own loop, ``_worker_loop``, serving Helion's
jobs over its pipe — started earlier, in one of two ways:

* **the spare** (:func:`prestart`): ``install()`` starts one, adopted by the first provider
  built for its device (:func:`take`). Called at the top of a program, before Helion and torch
  are imported (:func:`prestart_before_helion`; ``use()`` there too), its cold start runs beside
  the program's own imports and is over before the autotune begins; called later
  (:func:`prestart_with_torch`), it still starts before the program's inputs and Helion's set-up.
  A ``use()`` block entered later starts none (a block that autotunes nothing would start and
  kill a process for nothing). Its process is spawned without importing Helion here
  (:func:`serve` imports it in the child); the provider wraps it in a ``BenchmarkWorker`` of its
  own (:meth:`EarlyWorker.adopt`). When the last holder of the scope leaves (``uninstall()``,
  the last open ``use()`` block's exit), a spare nobody took is killed.
* **the provider's own** (:func:`start_early`): where no spare fits (another device, none
  started), the provider starts Helion's worker when it is built.
* **kept** (:func:`keep`): while installed, a healthy, idle worker whose autotune ended becomes
  the spare for the next autotune, its cached arguments released first (:class:`Release`).

Each job runs with the autotuning process's ``TRITON_*`` variables of the moment
(:class:`InTritonEnvironment`), as in Helion's own worker, which is spawned inside the autotune.
Either way the worker first runs :class:`WarmUp` (the imports every benchmark job needs, the
CUDA context on the kernel's device) in a round trip on a background thread, and is afterwards
Helion's, used exactly as Helion uses it (its timeouts, its respawn after a timeout or a sticky
CUDA error, its shutdown in ``cleanup``). A warm-up that fails stops the worker, and Helion's next
job starts a fresh one, as without this module.

**Dying with the autotuning process.** Every worker process — the spare, the provider's, each of
Helion's respawns (:func:`worker_class` wraps ``_start``) — is registered with the integration's
guardian (``_state``; :class:`precompile_executor._process.Guardian`) as soon as its pid exists,
before it makes itself a process group leader; the guardian is started first. If this process
dies, even by SIGKILL, the guardian SIGKILLs each registered worker's group and the worker
itself at once; a worker is forgotten once it is dead and reaped. The ``multiprocessing``
resource tracker that the first spawn start brings up is the stdlib's, shared with the program:
it is not killed (it would skip its clean-up of what the program leaked) but ends by itself when
the last process holding its pipe — this one, then the worker, which inherits it — is gone
(``docs/helion.md``, "Helion's benchmark subprocess, started before the autotune"). Until the
guardian has its pid (the microseconds between the spawn and the registration) a spare also asks
the kernel for SIGKILL at its parent's death (``PR_SET_PDEATHSIG`` in :func:`serve`, before its
imports; Helion's loop arranges SIGTERM only after ``import helion``).

Threads and lifetime: a worker's process is started on the thread that calls ``install()``,
``use()`` or builds the provider, never on a short-lived one: ``PR_SET_PDEATHSIG`` fires when the
thread that started it exits. Only the warm-up round trip runs on the ``precompile-bench-warm``
thread; :class:`AfterWarmUp` makes every read of the provider's ``_benchmark_worker`` wait for it,
so two jobs never share the pipe. ``STATE.lock`` guards the spare (``_state.HelionState``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from .. import _process
from ._state import STATE

_log = logging.getLogger(__name__)

STARTS_EARLY = True
"""``False``: leave Helion's worker to its own lazy start (the A/B: ``helion_bench``'s
``ours-fork-lateworker`` mode); no spare is started either."""

WARM_UP_TIMEOUT_FLOOR_S = 120.0
"""The warm-up job's timeout is at least this, and at least twice Helion's
``autotune_benchmark_timeout`` (30 s by default, "raised automatically on environments with a
heavier subprocess cold-start"): it is all cold start. Past it the worker is killed and the first
measurement starts a new one, as without this module."""

SUBPROCESS_VARIABLE = "HELION_AUTOTUNE_BENCHMARK_SUBPROCESS"
TIMEOUT_VARIABLE = "HELION_AUTOTUNE_BENCHMARK_TIMEOUT"
_FALSE = ("0", "false", "no", "off")


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


@dataclasses.dataclass(frozen=True)
class Release:
    """The job a worker runs when its autotune ended and it stays for the next one: Helion's
    worker keeps every autotune's kernel arguments and baseline output cached by file path
    (``functools.cache``), on the GPU; drop them and give the memory back.

    Attributes:
        device: the device it warmed for, kept as the spare's.
    """

    device: str

    def __call__(self) -> dict[str, Any]:
        import gc

        import torch
        from helion.autotuner import benchmark_job, kernel_args

        for cached in RELEASED_CACHES:
            module = benchmark_job if hasattr(benchmark_job, cached) else kernel_args
            getattr(module, cached).cache_clear()
        gc.collect()
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()
        return {"pid": os.getpid(), "released": True}


RELEASED_CACHES = (
    "load_trusted_kernel_args",
    "load_private_kernel_args",
    "_load_trusted_baseline_output",
)
"""Helion's worker-side caches keyed by an autotune's files (``kernel_args``, ``benchmark_job``);
the seam checks that each still has ``cache_clear``."""


@dataclasses.dataclass(frozen=True)
class InTritonEnvironment:
    """A Helion job, run with the ``TRITON_*`` variables the autotuning process had when it sent
    the job.

    Helion's own worker is spawned inside the autotune, so it inherits what Helion sets there:
    ``TRITON_CACHE_DIR`` pointing at the autotune's temporary cache (the precompiles fill it),
    ``TRITON_LOCAL_BUILD``, ``TRITON_STORE_BINARY_ONLY``. A worker started earlier has the
    program's variables instead, and would compile every config again into the program's own
    cache (measured on the H200: each measurement 2.7× native's). Each job carries them.

    Attributes:
        job: Helion's job (``BenchmarkJob``, ``AccuracyCheckJob``, ...).
        triton_env: the autotuning process's ``TRITON_*`` variables when it sent the job.
    """

    job: Any
    triton_env: dict[str, str]

    def __call__(self) -> Any:
        from ._spawn_task import in_triton_environment

        with in_triton_environment(self.triton_env):
            return self.job()


@functools.cache
def worker_class() -> type:
    """Helion's ``BenchmarkWorker``, whose ``run`` sends each job :class:`InTritonEnvironment`
    and whose every process is watched by the guardian from its start to its death
    (everything else, timeouts and respawns included, is Helion's)."""
    from helion.autotuner.benchmark_worker import BenchmarkWorker

    from ._spawn_task import triton_environment

    class InTheAutotunesEnvironment(BenchmarkWorker):  # type: ignore[misc]
        idle = True
        """Whether no job's round trip is open: ``False`` while ``run`` waits, and after a
        wait cut short (Ctrl-C) whose answer may still come down the pipe — such a worker is
        never kept for another autotune (:func:`keep`)."""

        def run(self, job: Any, timeout: float) -> Any:
            self.idle = False
            try:
                result = super().run(InTritonEnvironment(job, triton_environment()), timeout)
            except Exception:
                # The job's own error came back, or Helion killed the worker (a timeout, a
                # death): either way nothing more comes down this pipe.
                self.idle = True
                raise
            self.idle = True
            return result

        def _start(self) -> None:
            # Helion's own start (also its respawn after a timeout or a sticky CUDA error),
            # watched by the guardian from the moment its pid exists.
            STATE.guardian.fileno()  # the guardian runs before the worker exists
            super()._start()
            STATE.guardian.watch(self._process.pid)

        def _kill(self) -> None:
            process = self._process
            super()._kill()
            _forget_if_dead(process)

    return InTheAutotunesEnvironment


def _forget_if_dead(process: Any) -> None:
    """Stop watching ``process`` once it is dead and reaped (its pid may be reused then); one
    still alive (Helion's "unkillable" worker) stays watched."""
    if process is None or process.pid is None:
        return
    with contextlib.suppress(Exception):
        if process.is_alive():
            return
    STATE.guardian.forget(process.pid)


def serve(connection: Any, parent_pid: int) -> None:
    """A spare's process: Helion's benchmark worker loop, entered as Helion's own worker enters
    it, after dying with the parent is arranged (Helion's loop arranges it only after
    ``import helion``, 10+ s later)."""
    with contextlib.suppress(OSError):
        os.setsid()  # its own process group, as Helion's loop makes it: killpg reaches ptxas too
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl: nobody to serve
        os._exit(0)
    from helion.autotuner.benchmark_worker import _worker_loop

    _worker_loop(connection, None)


class EarlyWorker:
    """A benchmark worker's process and pipe, whose warm-up round trip runs on a background
    thread. ``worker`` is Helion's ``BenchmarkWorker`` over them (``None`` for a spare that no
    provider adopted yet)."""

    def __init__(
        self, process: Any, connection: Any, job: WarmUp | Release, timeout: float
    ) -> None:
        self.process = process
        self.connection = connection
        self.device = job.device
        self.worker: Any = None
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.cold = not isinstance(job, Release)  # a new process, not a kept one
        self._stopping = False  # stop() or discard() kills it on purpose: no warning then
        self._thread = threading.Thread(
            target=self._warm, args=(job, timeout), name="precompile-bench-warm", daemon=True
        )
        self._thread.start()

    @classmethod
    def start(cls, worker: Any, job: WarmUp, timeout: float) -> EarlyWorker:
        """Start Helion's ``worker`` (its own ``_start()``, on this thread) and warm it up."""
        worker._start()
        early = cls(worker._process, worker._parent_connection, job, timeout)
        early.worker = worker
        return early

    def adopt(self) -> Any:
        """Helion's ``BenchmarkWorker`` over this process and pipe (a spare's, taken by a
        provider): Helion's ``run()`` sends its jobs there, ``shutdown()`` ends it."""
        worker = worker_class()(device=None)
        worker._process = self.process
        worker._parent_connection = self.connection
        self.worker = worker
        return worker

    def _warm(self, job: WarmUp | Release, timeout: float) -> None:
        try:
            self.connection.send(job)
            if not self.connection.poll(timeout):
                raise TimeoutError(f"no answer to its warm-up within {timeout:.0f} s")
            result = self.connection.recv()
            if isinstance(result, BaseException):
                raise result
            self.result = result
        except BaseException as error:
            # A worker that cannot open its CUDA context would fail every config's measurement:
            # stop it, and Helion's first real job starts a new one, as without this module.
            self.error = error
            if not self._stopping:
                _log.warning("Helion's benchmark worker did not warm up (%r); restarting it", error)
            self._kill()  # not alive() after it: Helion's next run() starts anew
            with contextlib.suppress(Exception):
                self.connection.close()  # this thread's own poll is over
        finally:
            self.ended = time.perf_counter()

    def _kill(self) -> None:
        # The process group (its ptxas too) and the process itself, which has no group of its
        # own until serve() or Helion's loop calls setsid. The pipe stays open: closing it under
        # the warm-up thread's poll() would not wake that thread; the process's death does (EOF).
        with contextlib.suppress(Exception):
            _process.kill_group(self.process.pid, grace_s=0)
        with contextlib.suppress(Exception):
            self.process.join(timeout=5)
        _forget_if_dead(self.process)

    def starting(self) -> bool:
        """Whether its cold start (a new process's :class:`WarmUp` round trip) is still under
        way, told without waiting: ``False`` once it answered, failed or was stopped, and for a
        kept worker releasing its last autotune's caches (warm already)."""
        return self.cold and self.ended is None

    def warm_up_s(self) -> float | None:
        """Seconds from its start to the end of its warm-up round trip (``None``: not over)."""
        return None if self.ended is None else self.ended - self.started

    def usable(self) -> bool:
        """Whether a provider can still take it: not failed, not dead."""
        return self.error is None and self.process.is_alive()

    def stop(self) -> None:
        """Kill the worker's process if its warm-up is still running, then wait for the round
        trip to end (it ends at once: the pipe closes). After the warm-up: nothing to stop."""
        if self.ended is None:
            self._stopping = True
            self._kill()
        self.join()

    def discard(self) -> None:
        """End it for good (a spare nobody took): the process and the pipe."""
        self._stopping = True
        self._kill()
        self.join()
        with contextlib.suppress(Exception):
            self.connection.close()

    def join(self) -> None:
        """Wait for the warm-up round trip (the worker's pipe is free after it)."""
        if self._thread is not threading.current_thread():
            self._thread.join()


def _warm_up_timeout(benchmark_timeout: float) -> float:
    return max(WARM_UP_TIMEOUT_FLOOR_S, 2.0 * benchmark_timeout)


def start_early(settings: Any, device: Any) -> EarlyWorker | None:
    """Start Helion's benchmark worker now, if Helion will measure in one."""
    if not wants_worker(settings):
        return None
    timeout = _warm_up_timeout(float(settings.autotune_benchmark_timeout))
    return EarlyWorker.start(worker_class()(device=None), WarmUp(str(device)), timeout)


def wants_worker(settings: Any) -> bool:
    """Whether a provider with these settings measures in Helion's benchmark subprocess."""
    import torch.distributed as dist

    return (
        STARTS_EARLY
        and bool(getattr(settings, "autotune_benchmark_subprocess", False))
        and not dist.is_initialized()
    )


# -- the spare (kept in STATE: see _state) ---------------------------------------------------------


def bootstrapping() -> bool:
    """Whether this process is a spawn child still importing its parent's main module (which
    may call ``install()`` at its top): it must start no process. The flag is the one CPython's
    ``multiprocessing.spawn._check_not_importing_main`` reads for the same purpose."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def prestart(device: str, benchmark_timeout: float) -> EarlyWorker | None:
    """Start a spare benchmark worker for ``device`` (``"cuda:0"``), unless one is there."""
    if not STARTS_EARLY or bootstrapping():
        return None
    with STATE.lock:
        if STATE.spare is not None and STATE.spare.usable():
            return None
        stale, STATE.spare = STATE.spare, None
        context = multiprocessing.get_context("spawn")  # as Helion's worker: no fork of CUDA
        parent, child = context.Pipe(duplex=True)
        process = context.Process(
            target=serve, args=(child, os.getpid()), daemon=True, name="helion-benchmark-worker"
        )
        STATE.guardian.fileno()  # the guardian runs before the worker exists
        process.start()
        assert process.pid is not None  # started
        STATE.guardian.watch(process.pid)
        child.close()
        spare = EarlyWorker(process, parent, WarmUp(device), _warm_up_timeout(benchmark_timeout))
        STATE.spare = spare
    if stale is not None:
        stale.discard()
    return spare


def prestart_before_helion() -> EarlyWorker | None:
    """``install()`` at the top of a program, before Helion and torch are imported: start the
    spare from what the environment says, for the first GPU this process sees.

    Nothing starts when Helion's settings will not measure in a subprocess
    (``HELION_AUTOTUNE_BENCHMARK_SUBPROCESS=0``), under ``torchrun`` (``WORLD_SIZE`` > 1: Helion
    measures in-process there), or when no NVIDIA GPU is visible (no ``/dev/nvidiactl``, or
    ``CUDA_VISIBLE_DEVICES`` empty) — asking CUDA here would initialise it in this process.
    """
    if os.environ.get(SUBPROCESS_VARIABLE, "1").strip().lower() in _FALSE:
        return None
    if _int_env("WORLD_SIZE", 1) > 1:
        return None
    if not gpu_visible():
        return None
    return prestart(FIRST_GPU, float(_int_env(TIMEOUT_VARIABLE, 30)))


NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"
"""Present where the NVIDIA driver is loaded (a GPU machine, or a container given its GPUs)."""
FIRST_GPU = "cuda:0"
"""The device a spare started before torch is imported warms: the first GPU this process sees
(``CUDA_VISIBLE_DEVICES`` applies in the worker as here)."""


def gpu_visible() -> bool:
    """Whether this process will see an NVIDIA GPU, told without asking CUDA (which would
    initialise it here): the driver's control device exists and ``CUDA_VISIBLE_DEVICES`` does
    not hide every GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-")):
        return False
    return os.path.exists(NVIDIA_CONTROL_DEVICE)


def prestart_with_torch() -> EarlyWorker | None:
    """``install()`` with Helion imported: start the spare for the current CUDA device, if
    Helion's default settings measure in a subprocess and a GPU is visible (told without asking
    CUDA, as :func:`gpu_visible` does)."""
    import torch
    from helion.runtime.settings import Settings

    if spare() is not None:  # install() at the top started it: leave CUDA alone here
        return None
    settings = Settings()
    if not wants_worker(settings) or not gpu_visible():
        return None
    # Not torch.cuda.current_device() before CUDA is initialised: it would initialise it here
    # (and the driver, which a later fork of this process cannot use); until then it is 0.
    initialised = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    index = torch.cuda.current_device() if initialised else 0
    return prestart(f"cuda:{index}", float(settings.autotune_benchmark_timeout))


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "").strip() or default)
    except ValueError:
        return default  # Helion's own settings report the bad value


def device_key(device: Any) -> str:
    """``"cuda:N"`` for a CUDA device (the current one when it names no index), else its
    type: how a spare and a kernel's device are compared."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index}"


def take(device: Any) -> EarlyWorker | None:
    """The spare, adopted for a provider on ``device``, or ``None``: none started, it failed or
    died, or it warms another device (then it is discarded: the provider starts its own)."""
    with STATE.lock:
        spare: EarlyWorker | None = STATE.spare
        STATE.spare = None
    if spare is None:
        return None
    if not spare.usable() or spare.device != device_key(device):
        spare.discard()
        return None
    spare.adopt()
    return spare


def keep(worker: Any, device: Any) -> bool:
    """Keep Helion's ``worker``, whose autotune ended, as the spare for the next autotune on
    ``device`` (instead of Helion's shutdown): while ``install()`` or ``use()`` is active, it is
    alive, healthy and idle (no round trip open), and no spare is there. It first releases the
    autotune's cached arguments (:class:`Release`). Returns whether it was kept; if not, the
    caller shuts it down."""
    if not STARTS_EARLY or not STATE.active():
        return False
    if getattr(worker, "_fatal_error", None) is not None or not worker.alive():
        return False
    if not getattr(worker, "idle", False):  # a wait cut short: its answer may still come
        return False
    process, connection = worker._process, worker._parent_connection
    timeout = WARM_UP_TIMEOUT_FLOOR_S
    with STATE.lock:
        if STATE.spare is not None:
            return False
        kept = EarlyWorker(process, connection, Release(device_key(device)), timeout)
        STATE.spare = kept
    if not STATE.active():
        # The last holder left between the check above and now, and its exit found no spare
        # to doom: nothing will take this one (the lock order forbids asking under the lock).
        discard()
    return True


def discard() -> None:
    """Kill the spare, if nobody took it (the last holder went away)."""
    with STATE.lock:
        spare, STATE.spare = STATE.spare, None
    if spare is not None:
        spare.discard()


def spare() -> EarlyWorker | None:
    """The spare waiting for a provider, if any (for tests and benchmarks)."""
    with STATE.lock:
        found: EarlyWorker | None = STATE.spare
    return found


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
