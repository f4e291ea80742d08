"""One ``@triton.autotune`` call on a new tuning key, with its configs compiled in workers.

::

    Autotuner.run(*args, **kwargs)            [seam's patched_run → run(): the autotuner's lock,
                                               a Tune for this call]
      prune_configs(kwargs)                   [patched_prune_configs: tune.configs = pruned]
      check_disk_cache / benchmark()          Triton's own; a disk hit never reaches _bench
        _bench(config=pruned[0])              [patched_bench → tune.timing]
          first call: announce the module ──► workers import it (_preimport, high priority)
                      compile_configs()  ───► one compile per config in the executor
                      (AsyncCompileMode,        (held as a batch: longest predicted first)
                       batch held)
                      no worker compiling ────► Feeder.fill() (_lanes.py): up to CALLER_LANES
                        for the tune              queued compiles, shortest predicted first,
                                                  CompileJob.reroute()d to caller lanes: threads
                                                  here that compile while this thread benchmarks
                      as each lands ─────────── FutureKernel.result(): into the JIT's cache
                        identical to one timed? ─ _merged(): the same binary and launch
                          yes: not launched       (_identical.py): takes that one's timing
                        original _bench(config)   do_bench, hooks, launches: Triton's own
                      none landed, none running ─ _steal() (no lanes, or none free): cancel()
                        nor in a lane             the shortest queued one; original
                                                  _bench(config): Triton's launch compiles it here
                      screening (the default):    _screen(): a short do_bench budget as they
                        each config screened, the   land, then Triton's full budget for the
                        finalists timed in full     leaders (_screening.py's rules), over
                                                    distinct kernels only
                      not screened (screening=    _confirm(): timed again if timed while
                        False, an own do_bench=,    compiles still ran
                        ≤ 3 configs): all landed,
                        leaders within
                        CONFIRM_MARGIN, again
          → its timing
        _bench(config=pruned[i])             → the timing measured above (an identical
                                                kernel's, for a config merged into it)
      self.fn.run(best config)                Triton's own launch
    close(): cancel what is still queued; drop our entries from the JIT's memory

A compile that crashed, hung or outgrew its worker (``WorkerCrashedError`` — a node lost by a
cluster backend is one too —, ``TaskTimeoutError``, ``TaskMemoryError``; a stdlib pool's
``BrokenExecutor``, any ``TimeoutError``, a cancellation) is timed ``inf`` without a launch
and logged once with the worker's captured output. Any other failed compile is left to Triton:
the JIT's cache holds a stand-in that raises the worker's exception (a proxy of the same class)
at launch, so ``_bench`` maps ``OutOfResources``, ``PTXASError`` and
``CompileTimeAssertionFailure`` to ``inf`` and lets anything else propagate, exactly as stock
Triton does, and if every config fails, Triton's final launch raises it. Nothing failed is ever
compiled again in this process. A kernel a worker could not load (``KernelTransferError``) is
compiled here by Triton's own launch, as stock. A compile that ran in a caller lane ends exactly
as a worker's: its kernel or its exception (the compiler's own, not a proxy: the same class, so
the same ``inf`` or the same propagation) goes through the same job future and the same stand-in.

Threads: a tune runs entirely on the thread that launched the kernel, under the autotuner's
lock (:func:`tuning_lock`); its compiles' futures resolve on the executor's threads, or on a
lane's thread, which also moves the tune's next queued compile to a lane as its own lands.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, CancelledError, Future, wait
from typing import Any

from triton.runtime import _async_compile
from triton.runtime._async_compile import AsyncCompileMode, FutureKernel

from .._costs import triton_prior_s
from .._errors import TaskMemoryError, WorkerCrashedError
from . import _autotune_guard as _guard
from . import _identical, _lanes, _screening
from ._async import TritonCompileExecutor
from ._costs import block_sizes
from ._errors import KernelTransferError
from ._kernel_ref import unwrap_jit_function
from ._preimport import announce, module_of
from ._state import STATE
from ._submit import default_executor
from ._warm import ConfigCompile, PreHookError, compile_configs, holding_batch

logger = logging.getLogger("precompile_executor.triton.autotune")

INF_TIMING = [float("inf")] * 3
"""What Triton's ``_bench`` returns for a config that cannot run (one value per quantile)."""

CONFIRM_MARGIN = 0.15
"""How much a benchmark taken while workers still compile may overstate a config's time: on the
H200 the matmul's leaders screened so came out up to 14 % above stock's timings of them
(docs/triton.md, "Timing integrity"). Load only ever adds time, so a config screened more than
this above the best one is slower than it whatever the load did; only the leaders within it can
swap places."""

STEALS = True
"""Whether this process compiles a tune's queued configs while no worker is ready for them: in
the caller lanes, beside the tune's thread (``_lanes.py``; ``PrecompileExecutor`` only), else on
the tune's own thread when it has nothing to benchmark (``Tune._steal``). It keeps a cold start —
workers still starting or importing the kernel's module — from ever being slower than stock
Triton, at one cost: a config compiled here is not isolated, so a compile that crashes takes this
process down (as in stock Triton). ``False``: every config compiles in the executor (no lanes
either)."""

