"""A Helion benchmark provider whose GPU parts stand in, for runs on a machine without a GPU
(tests/test_helion.py's streaming tests, tests/test_helion_while_starting.py's measurements)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from precompile_executor.helion._bench_worker import WarmUp


def _built(provider: type, bound: Any, args: Sequence[Any], settings: Any) -> Any:
    """``provider`` built for the bound kernel as Helion's search builds its provider."""
    from helion.autotuner.logger import AutotuningLogger
    from helion.autotuner.metrics import AutotuneMetrics

    return provider(
        kernel=bound,
        settings=settings,
        config_spec=bound.config_spec,
        args=args,
        log=AutotuningLogger(settings),
        autotune_metrics=AutotuneMetrics(),
    )


def on_the_cpu(
    base: type,
    bound: Any,
    args: Sequence[Any],
    settings: Any,
    measure: Callable[[Any], float],
    reference: Callable[[Sequence[Any]], Any] | None = None,
    *,
    benchmark_subprocess: bool = False,
) -> Any:
    """An instance of a subclass of the provider class ``base`` (Helion's
    ``LocalBenchmarkProvider`` or ours) for the bound kernel: the baseline's reference run (it
    launches the kernel) is ``reference(cloned args)`` (default: no output), the accuracy
    tolerances are fixed, and each config's timing is ``measure(config)`` (ms). Everything else
    — the baseline's bookkeeping, codegen, precompile, statuses, metrics — is the real
    provider's. With the timing stubbed, Helion's benchmark subprocess would never run a job:
    ``settings.autotune_benchmark_subprocess`` is set to ``benchmark_subprocess`` (off unless a
    test is about that subprocess), so neither provider starts one for nothing."""
    settings.autotune_benchmark_subprocess = benchmark_subprocess
    from helion.autotuner.benchmark_provider import _clone_args

    class OnTheCpu(base):  # type: ignore[misc, valid-type]
        def _compute_reference_baseline(self) -> Any:
            cloned = _clone_args(self.args, None)
            return (reference(cloned) if reference is not None else None), cloned

        def _compute_effective_tolerances(self) -> tuple[float, float]:
            return 1e-2, 1e-2

        def _benchmark_function(self, config: Any, fn: Any, **kw: Any) -> float:
            self._autotune_metrics.num_configs_tested += 1
            return measure(config)

    return _built(OnTheCpu, bound, args, settings)


def cached_kernel_args() -> int:
    """How many autotunes' kernel arguments Helion's benchmark worker holds cached (a job for
    that worker: ``worker.run(cached_kernel_args, timeout=...)``)."""
    from helion.autotuner.kernel_args import load_trusted_kernel_args

    return int(load_trusted_kernel_args.cache_info().currsize)


# -- Helion's own measurement, with the kernel and its timing standing in -------------------------
#
# ``on_the_cpu`` replaces the whole measurement. These keep Helion's ``_benchmark_function`` — its
# choice between the benchmark subprocess and this process, its accuracy check, its
# classification, its metrics — and stand in only for what needs a GPU: the kernel (it adds its
# two arguments on the CPU) and its timing (``ms``, the same in both processes), and the two jobs
# Helion sends its worker (they run in the real worker process, over Helion's pipe).

HELD_WARM_UP_LIMIT_S = 240.0
"""Longest a held warm-up waits for its release before it fails (a test that never releases)."""


@dataclasses.dataclass(frozen=True)
class HeldWarmUp(WarmUp):
    """The benchmark worker's warm-up, held back until the file ``gate`` exists: the worker
    process is up and serving, its warm-up round trip has not answered (a cold start that takes
    as long as the test wants). ``functools.partial(HeldWarmUp, gate=path)`` stands for
    ``_bench_worker.WarmUp``."""

    gate: str = ""

    def __call__(self) -> dict[str, Any]:
        deadline = time.monotonic() + HELD_WARM_UP_LIMIT_S
        while not os.path.exists(self.gate):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the warm-up was never released ({self.gate})")
            time.sleep(0.02)
        return super().__call__()


@dataclasses.dataclass(frozen=True)
class CpuKernel:
    """Stands in for a config's compiled kernel: adds its two arguments on the CPU; ``ms`` is
    the time it stands for (the config's, in whichever process measures it)."""

    ms: float

    def __call__(self, x: Any, y: Any) -> Any:
        return x + y


@dataclasses.dataclass(frozen=True)
class CpuTiming:
    """Stands in for Helion's ``BenchmarkJob`` in its worker: the kernel's time, and the pid of
    the process that measured it."""

    kernel: CpuKernel

    def __call__(self) -> tuple[float, int]:
        return self.kernel.ms, os.getpid()


