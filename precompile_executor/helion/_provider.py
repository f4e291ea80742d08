"""Streaming: Helion benchmarks each config as soon as its precompile lands.

Helion 1.5.1's ``LocalBenchmarkProvider.benchmark(configs)`` compiles (generates code for) every
config, precompiles them all, waits for the whole batch, then benchmarks them in order: a batch
waits for its slowest compile, up to the compile timeout. :class:`StreamingBenchmarkProvider` is
a ``LocalBenchmarkProvider`` whose ``benchmark`` pipelines the three phases::

    autotuner thread                                         executor (fork children / workers)
    codegen config 0 ─ submit its precompile ──────────────► compiling 0
    codegen config 1 ─ submit ─────────────────────────────► compiling 1   (≤ ctx.jobs at once;
    ...                                                       ...            the rest queue)
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

Timing integrity: in spawn mode our workers run configs on the GPU while Helion measures; each
measurement (``_benchmark_function`` and ``benchmark_isolated``) holds the GPU's exclusive lease
(``_lease``), each worker run a shared one.

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
    _searching_candidates,
    _unset_fn,
)
from helion.autotuner.logger import capture_output
from helion.autotuner.progress_bar import iter_with_progress

from . import _future, _installed, _warm
from ._lease import GpuLease, lease_for


class StreamingBenchmarkProvider(LocalBenchmarkProvider):  # type: ignore[misc]
    """Helion's local benchmark provider, with precompile streamed into benchmarking.

    Use it like Helion's: ``BaseSearch(kernel, args, benchmark_provider_cls=
    StreamingBenchmarkProvider)``; :func:`precompile_executor.helion.use` makes every search use
    it. Precompiles run on the installed executor.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._prepared_futures: dict[int, Any] = {}
        self._lease: GpuLease | None = None
        settings = kwargs.get("settings")
        if settings is not None and settings.autotune_precompile == "spawn":
            _warm.start_default_warm_up()  # overlaps the baseline run and codegen below
        super().__init__(*args, **kwargs)
        if self.settings.autotune_precompile == "spawn":
            self._lease = lease_for(self.kernel.env.device)
            mismatch = _warm.early_device_mismatch(self.kernel.env.device)
            if mismatch is not None and _warm.is_default(_installed.current_executor()):
                self.log.warning(mismatch)

    # -- measurement under the GPU lease -------------------------------------------------------

    def _measuring(self) -> contextlib.AbstractContextManager[None]:
        lease = self._lease
        return lease.exclusive() if lease is not None else contextlib.nullcontext()

    def _benchmark_function(self, config: Any, fn: Any, **kwargs: Any) -> float:
        with self._measuring():
            return float(super()._benchmark_function(config, fn, **kwargs))

    def benchmark_isolated(self, fns: list[Callable[..., object]], **kwargs: Any) -> Any:
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
            and _installed.installed()
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
            return list(
                super().benchmark(
                    configs, desc=desc, raise_if_no_viable_config=raise_if_no_viable_config
                )
            )
        results: list[Any] = [None] * len(configs)
        with (
            self._shared() as shared,
            _future.Stream(_installed.current_executor(), shared) as stream,
        ):
            compiled, failed = self._codegen_and_submit(configs, stream)
            stream.close_input()
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
        into precompile); return the futures by index and the indices that failed codegen."""
        futures: dict[int, Any] = {}
        failed: list[int] = []
        for i, config in enumerate(configs):
            if self._budget_exceeded_synced():
                break
            try:
                with capture_output(), _searching_candidates():
                    fn = self.kernel.compile_config(config, allow_print=False)
            except Exception:
                failed.append(i)  # Helion's own benchmark() of it logs the failure
                continue
            future = super()._create_precompile_future(config, fn)
            if isinstance(future, _future.HelionFuture) and future.ok is None:
                stream.add(future)
            futures[i] = future
        return futures, failed

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