MERGES_IDENTICAL = True
"""Whether a tune times once the configs whose compiled kernels are identical (the same binary
and launch: ``_identical.identity``), giving the others that timing. Timing each again only
adds noise to Triton's ``min`` among equal kernels, costs a full ``do_bench`` each, and, with
screening, lets copies of one kernel fill the finalists (docs/triton.md, "Identical kernels").
``False``: every config is timed, as in stock Triton."""

_LAUNCH_ONLY = ("grid", "warmup")
"""Keyword arguments of ``Autotuner.run`` that belong to the launch, not to the kernel."""

_running: contextvars.ContextVar[tuple[Tune, ...]] = contextvars.ContextVar(
    "precompile_executor_triton_tunes", default=()
)

_tuning_locks: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_tuning_locks_lock = threading.Lock()


def _refusal(error: BaseException | None) -> bool:
    """Whether a config's send failed because the executor takes no tasks: broken
    (``BrokenExecutor``) or shut down (the ``RuntimeError`` whose message the stdlib's pools and
    ours share, ``AFTER_SHUTDOWN``; "… after interpreter shutdown" at exit)."""
    return isinstance(error, BrokenExecutor) or (
        isinstance(error, RuntimeError) and "cannot schedule new futures after" in str(error)
    )


def _report_refusal(executor: Any, autotuner: Any, error: BaseException) -> None:
    """Warn, once per executor, that it refused a tune's compiles: every tune it refuses then
    compiles in this process, as stock Triton does — correct, but not what ``use(executor)``
    asked for, so it must not pass unseen (a debug line per config says the rest)."""
    with STATE.lock:
        try:
            if executor in STATE.refused:
                return
            STATE.refused.add(executor)
        except TypeError:  # not weak-referenceable: report every time rather than never
            pass
    logger.warning(
        "%s: the executor (%s) refused its compiles (%s: %s): Triton compiles its configs in "
        "this process, and so every tune it refuses. To compile in workers, pass use() or "
        "install() an executor that is not shut down or broken (None: the shared default).",
        _name(autotuner),
        type(executor).__name__,
        type(error).__name__,
        error,
    )


def tuning_lock(autotuner: Any) -> threading.RLock:
    """The lock one autotuner's calls take while the seam is on (one per autotuner).

    Stock Triton keeps a call's arguments in ``Autotuner.nargs`` for the duration of the call,
    shared by every thread: two threads tuning one kernel at once read each other's (or
    ``None``) and crash (https://github.com/triton-lang/triton/issues/11494), and would compile
    every config twice. Holding this lock, a second thread waits for the first one's tune and
    then finds the key in ``self.cache`` (``Autotuner.run`` checks it itself).
    """
    with _tuning_locks_lock:
        lock = _tuning_locks.get(autotuner)
        if lock is None:
            lock = _tuning_locks[autotuner] = threading.RLock()
        return lock


def run(
    autotuner: Any,
    executor: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    screening: bool,
) -> Any:
    """``Autotuner.run`` with a :class:`Tune` recorded for the duration of the call.

    Args:
        autotuner: the ``Autotuner``.
        executor: where to compile (``None``: the shared default executor).
        args: the launch's positional arguments.
        kwargs: its keyword arguments (``grid``, ``warmup`` included).
        screening: the block's option (``use()``'s default: on): screen the configs with a
            short budget and time only the leaders with Triton's full one (docs/triton.md,
            "Screening"); ``False`` gives every config the full budget. Ignored for a kernel
            with its own ``do_bench=``.
    """
    original = STATE.originals["run"]
    if _async_compile.active_mode.get() is not None:
        # Inside the caller's own AsyncCompileMode: Triton's behaviour, untouched.
        return original(autotuner, *args, **kwargs)
    if _guard.goes_to_stock(autotuner):
        # A launch of this kernel once missed its workers' compile (already logged): stock
        # Triton tunes it, compiling each config once (docs/triton.md, "Where each config
        # compiled").
        with tuning_lock(autotuner):
            return original(autotuner, *args, **kwargs)
    with tuning_lock(autotuner):
        tune = Tune(autotuner, executor, args, kwargs, screening=screening)
        token = _running.set((*_running.get(), tune))
        failed = True
        try:
            result = original(autotuner, *args, **kwargs)
            failed = False
            return result
        finally:
            _running.reset(token)
            tune.close(failed=failed)


def patched_prune_configs(self: Any, kwargs: dict[str, Any]) -> Any:
    """``Autotuner.prune_configs``; hands the pruned list to this call's tune."""
    pruned = STATE.originals["prune_configs"](self, kwargs)
    tune = _tune_of(self)
    if tune is not None and tune.configs is None:
        tune.configs = list(pruned)
    elif tune is None and _guard.goes_to_stock(self):
        _guard.count(self, stock_tunes=1)
    return pruned