@dataclasses.dataclass(frozen=True)
class CpuAccuracyCheck:
    """Helion's ``AccuracyCheckJob`` in its worker, the kernel standing in: the arguments and the
    baseline output Helion saved for its worker, compared by Helion's ``assert_close``."""

    kernel: CpuKernel
    args_path: str
    baseline_path: str
    atol: float
    rtol: float

    def __call__(self) -> Any:
        from helion.autotuner.accuracy import assert_close
        from helion.autotuner.benchmark_job import (
            AccuracyCheckResult,
            _load_trusted_baseline_output,
        )
        from helion.autotuner.kernel_args import load_trusted_kernel_args

        output = self.kernel(*load_trusted_kernel_args(self.args_path))
        try:
            assert_close(
                output,
                _load_trusted_baseline_output(self.baseline_path),
                atol=self.atol,
                rtol=self.rtol,
            )
        except AssertionError as error:
            return AccuracyCheckResult(ok=False, message=str(error))
        return AccuracyCheckResult(ok=True)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Where one config was measured: ``"here"`` (the autotuning process) or ``"subprocess"``,
    its time, the measuring pid, and when (``time.perf_counter()`` of the autotuning process)."""

    where: str
    ms: float
    pid: int
    at: float


@contextlib.contextmanager
def measured_on_the_cpu(bound: Any, timing: Callable[[Any], float]) -> Iterator[list[Measurement]]:
    """While open, Helion's in-process measurement of ``bound``'s configs runs on the CPU: the
    kernel Helion times is a :class:`CpuKernel` of ``timing(config)`` ms
    (``bench_compile_config``), and Helion's module-level ``do_bench``, which its backend
    documents as patchable by tests, reports that time. Yields the list every measurement is
    recorded in (:func:`measuring_provider`'s subprocess measurements too)."""
    from helion.autotuner import benchmark_provider

    measurements: list[Measurement] = []

    def do_bench(fn: Any, **_: Any) -> float:
        kernel = fn.func  # functools.partial(kernel, *args), as Helion builds it
        measurements.append(Measurement("here", kernel.ms, os.getpid(), time.perf_counter()))
        return float(kernel.ms)

    real_do_bench = benchmark_provider.do_bench
    bound.bench_compile_config = lambda config, allow_print=True: CpuKernel(timing(config))
    benchmark_provider.do_bench = do_bench
    try:
        yield measurements
    finally:
        benchmark_provider.do_bench = real_do_bench
        del bound.bench_compile_config


def measuring_provider(
    base: type,
    bound: Any,
    args: Sequence[Any],
    settings: Any,
    timing: Callable[[Any], float],
    measurements: list[Measurement],
) -> Any:
    """An instance of a subclass of the provider class ``base`` whose measurements are Helion's
    own ``_benchmark_function`` with Helion's benchmark subprocess on: the kernel stands in
    (:class:`CpuKernel` of ``timing(config)`` ms; the baseline is its sum), and so do the two
    jobs Helion sends its worker (:class:`CpuTiming`, :class:`CpuAccuracyCheck`), which run in
    the worker process over Helion's pipe, each recorded in ``measurements``. Use inside
    :func:`measured_on_the_cpu`, which stands in for the in-process timing."""
    settings.autotune_benchmark_subprocess = True
    from helion.autotuner.benchmark_provider import _clone_args

    class Measuring(base):  # type: ignore[misc, valid-type]
        def _compute_reference_baseline(self) -> Any:
            cloned = _clone_args(self.args, None)
            return cloned[0] + cloned[1], cloned

        def _compute_effective_tolerances(self) -> tuple[float, float]:
            return 1e-2, 1e-2

        def _benchmark_function(self, config: Any, fn: Any, **kw: Any) -> float:
            return float(super()._benchmark_function(config, CpuKernel(timing(config)), **kw))

        def _run_subprocess_benchmark_job(
            self, fn: Any, *, timeout: float | None = None, **_: Any
        ) -> float:
            limit = timeout or float(self.settings.autotune_benchmark_timeout)
            ms, pid = self._benchmark_worker.run(CpuTiming(fn), timeout=limit)
            measurements.append(Measurement("subprocess", ms, pid, time.perf_counter()))
            return float(ms)

        def _run_subprocess_accuracy_check_job(self, fn: Any) -> Any:
            if not self._subprocess_accuracy_check_enabled():
                return None
            job = CpuAccuracyCheck(
                fn,
                self._precompile_args_path,
                self._precompile_baseline_path,
                self._effective_atol,
                self._effective_rtol,
            )
            return self._benchmark_worker.run(
                job, timeout=float(self.settings.autotune_benchmark_timeout)
            )

    return _built(Measuring, bound, args, settings)
