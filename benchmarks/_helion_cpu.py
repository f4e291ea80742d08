"""A Helion benchmark provider whose GPU parts stand in, for runs on a machine without a GPU
(tests/test_helion.py's streaming tests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


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
    from helion.autotuner.logger import AutotuningLogger
    from helion.autotuner.metrics import AutotuneMetrics

    class OnTheCpu(base):  # type: ignore[misc, valid-type]
        def _compute_reference_baseline(self) -> Any:
            cloned = _clone_args(self.args, None)
            return (reference(cloned) if reference is not None else None), cloned

        def _compute_effective_tolerances(self) -> tuple[float, float]:
            return 1e-2, 1e-2

        def _benchmark_function(self, config: Any, fn: Any, **kw: Any) -> float:
            self._autotune_metrics.num_configs_tested += 1
            return measure(config)

    return OnTheCpu(
        kernel=bound,
        settings=settings,
        config_spec=bound.config_spec,
        args=args,
        log=AutotuningLogger(settings),
        autotune_metrics=AutotuneMetrics(),
    )


def cached_kernel_args() -> int:
    """How many autotunes' kernel arguments Helion's benchmark worker holds cached (a job for
    that worker: ``worker.run(cached_kernel_args, timeout=...)``)."""
    from helion.autotuner.kernel_args import load_trusted_kernel_args

    return int(load_trusted_kernel_args.cache_info().currsize)
