"""``@triton.autotune`` compiles every config of a new tuning key in parallel, in workers.

One line, scoped::

    import precompile_executor.triton.autotune as pe_autotune

    with pe_autotune.use():             # or use(PrecompileExecutor(16, timeout=60))
        matmul_kernel[grid](a, b, c, M, N, K, ...)   # first call on this key: tuned

or process-wide: ``pe_autotune.install()`` (``uninstall()`` undoes it). ``None`` (the default)
means the shared default ``PrecompileExecutor``.

Inside, a kernel that meets a tuning key it has not seen compiles all of its pruned configs in
the executor's workers — with exactly this call's arguments, so each compile is the one its
benchmark launch looks up — longest predicted first, and benchmarks each config as soon as its
compile is in this process's caches, while the rest still compile; once all have landed, the
leaders timed while compiles still ran are timed again on the quiet machine, and those timings
decide (``docs/triton.md``, "Timing integrity"). Everything else is Triton's
own: pruning, ``do_bench`` (a ``do_bench=`` of yours too), the hooks, ``reset_to_zero`` /
``restore_value``, ``cache_results`` (a disk hit compiles nothing), ``knobs.autotuning.listener``,
``bench_time``, ``configs_timings``, ``best_config``. No worker touches the GPU.

Failures: ``OutOfResources``, ``PTXASError`` and ``CompileTimeAssertionFailure`` time a config
``inf`` as in Triton; a compile that crashes or hangs its worker (past the executor's timeout) is
timed ``inf`` too and logged once (logger ``precompile_executor.triton.autotune``) with the
compiler's captured output — it never takes this process down. If every config fails, Triton's
final launch raises. Only Triton 3.6 and 3.9 are supported: :func:`use` and :func:`install`
check the autotuner's seam and refuse anything else with ``UnsupportedTritonError``, patching
nothing. See ``docs/triton.md``, "With ``@triton.autotune``".
"""

from ._autotune_seam import (
    SUPPORTED_TRITON_SERIES,
    check_triton,
    install,
    installed,
    triton_version,
    uninstall,
    use,
)
from ._errors import UnsupportedTritonError
from ._kernel_ref import imports_that_launch

__all__ = [
    "SUPPORTED_TRITON_SERIES",
    "UnsupportedTritonError",
    "check_triton",
    "imports_that_launch",
    "install",
    "installed",
    "triton_version",
    "uninstall",
    "use",
]