def patched_bench(self: Any, *args: Any, config: Any, **meta: Any) -> Any:
    """``Autotuner._bench``; the configs of a tune are timed as their compiles land."""
    original = STATE.originals["_bench"]
    tune = _tune_of(self)
    if tune is None or not tune.covers(config):
        return original(self, *args, config=config, **meta)
    return tune.timing(config, lambda c: original(self, *args, config=c, **meta))


def _tune_of(autotuner: Any) -> Tune | None:
    for tune in reversed(_running.get()):
        if tune.autotuner is autotuner:
            return tune
    return None


class _FailedCompile:
    """Stands in the JIT's kernel cache for a config whose compile failed in a worker.

    The JIT's launch reads attributes of the cached kernel (``launch_metadata``, ``run``);
    each read raises the worker's exception, so Triton handles it as it would have handled the
    same failure of its own compile, and the config is not compiled again in this process.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        raise self.error.with_traceback(None)


@dataclasses.dataclass(eq=False)
class _Entry:
    """One pruned config of a tune: its compile, and where the JIT caches its kernel."""

    compiled: ConfigCompile
    future: Future[Any] | None
    cache: dict[Any, Any] | None
    key: Any
    outcome: Any = None
    """Its timing, or the exception ``_bench`` raised for it (re-raised on its turn)."""
    measured: bool = False
    quiet: bool = False
    """Its timing began once every compile of the tune had landed (no compile ran during it)."""
    screened: Any = None
    """Its first timing, when a quiet re-measurement replaced it (``Tune._confirm``), or its
    screen, when a full timing replaced it (``Tune._screen``)."""
    short: bool = False
    """Its timing is a screen (the short budget), not Triton's full one (``Tune._screen``)."""
    same: _Entry | None = None
    """The config of this tune whose compiled kernel is identical to its own and that was timed
    for both (docs/triton.md, "Identical kernels"); this one is never timed itself."""
    here: bool = False
    """Its compile was taken back from the executor's queue before any worker started it, and
    compiled in this process by Triton's own launch (``Tune._steal``). A compile moved to a
    caller lane is not ``here``: its job's future lands it as a worker's would
    (``CompileJob.rerouted``)."""
    missed: bool = False
    """Its launch compiled here a kernel under a key no worker produced (``Tune._guarded``)."""

    @property
    def config(self) -> Any:
        return self.compiled.config


def _predicted_s(config: Any) -> float:
    """The prior of a config's compile from what the config itself sets (its block sizes and
    ``num_warps``; the executor's history refines the order of the held batch)."""
    return triton_prior_s(block_sizes(config.kwargs), num_warps=config.num_warps or 4)


def is_isolation_failure(exc: BaseException) -> bool:
    """Return whether a compile failed by crashing, hanging or losing its worker (not a
    compiler error): Triton would have died or hung with it, so it is timed ``inf``."""
    return isinstance(
        exc,
        WorkerCrashedError | TaskMemoryError | BrokenExecutor | TimeoutError | CancelledError,
    )


