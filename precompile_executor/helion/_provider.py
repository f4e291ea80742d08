"""Streaming: Helion benchmarks each config as soon as its precompile lands.

Helion 1.5.1's ``LocalBenchmarkProvider.benchmark(configs)`` compiles (generates code for) every
config, precompiles them all, waits for the whole batch, then benchmarks them in order: a batch
waits for its slowest compile, up to the compile timeout. :class:`StreamingBenchmarkProvider` is
a ``LocalBenchmarkProvider`` whose ``benchmark`` pipelines the three phases::

    autotuner thread                                         executor (fork children / workers)
    codegen config 0 ─ submit its precompile ──────────────► compiling 0
    codegen config 1 ─ submit ─────────────────────────────► compiling 1   (≤ ctx.jobs at once;
    ...                                                       ...            the rest queue)
    fork mode, first batch: Helion's baseline run (deferred from the provider's construction)
    compile failures: Helion's own benchmark() of them (logs, metrics, no-viable-config rule)
    for each precompile, in the order they finish: ◄──────── settled (ok / error / timeout)
      Helion's own benchmark([config]): dedup, accuracy check, the benchmark subprocess,
        metrics, log rows — its precompile future is the settled one (no second precompile),
        compile_time = its real compile time
    results back in the configs' order

Everything a result holds comes from Helion's own ``benchmark()``, called for one config at a
time, so its classification, status, compile time (which feeds the adaptive compile timeout),
accuracy check and metrics are Helion's. A "raise"-verdict precompile aborts the batch as in
Helion (the stream kills the rest); a timeout stays a timeout.

The baseline while the first batch compiles (fork mode): Helion runs its accuracy baseline (the
reference config, compiled and run) when the provider is built, before the search has chosen a
config. Here it runs inside the first ``benchmark``, after that batch's precompiles are submitted
and before its first measurement, so the children compile meanwhile. Every attribute Helion
derives from the run reads through :class:`_AfterBaseline`: whoever needs one first (Helion's own
code included) runs the baseline then.

Helion's benchmark subprocess (every measurement runs in it by default) is the spare that
``install()``/``use()`` started, or is started when the provider is built, and warmed in the
background (``_bench_worker``): its cold start, 17–24 s on the H200, does not begin inside the
first measurement, as it does with Helion alone. While it has not answered its warm-up, each
config is measured in this process by Helion's own in-process path, and every later one in the
subprocess (``_while_starting``; ``measure_while_worker_starts=False`` turns it off).

Timing integrity: in spawn mode our workers run configs on the GPU while Helion measures; each
measurement (``_benchmark_function``, in this process or the subprocess, and
``benchmark_isolated``) holds the GPU's exclusive lease (``_lease``), each worker run a shared one.

Every search reaches this class: ``_seam`` wraps ``BaseSearch._prepare`` to choose it where the
search would build a plain ``LocalBenchmarkProvider`` (only ``BaseSearch`` and ``FiniteSearch``
forward ``benchmark_provider_cls``). It falls back to Helion's batch behaviour when nothing is
to stream: no precompile, one config, distributed runs, or the seam not installed.

Threads: everything runs on the autotuner's thread (``_future.Stream`` documents its callbacks).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from helion.autotuner.benchmark_provider import (
    BenchmarkResult,
    LocalBenchmarkProvider,
    _clone_args,
    _searching_candidates,
    _unset_fn,
)
from helion.autotuner.logger import capture_output
from helion.autotuner.progress_bar import iter_with_progress

from . import _bench_worker, _future, _warm, _while_starting
from ._lease import GpuLease, lease_for
from ._state import STATE

DEFERRED_BASELINE_MAX_BYTES = 1 << 30
"""Largest total size of the kernel's tensor arguments for which the baseline is deferred: the
first batch's precompiles run the host code on one scratch copy of them (Helion copies only the
arguments that the baseline run showed mutated, which is not known yet)."""


FORKS_AFTER_CODEGEN = False
"""Fork mode: ``True`` generates (and prepares) every config of a batch first and then forks the
children back to back; ``False`` (the default) forks each config's child as soon as its code
exists. Each fork makes the autotuning process's pages copy-on-write again, so its Python work
between forks (codegen) pays a page fault on each page it then writes — back-to-back forks pay
that once, but start the compiles later (docs/helion.md, "Streaming"; the A/B:
docs/benchmarks.md, "Answers of retired probes"; ``helion_bench``'s ``ours-fork-batched`` mode)."""


class _AfterBaseline:
    """An attribute Helion computes from the baseline run (the reference output, the mutated
    arguments, the tolerances): reading it runs a deferred baseline first."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = f"_after_baseline_{name}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        obj._run_deferred_baseline()
        try:
            return obj.__dict__[self._key]
        except KeyError:
            raise AttributeError(self._key.removeprefix("_after_baseline_")) from None

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self._key] = value


class StreamingBenchmarkProvider(LocalBenchmarkProvider):  # type: ignore[misc]
    """Helion's local benchmark provider, with precompile streamed into benchmarking.

    Use it like Helion's: ``BaseSearch(kernel, args, benchmark_provider_cls=
    StreamingBenchmarkProvider)``; :func:`precompile_executor.helion.use` makes every search use
    it. Precompiles run on the executor in use (the scope rule).
    """

    _baseline_output = _AfterBaseline()
    mutated_arg_indices = _AfterBaseline()
    _baseline_post_args = _AfterBaseline()
    _effective_atol = _AfterBaseline()
    _effective_rtol = _AfterBaseline()
    _benchmark_worker = _bench_worker.AfterWarmUp()
    search: Any = None
    """The search that built this provider (set by ``_seam``'s ``BaseSearch._prepare``): the
    adaptive timeout reads its quantile and lower bound (``_adaptive.rule_for``)."""
    while_starting: _while_starting.WhileStarting | None = None
    """Whether a measurement runs in this process while Helion's benchmark subprocess starts,
    and how many did (``_while_starting``)."""
    _measuring_here = False  # Helion's _benchmark_function is running its in-process path

    def __init__(
        self,
        kernel: Any,
        settings: Any,
        config_spec: Any,
        args: Sequence[object],
        log: Any,
        autotune_metrics: Any,
    ) -> None:
        self._prepared_futures: dict[int, Any] = {}
        self._lease: GpuLease | None = None
        self._baseline_deferred = _defers_baseline(settings, args)
        self._setup_deferred = False
        if settings.autotune_precompile == "spawn":
            _warm.start_default_warm_up()  # overlaps the baseline run and codegen below
        _warm.start_caller_warm_up()  # this GPU's target, now that CUDA is up (a no-op if done)
        # Helion's benchmark subprocess: the spare that install()/use() started, or cold-started
        # now rather than at the first measurement (_bench_worker's docstring).
        early = None
        if _bench_worker.wants_worker(settings):
            early = _bench_worker.take(kernel.env.device)
        if early is None:
            early = _bench_worker.start_early(settings, kernel.env.device)
        try:
            super().__init__(
                kernel=kernel,
                settings=settings,
                config_spec=config_spec,
                args=args,
                log=log,
                autotune_metrics=autotune_metrics,
            )
        except BaseException:
            if early is not None:  # no provider holds it: its cleanup() will not run
                early.stop()
                with contextlib.suppress(Exception):
                    early.worker.shutdown()
            raise
        if early is not None:
            self.__dict__["_early_benchmark_worker"] = early
            self._benchmark_worker = early.worker
        self.while_starting = _while_starting.WhileStarting(
            early, allowed=_while_starting.allowed_now()
        )
        if self.settings.autotune_precompile == "spawn":
            self._lease = lease_for(self.kernel.env.device)
            mismatch = _warm.early_device_mismatch(self.kernel.env.device)
            if mismatch is not None and _warm.is_default(_warm.current_executor()):
                self.log.warning(mismatch)

    def cleanup(self) -> None:
        if self.while_starting is not None:
            self.while_starting.end()
        early = self.__dict__.get("_early_benchmark_worker")
        if early is not None:
            early.stop()  # still cold-starting (an autotune cut short): no wait for it
        worker = self._benchmark_worker
        if worker is not None and _bench_worker.keep(worker, self.kernel.env.device):
            self._benchmark_worker = None  # warm for the next autotune: Helion's cleanup skips it
        super().cleanup()

    # -- the baseline, deferred in fork mode -----------------------------------------------------

    def _compute_baseline(self) -> Any:
        if self._baseline_deferred:  # placeholders until _run_deferred_baseline
            return None, (), None
        return super()._compute_baseline()

    def _compute_effective_tolerances(self) -> Any:
        if self._baseline_deferred:
            return None, None
        return super()._compute_effective_tolerances()

    def setup(self) -> None:
        if self._baseline_deferred:  # Helion's setup reads the baseline: it follows the run
            self._setup_deferred = True
            return
        super().setup()

    def _run_deferred_baseline(self) -> None:
        """Run Helion's baseline now if it was deferred, and the set-up that waited for it."""
        if not self.__dict__.get("_baseline_deferred"):
            return
        self._baseline_deferred = False
        try:
            (
                self._baseline_output,
                self.mutated_arg_indices,
                self._baseline_post_args,
            ) = self._compute_baseline()
            self._effective_atol, self._effective_rtol = self._compute_effective_tolerances()
        except BaseException:
            self._baseline_deferred = True  # the next reader raises again, as Helion's would
            raise
        if self._setup_deferred:
            self._setup_deferred = False
            super().setup()

    # -- measurement under the GPU lease -------------------------------------------------------

    def _measuring(self) -> contextlib.AbstractContextManager[None]:
        lease = self._lease
        return lease.exclusive() if lease is not None else contextlib.nullcontext()

    def _benchmark_function(self, config: Any, fn: Any, **kwargs: Any) -> float:
        with self._measuring():
            while_starting = self.while_starting
            if while_starting is None or not self._measures_here(while_starting):
                if while_starting is not None:
                    while_starting.hand_over()
                return float(super()._benchmark_function(config, fn, **kwargs))
            # Helion's own in-process path: its branch for the subprocess is off for this call
            # (_subprocess_benchmark_enabled), so it times, checks accuracy and classifies here.
            while_starting.count()
            self._measuring_here = True
            try:
                return float(super()._benchmark_function(config, fn, **kwargs))
            finally:
                self._measuring_here = False

    def _measures_here(self, while_starting: _while_starting.WhileStarting) -> bool:
        """Whether this measurement, which Helion would send to its benchmark subprocess, runs
        in this process because that subprocess is still starting (``_while_starting``)."""
        return while_starting.here() and bool(super()._subprocess_benchmark_enabled())

    def _subprocess_benchmark_enabled(self) -> bool:
        if self._measuring_here:
            return False
        return bool(super()._subprocess_benchmark_enabled())

    def benchmark_isolated(self, fns: list[Callable[..., object]], **kwargs: Any) -> Any:
        self._run_deferred_baseline()  # its benchmark worker needs Helion's set-up
        with self._measuring():
            return super().benchmark_isolated(fns, **kwargs)

    # -- streaming -----------------------------------------------------------------------------

    def _create_precompile_future(self, config: Any, fn: Any) -> Any:
        prepared = self._prepared_futures.pop(id(config), None)
        if prepared is not None:
            return prepared
        return super()._create_precompile_future(config, fn)

    def _streams(self, configs: Sequence[Any]) -> bool:
        import torch.distributed as dist

        return (
            len(configs) > 1
            and self.settings.autotune_precompile in ("fork", "spawn")
            and STATE.active()
            and not dist.is_initialized()
        )

    def benchmark(
        self,
        configs: list[Any],
        *,
        desc: str = "Benchmarking",
        raise_if_no_viable_config: bool = True,
    ) -> list[Any]:
        """Helion's ``benchmark``, each config benchmarked as soon as its precompile lands."""
        if not self._streams(configs):
            self._run_deferred_baseline()
            return list(
                super().benchmark(
                    configs, desc=desc, raise_if_no_viable_config=raise_if_no_viable_config
                )
            )
        results: list[Any] = [None] * len(configs)
        with (
            self._shared() as shared,
            _future.Stream(_warm.current_executor(), shared, search=self.search) as stream,
        ):
            compiled, failed = self._codegen_and_submit(configs, stream)
            stream.close_input()
            self._run_deferred_baseline()  # while the children compile
            if not compiled:
                # Nothing compiled: exactly Helion's batch (its no-viable-config rule included).
                return list(
                    super().benchmark(
                        configs, desc=desc, raise_if_no_viable_config=raise_if_no_viable_config
                    )
                )
            if failed:
                # Helion logs and counts them; with some configs compiled its batch would not
                # raise nor keep a no-viable-config error either.
                done = self._one_by_one([configs[i] for i in failed], desc)
                for i, result in zip(failed, done, strict=True):
                    results[i] = result
                self._no_viable_config_error = None
            bar = iter_with_progress(
                iter(range(len(compiled) + 1)),
                total=len(compiled),
                description=f"{desc} (precompile streamed)",
                enabled=bool(self.settings.autotune_progress_bar),
            )
            with contextlib.closing(bar):
                next(bar, None)
                for i, settled in self._ready_first(compiled, stream):
                    self._prepared_futures[id(configs[i])] = settled
                    (results[i],) = self._one_by_one([configs[i]], desc)
                    next(bar, None)
        self._prepared_futures.clear()
        now = time.perf_counter()
        return [
            r
            if r is not None
            else BenchmarkResult(
                config=c,
                fn=_unset_fn,
                perf=math.inf,
                status="error",
                compile_time=None,
                completed_at=now,
            )
            for c, r in zip(configs, results, strict=True)
        ]

    def _codegen_and_submit(
        self, configs: Sequence[Any], stream: _future.Stream
    ) -> tuple[dict[int, Any], list[int]]:
        """Generate each config's code and submit its precompile at once (codegen pipelined
        into precompile; fork-mode children after the whole batch with ``FORKS_AFTER_CODEGEN``);
        return the futures by index and the indices that failed codegen."""
        futures: dict[int, Any] = {}
        failed: list[int] = []
        scratch: Sequence[object] | None = None
        forks: list[_future.HelionFuture] = []
        for i, config in enumerate(configs):
            if self._budget_exceeded_synced():
                break
            try:
                with capture_output(), _searching_candidates():
                    fn = self.kernel.compile_config(config, allow_print=False)
            except Exception:
                failed.append(i)  # Helion's own benchmark() of it logs the failure
                continue
            if self._baseline_deferred:
                if scratch is None:
                    scratch = _clone_args(self.args, self.kernel.env.process_group_name)
                future = self._precompile_future_on(scratch, config, fn)
            else:
                future = super()._create_precompile_future(config, fn)
            if isinstance(future, _future.HelionFuture) and future.ok is None:
                if future.path == "fork" and FORKS_AFTER_CODEGEN:
                    forks.append(future)
                else:
                    stream.add(future)
            futures[i] = future
        for future in forks:  # back to back: see FORKS_AFTER_CODEGEN
            stream.add(future)
        return futures, failed

    def _precompile_future_on(self, args: Sequence[object], config: Any, fn: Any) -> Any:
        """Helion's ``_create_precompile_future`` in fork mode, before the baseline has shown
        which arguments the kernel mutates: its host code runs on ``args``, a scratch copy."""
        from helion.autotuner.precompile_future import PrecompileFuture

        return PrecompileFuture.create(
            ctx=self._precompile_context(),
            config=config,
            fn=fn,
            args=args,
            result_path=self._next_precompile_result_path(),
            args_path=None,
        )

    def _ready_first(
        self, futures: dict[int, Any], stream: _future.Stream
    ) -> Iterator[tuple[int, Any]]:
        """``(index, settled future)``: those already done (Helion's skip futures) first, then
        ours in the order their tasks finish."""
        by_id = {}
        for i, future in futures.items():
            if isinstance(future, _future.HelionFuture) and future.ok is None:
                by_id[id(future)] = i
            else:
                yield i, future
        for future in stream.settled():
            yield by_id[id(future)], future

    def _one_by_one(self, configs: list[Any], desc: str) -> list[Any]:
        """Helion's own ``benchmark`` of ``configs``, without its per-call progress bars."""
        settings = self.settings
        bar = settings.autotune_progress_bar
        settings.autotune_progress_bar = False
        try:
            return list(super().benchmark(configs, desc=desc, raise_if_no_viable_config=False))
        finally:
            settings.autotune_progress_bar = bar

    @contextlib.contextmanager
    def _shared(self) -> Iterator[dict[int, Any]]:
        """Spawn mode: the kernel arguments, shared once for this batch (by ``id(ctx.args)``)."""
        if self.settings.autotune_precompile != "spawn":
            yield {}
            return
        with _future.shared_args(self.args) as shared:
            yield shared


def _defers_baseline(settings: Any, args: Sequence[object]) -> bool:
    """Whether the provider runs Helion's baseline inside its first batch (fork mode, streamed,
    tensor arguments small enough to copy once): see the module's docstring."""
    import torch
    import torch.distributed as dist
    from torch.utils._pytree import tree_leaves

    if settings.autotune_precompile != "fork" or not STATE.active():
        return False
    if dist.is_initialized() or not isinstance(args, (tuple, list)):
        return False
    size = sum(t.nbytes for t in tree_leaves(list(args)) if isinstance(t, torch.Tensor))
    return size <= DEFERRED_BASELINE_MAX_BYTES