class Tune:
    """The state of one ``Autotuner.run`` call while it benchmarks a new tuning key.

    Created for every call, it costs nothing until ``prune_configs`` runs (a new key) and the
    first config reaches ``_bench`` (no disk-cache hit, more than one config).

    Attributes:
        autotuner: the ``Autotuner`` being run.
        configs: the pruned configs, once ``prune_configs`` has run.
    """

    # One is made per launch of an autotuned kernel while the mode is on: keep it small.
    __slots__ = (
        "_adapter",
        "_args",
        "_entries",
        "_executor",
        "_feeder",
        "_kinds",
        "_kwargs",
        "_logged",
        "_rungs",
        "_screened",
        "_screening",
        "_stock",
        "autotuner",
        "configs",
    )

    def __init__(
        self,
        autotuner: Any,
        executor: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        *,
        screening: bool,
    ) -> None:
        self.autotuner = autotuner
        self.configs: list[Any] | None = None
        self._screening = screening
        self._screened = False  # screening ran to its end: the screens left stand as timings
        # distinct kernels screened, screened again quietly, timed in full (statistics())
        self._rungs = {"screened": 0, "rescreened": 0, "timed_in_full": 0}
        self._executor = executor
        self._args = args
        self._kwargs = kwargs  # the launch's, ``grid`` and ``warmup`` included
        self._adapter: TritonCompileExecutor | None = None
        self._feeder: _lanes.Feeder | None = None
        self._entries: dict[Any, _Entry] = {}
        # identity → the config timed for it; None: nothing of this tune is merged
        self._kinds: dict[Any, _Entry] | None = (
            {} if MERGES_IDENTICAL and _identical.mergeable(autotuner) else None
        )
        self._logged: set[int] | None = None
        self._stock = False  # the guard saw a miss: the rest of the tune is stock Triton's

    def covers(self, config: Any) -> bool:
        """Return whether ``config`` is one of this tune's pruned configs."""
        return self.configs is not None and any(c is config for c in self.configs)

    def timing(self, config: Any, bench: Callable[[Any], Any]) -> Any:
        """Return ``config``'s timing; the first call submits and benchmarks every config.

        Args:
            config: the config Triton's loop asks for.
            bench: Triton's ``_bench`` for a config, with this call's arguments.
        """
        if self._adapter is None:
            self._submit()
            screen = None
            if self._screening and _screening.pays(len(self._entries)):
                screen = screening_benchmarker(self.autotuner)
            self._bench_as_landed(bench, screen)
        entry = self._entries.get(config)
        if entry is None:  # not among the submitted configs: Triton compiles it itself
            return bench(config)
        same = entry.same
        if same is not None and same.measured and not (same.short and not self._screened):
            entry = same  # an identical kernel's timing, or what its launch raised
        elif not entry.measured:  # the loop above stopped at an error; go on in Triton's order
            return self._measure(entry, bench)
        if isinstance(entry.outcome, BaseException):
            raise entry.outcome.with_traceback(None)
        if entry.short and not self._screened:
            # Screening stopped early (an error, the guard's fall-back to stock): a screen must
            # not compete with full timings in Triton's min, so this config is timed in full.
            return self._measure(entry, bench)
        return entry.outcome

    def _submit(self) -> None:
        executor = self._executor if self._executor is not None else default_executor()
        announce(executor, [module_of(self.autotuner)])  # workers import it while they wait
        self._adapter = adapter = TritonCompileExecutor(executor)
        configs = self.configs or []
        token = _async_compile.active_mode.set(AsyncCompileMode(adapter, ignore_errors=True))
        kwargs = {k: v for k, v in self._kwargs.items() if k not in _LAUNCH_ONLY}
        try:
            # The first wave — the predicted shortest compiles, one per worker, shortest first —
            # starts as each is submitted, so benchmarking begins as early as it can and has
            # configs to time while the longer ones compile. The rest are queued as one batch
            # before any starts, so the executor starts the longest predicted first
            # (PrecompileExecutor.batch(); other executors: as submitted). docs/triton.md,
            # "Order of the compiles".
            workers = getattr(executor, "max_workers", None)
            ranked = sorted(configs, key=_predicted_s)
            wave = max(1, workers) if isinstance(workers, int) else len(ranked)
            first, rest = ranked[:wave], ranked[wave:]
            compiled = compile_configs(self.autotuner, self._args, kwargs, first, adapter)
            if rest:
                with holding_batch(executor):
                    compiled += compile_configs(self.autotuner, self._args, kwargs, rest, adapter)
        finally:
            _async_compile.active_mode.reset(token)
        refused = next((one.error for one in compiled if _refusal(one.error)), None)
        if refused is not None:
            _report_refusal(executor, self.autotuner, refused)
        for one in compiled:
            kernel = one.kernel
            future = kernel.future if isinstance(kernel, FutureKernel) else None
            cache, key = jit_cache_slot(kernel) if future is not None else (None, None)
            self._entries[one.config] = _Entry(one, future, cache, key)
        hook_errors = [one.error for one in compiled if isinstance(one.error, PreHookError)]
        if hook_errors:
            self._fall_back(f"{hook_errors[0]}")
            if one.error is not None:
                logger.debug(
                    "%s: config %s could not be sent to a worker (%s: %s); Triton compiles it "
                    "in this process",
                    _name(self.autotuner),
                    one.config,
                    type(one.error).__name__,
                    one.error,
                )

    def _bench_as_landed(
        self, bench: Callable[[Any], Any], screen: Callable[..., Any] | None = None
    ) -> None:
        """Benchmark every config whose compile is done or in memory, in the order they land;
        while no worker compiles for the tune, keep up to ``CALLER_LANES`` queued compiles
        running in the caller lanes (:meth:`_feeder_for`); while none has landed, none runs in
        a lane and a compile is still queued, compile that one here, as stock Triton would
        (:meth:`_steal`). Then, with ``screen`` (a short
        budget benchmarker: screening), time the leaders with the full budget (:meth:`_screen`);
        without, re-measure the leaders timed while compiles still ran, if they are within noise
        of each other (:meth:`_confirm`). Stop at the first exception (Triton's loop re-raises it
        on that config's turn)."""
        order = {id(config): i for i, config in enumerate(self.configs or [])}
        entries = sorted(self._entries.values(), key=lambda e: order.get(id(e.config), 0))
        by_future: dict[Future[Any], list[_Entry]] = {}
        for entry in entries:
            if entry.future is not None:
                by_future.setdefault(entry.future, []).append(entry)
        ready = [e for e in entries if e.future is None and e.compiled.error is None]
        waiting = set(by_future)

        def record(entry: _Entry) -> bool:
            if self._merged(entry):
                return True  # an identical kernel is timed for it
            if not self._timed(entry, bench, screen):
                return False
            if entry.here:  # compiled by its launch: its kernel is known only now
                self._merged(entry)
            return True

        for entry in ready:
            if not record(entry):
                return
        feeder = self._feeder = self._feeder_for(by_future) if STEALS else None
        while waiting:
            if feeder is not None:
                feeder.fill()  # while no worker compiles for the tune: lanes compile beside us
            # In Triton's order: of identical kernels landing together, the first config is timed.
            landed = sorted(
                (f for f in waiting if f.done()),
                key=lambda f: order.get(id(by_future[f][0].config), 0),
            )
            if not landed:
                stolen = None
                if STEALS and (feeder is None or not feeder.in_flight):
                    # No lane (none here, or every one busy with another tune's compiles):
                    # this thread compiles one itself rather than wait for no one.
                    stolen = self._steal(waiting, by_future)
                if stolen is None:
                    wait(waiting, return_when=FIRST_COMPLETED)
                    continue
                landed = [stolen]
            for future in landed:
                waiting.discard(future)
                for entry in by_future[future]:
                    if not record(entry):
                        return
        if screen is not None:
            self._screen(bench, screen)
        else:
            self._confirm(bench)

    def _merged(self, entry: _Entry) -> bool:
        """Whether ``entry``'s compiled kernel is identical to one already timed for this tune
        (``_identical.identity``): then it takes that config's timing (``entry.same``) and is
        not launched. Otherwise, if its kernel is known, it becomes the config timed for every
        later one identical to it. A failed compile, a config with hooks, and every config of a
        kernel with its own ``do_bench=`` or hooks are never merged (docs/triton.md, "Identical
        kernels")."""
        kinds = self._kinds
        if (
            kinds is None
            or entry.same is not None
            or entry.compiled.error is not None
            or not _identical.config_mergeable(entry.config)
        ):
            return False
        kernel = _landed_kernel(entry)
        identity = None if kernel is None else _identical.identity(kernel, entry.config.kwargs)
        if identity is None:
            return False
        first = kinds.setdefault(identity, entry)
        if first is entry:
            return False
        entry.same = first
        return True

    def _feeder_for(self, by_future: dict[Future[Any], list[_Entry]]) -> _lanes.Feeder | None:
        """A feeder that moves this tune's queued compiles to the caller lanes (``_lanes.py``),
        or ``None``: no lanes (``CALLER_LANES = 0``), or an executor whose queue is not ours to
        reason about (a cluster's, a stdlib pool's: their compiles are taken one at a time by
        :meth:`_steal`, as before lanes)."""
        from precompile_executor import PrecompileExecutor

        adapter = self._adapter
        if adapter is None or not isinstance(adapter.executor, PrecompileExecutor):
            return None
        lanes = _lanes.lanes()
        if lanes is None:
            return None
        jobs = []
        for future, entries in by_future.items():
            job = entries[0].compiled.job
            if job is not None and job.task_future is not None and not future.done():
                jobs.append((min(_predicted_s(e.config) for e in entries), job))
        return _lanes.Feeder(lanes, jobs)

    def _steal(
        self, waiting: set[Future[Any]], by_future: dict[Future[Any], list[_Entry]]
    ) -> Future[Any] | None:
        """While no worker is compiling for this tune (none is ready: still starting, importing,
        or busy with other work), take back from the executor's queue the shortest predicted
        compile, to compile it in this thread; return its future, or ``None``.

        Once a worker compiles for the tune, this thread only benchmarks: from then on the tune
        takes at most the longer of the workers' compiling and its benchmarks, never stock's sum
        of both, and a compile taken here would delay the benchmarks by its whole duration.

        The executor keeps a task's future PENDING until a worker really starts it (for
        ``PrecompileExecutor``, until a started, idle worker takes it, or one whose compile is
        predicted to end within a quarter second takes it next: docs/design.md, "Sending
        ahead"; a stdlib pool's queue behaves alike), so ``cancel()`` returning True means no
        worker has it or ever will: no config is compiled twice. The executor starts the
        longest predicted first; this thread takes from the other end, so the two meet at the
        end of the queue.
        """
        queued = []
        for future in waiting:
            job = by_future[future][0].compiled.job
            task = job.task_future if job is not None else None
            if task is None or task.done():
                continue
            if task.running():
                # A worker is compiling for this tune: compiles flow, and this thread's time
                # is the benchmarks'. Taking a compile now could only delay them.
                return None
            queued.append((min(_predicted_s(e.config) for e in by_future[future]), task, future))
        queued.sort(key=lambda item: item[0])
        for _, task, future in queued:
            if task.cancel():
                for entry in by_future[future]:
                    entry.here = True
                    if entry.cache is not None and isinstance(
                        entry.cache.get(entry.key), FutureKernel
                    ):
                        del entry.cache[entry.key]  # Triton's launch compiles it here, now
                return future
        return None

    def _confirm(self, bench: Callable[[Any], Any]) -> None:
        """Re-measure, now that every compile has landed, the leaders whose order the load may
        have changed: when two or more configs lie within ``CONFIRM_MARGIN`` of the best
        screened time and some of them were screened while compiles still ran, those are timed
        again, and their new timings replace the screening's in ``configs_timings`` and in the
        choice. A best config clear of the rest by more than the margin, or leaders all screened
        quietly, need nothing (docs/triton.md, "Timing integrity")."""
        timed = [
            (first, entry)
            for entry in self._entries.values()
            if entry.measured
            and entry.same is None
            and (first := _first_timing(entry.outcome)) is not None
        ]
        if not timed:
            return
        best = min(first for first, _ in timed)
        leaders = [entry for first, entry in timed if first <= best * (1 + CONFIRM_MARGIN)]
        if len(leaders) < 2:
            return
        for entry in leaders:
            if entry.quiet:
                continue
            screened = entry.outcome
            if not self._timed(entry, bench):
                return
            entry.screened = screened

    def _screen(self, bench: Callable[[Any], Any], screen: Callable[..., Any]) -> None:
        """Successive halving, once every compile has landed (every config has its screen):
        screen again, quietly, the loud contenders; time the finalists within the noise band of
        the best screen with Triton's full budget; then any challenger whose screen is at or
        below the best full timing, until none is left (``_screening``'s rules). Their full
        timings replace their screens in ``configs_timings``; Triton's ``min`` then picks among
        configs timed in full (docs/triton.md, "Screening")."""

        def screens() -> dict[_Entry, _screening.Screen]:
            found = {}
            for entry in self._entries.values():  # one per distinct kernel: not entry.same
                if (
                    entry.measured
                    and entry.same is None
                    and not isinstance(entry.outcome, BaseException)
                ):
                    one = _screening.Screen.of(entry.outcome, quiet=entry.quiet)
                    if one is not None:
                        found[entry] = one
            return found

        again = _screening.rescreen(screens())
        for entry in again:
            if not self._timed(entry, bench, screen):
                return
        screened = screens()
        self._rungs.update(screened=len(screened), rescreened=len(again))
        band = _screening.noise_band(screened.values())
        chosen = _screening.finalists(screened, band, _screening.most_finalists(len(screened)))
        full: dict[_Entry, float] = {}
        while chosen:
            for entry in chosen:
                first = entry.outcome
                if not self._timed(entry, bench):
                    return
                entry.screened = first
                timing = _first_timing(entry.outcome)
                full[entry] = math.inf if timing is None else timing
                self._rungs["timed_in_full"] = len(full)
            chosen = _screening.challengers(screened, full)
        self._screened = True
        logger.debug(
            "%s: screened %d configs (noise band %.1f %%); %d timed in full: %s",
            _name(self.autotuner),
            len(screened),
            band * 100,
            len(full),
            ", ".join(f"{e.config} {t:.4g}" for e, t in full.items()),
        )

    def _timed(
        self,
        entry: _Entry,
        bench: Callable[[Any], Any],
        screen: Callable[..., Any] | None = None,
    ) -> bool:
        """Time ``entry`` (with ``screen``'s short budget if given, else the autotuner's own
        ``do_bench``), noting whether no compile of the tune ran while it did; ``False`` if
        ``_bench`` raised (the exception is kept for Triton's loop)."""
        # Quiet means no compile still running — in a worker or a caller lane alike: both
        # resolve the job's future only once done —, whether or not this thread has got to its
        # result yet: a kernel found in the cache lands at once (docs/triton.md, "Timing
        # integrity"; test_with_every_compile_landed_before_benchmarking_each_config_is_timed_once).
        entry.quiet = all(e.future is None or e.future.done() for e in self._entries.values())
        entry.short = screen is not None
        if screen is None:
            return self._record(entry, bench)
        with _benchmarker(self.autotuner, screen):
            return self._record(entry, bench)

    def _record(self, entry: _Entry, bench: Callable[[Any], Any]) -> bool:
        try:
            entry.outcome = self._measure(entry, bench)
        except Exception as exc:  # noqa: BLE001 - re-raised on the config's turn in the loop
            logger.debug(
                "%s: config %s raised %s: %s (Triton's loop raises it on that config's turn)",
                _name(self.autotuner),
                entry.config,
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            entry.outcome = exc
            entry.measured = True
            return False
        entry.measured = True
        return not self._stock  # after a miss, Triton's own loop times the rest

    def _measure(self, entry: _Entry, bench: Callable[[Any], Any]) -> Any:
        future = entry.future
        if future is not None and not entry.here:
            exc = CancelledError() if future.cancelled() else future.exception()
            if exc is None:
                entry.compiled.kernel.result()  # into the JIT's cache, as Triton finalizes it
            elif isinstance(exc, KernelTransferError):
                # The worker could not load this kernel (nothing was compiled): Triton's own
                # launch compiles it here, as stock Triton does (docs/triton.md, "Failures").
                logger.debug(
                    "%s: config %s compiles here: %s", _name(self.autotuner), entry.config, exc
                )
                entry.here = True
                if entry.cache is not None and isinstance(entry.cache.get(entry.key), FutureKernel):
                    del entry.cache[entry.key]
            else:
                if entry.cache is not None and entry.key is not None:
                    entry.cache[entry.key] = _FailedCompile(exc)
                if is_isolation_failure(exc):
                    self._log_isolated(entry, exc)
                    return list(INF_TIMING)
        return self._guarded(entry, bench)

    def _log_isolated(self, entry: _Entry, exc: BaseException) -> None:
        if self._logged is None:
            self._logged = set()
        if id(entry.future) in self._logged:
            return
        self._logged.add(id(entry.future))
        if isinstance(exc, TimeoutError):
            what = "timed out"
        elif isinstance(exc, TaskMemoryError):
            what = "was killed past its memory limit"
        elif isinstance(exc, CancelledError):
            what = "was cancelled"
        else:
            what = "crashed its worker"
        output = getattr(exc, "captured_output", "") or "(none)"
        logger.warning(
            "%s: the compile of config %s %s (%s: %s); timed as inf, the autotune goes on. "
            "Compiler output:\n%s",
            _name(self.autotuner),
            entry.config,
            what,
            type(exc).__name__,
            exc,
            output.rstrip(),
        )

    # -- the guard (docs/triton.md, "Where each config compiled"; _autotune_guard) -------------

    def _guarded(self, entry: _Entry, bench: Callable[[Any], Any]) -> Any:
        """Triton's ``_bench`` of ``entry``; where a worker was to compile it, a key the launch
        adds to the JIT's memory cache is a miss: the launch compiled here what the worker's
        compile should have provided."""
        if entry.here or entry.future is None or self._stock:
            return bench(entry.config)
        before = _guard.jit_cache_keys(self.autotuner)
        try:
            return bench(entry.config)
        finally:
            if _guard.jit_cache_keys(self.autotuner) - before:
                self._missed(entry)

    def _missed(self, entry: _Entry) -> None:
        entry.missed = True
        kwargs = {k: v for k, v in self._kwargs.items() if k not in _LAUNCH_ONLY}
        differing = _guard.differing_arguments(
            self.autotuner,
            (entry.compiled.args, entry.compiled.kwargs),
            (self._args, kwargs),
        )
        what = "; ".join(
            f"argument {name!r} specialises as {launch!r} at the launch, as {sent!r} in the "
            "compile sent to the workers"
            for name, sent, launch in differing
        )
        self._fall_back(
            f"the launch of config {entry.config} compiled in this process a kernel no worker had "
            f"compiled: {what or 'an argument, a heuristic or an option differs between them'}"
        )

    def _fall_back(self, why: str) -> None:
        """Log ``why`` (once per kernel), tune this kernel as stock Triton from now on, and
        finish this tune as stock: nothing more is sent, its configs compile here on their
        turn."""
        _guard.fall_back(
            self.autotuner,
            f"{_name(self.autotuner)}: {why}. Its configs compile in this process from now on, "
            "as stock Triton compiles them (once each); the kernel's arguments are not ones the "
            'integration can reproduce before the launch (docs/triton.md, "Where each config '
            'compiled").',
        )
        self._stock = True
        if self._feeder is not None:
            self._feeder.stop()
        if self._adapter is not None:
            self._adapter.shutdown(wait=False, cancel_futures=True)
        for entry in self._entries.values():
            if entry.measured or entry.here:
                continue
            entry.here = True
            if entry.cache is not None and isinstance(entry.cache.get(entry.key), FutureKernel):
                del entry.cache[entry.key]

    def _account(self) -> None:
        """Add where this tune's configs compiled to the kernel's record."""
        counts = {"tunes": 1, "workers": 0, "lanes": 0, "caller": 0, "failed": 0, "cached": 0}
        counts["identical"] = sum(entry.same is not None for entry in self._entries.values())
        if self._kinds is not None:
            logger.debug(
                "%s: %d of %d configs took the timing of another config's identical kernel",
                _name(self.autotuner),
                counts["identical"],
                len(self._entries),
            )
        for entry in self._entries.values():
            future = entry.future
            if entry.compiled.error is not None or entry.here or entry.missed:
                counts["caller"] += 1
            elif future is None:
                counts["cached"] += 1
            elif not future.done() or future.cancelled():
                continue  # the tune ended first (an error, Ctrl-C)
            elif future.exception() is not None:
                counts["failed"] += 1
            elif entry.compiled.job is not None and entry.compiled.job.cached:
                counts["cached"] += 1
            elif entry.compiled.job is not None and entry.compiled.job.rerouted:
                counts["lanes"] += 1
            else:
                counts["workers"] += 1
        _guard.count(self.autotuner, **counts, **self._rungs)

    def close(self, *, failed: bool) -> None:
        """Cancel compiles still queued (and, after an error or Ctrl-C, kill running ones);
        leave the JIT's memory cache holding only kernels that really compiled."""
        adapter = self._adapter
        if adapter is None:
            return
        if self._feeder is not None:
            self._feeder.stop()
        adapter.shutdown(wait=False, cancel_futures=True)
        self._account()
        if failed:
            from precompile_executor import kill_running_futures

            kill_running_futures(
                job.task_future for job in adapter.jobs if job.task_future is not None
            )
        for entry in self._entries.values():
            if entry.cache is None or entry.key is None:
                continue
            current = entry.cache.get(entry.key)
            if isinstance(current, FutureKernel | _FailedCompile):
                del entry.cache[entry.key]


def _landed_kernel(entry: _Entry) -> Any:
    """``entry``'s compiled kernel if it is in this process (finalized into the JIT's cache, as
    Triton's launch would), else ``None``: still compiling, failed, or compiled by a launch not
    yet made."""
    if entry.here:
        return entry.cache.get(entry.key) if entry.cache is not None else None
    future = entry.future
    if future is None:
        return entry.compiled.kernel  # in memory already (or None: nothing compiled)
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return entry.compiled.kernel.result()


def _first_timing(outcome: Any) -> float | None:
    """Return the first (for Triton's ``_bench``: the median) value of a finite timing."""
    value = outcome[0] if isinstance(outcome, list | tuple) and outcome else outcome
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def jit_cache_slot(future_kernel: Any) -> tuple[dict[Any, Any] | None, Any]:
    """Return the JIT's in-memory kernel cache and key that ``future_kernel`` finalizes into.

    ``JITFunction._do_compile`` (3.6 to 3.9) gives each ``FutureKernel`` a ``finalize_compile``
    closure over ``kernel_cache`` and ``key``; it is the only place both versions keep them
    (3.9 also puts the ``FutureKernel`` itself in the cache, 3.6 does not).
    """
    finalize = getattr(future_kernel, "finalize_compile", None)
    code = getattr(finalize, "__code__", None)
    cells = getattr(finalize, "__closure__", None) or ()
    captured: dict[str, Any] = {}
    if code is not None:
        for name, cell in zip(code.co_freevars, cells, strict=False):
            with contextlib.suppress(ValueError):  # an empty cell has no contents
                captured[name] = cell.cell_contents
    cache = captured.get("kernel_cache")
    if not isinstance(cache, dict) or "key" not in captured:
        return None, None
    return cache, captured["key"]


def _name(autotuner: Any) -> str:
    return str(getattr(unwrap_jit_function(autotuner), "__name__", autotuner))


def screening_benchmarker(autotuner: Any) -> Callable[..., Any] | None:
    """Return Triton's default benchmarker with the screening budget, or ``None`` when this
    autotuner cannot be screened: it has its own ``do_bench=`` (respected as given: screening
    never replaces a user's measure), or its default benchmarker takes no ``warmup``/``rep``.
    The refusal is logged once per autotuner."""
    reason = None
    if getattr(autotuner, "_do_bench", None) is not None:
        reason = "it has its own do_bench= (or the deprecated warmup=/rep=), timed as given"
    elif not isinstance(
        inspect.getattr_static(type(autotuner), "do_bench", None), functools.cached_property
    ):
        reason = "its do_bench is not Triton's cached property (a changed autotuner)"
    else:
        from triton.runtime.driver import driver

        default = driver.active.get_benchmarker()
        try:
            params = inspect.signature(default).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        if takes_any or {"warmup", "rep"} <= set(params):  # a wrapper's **kwargs passes them on
            return functools.partial(
                default, warmup=_screening.SCREEN_WARMUP_MS, rep=_screening.SCREEN_REP_MS
            )
        reason = f"its benchmarker {default!r} takes no warmup/rep budget"
    with STATE.lock:
        try:
            if autotuner in STATE.unscreened:
                return None
            STATE.unscreened.add(autotuner)
        except TypeError:  # not weak-referenceable: report every time rather than never
            pass
    logger.info(
        "%s: not screened (%s): every config gets the full do_bench budget.",
        _name(autotuner),
        reason,
    )
    return None


@contextlib.contextmanager
def _benchmarker(autotuner: Any, bench: Callable[..., Any]) -> Iterator[None]:
    """Make ``autotuner.do_bench`` (a ``functools.cached_property`` in Triton 3.6 and 3.9, kept
    in the instance's ``__dict__``) ``bench`` for the block; what was there is put back. Only the
    tune's thread benchmarks this autotuner meanwhile: it holds :func:`tuning_lock`."""
    slots = vars(autotuner)
    had, previous = "do_bench" in slots, slots.get("do_bench")
    slots["do_bench"] = bench
    try:
        yield
    finally:
        if had:
            slots["do_bench"] = previous
        else:
            slots.pop("do_bench", None)
