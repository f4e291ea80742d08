"""``@triton.autotune`` compiles every config of a new tuning key in parallel, in workers.

One line, scoped::

    import precompile_executor.triton.autotune as pe_autotune

    with pe_autotune.use():             # or use(PrecompileExecutor(16, timeout=60))
        loss = model(x).sum()           # every autotune that starts while the block is open:
        loss.backward()                 # this thread's, autograd's backward threads', any thread's

or process-wide: ``pe_autotune.install()`` (``uninstall()`` undoes it), best as a program's first
statement. ``None`` (the default) means the shared default ``PrecompileExecutor``, started warm
in the background as the block opens (torch and Triton imported, a first compile for this GPU's
target done, workers at a lower CPU priority).

Scope: a ``use()`` block is open for the whole process; an autotune started on *any* thread
while it is open goes through it. Of several open blocks, the innermost of the current context
wins, else the most recently entered one, else ``install()``'s executor, else stock Triton
(``precompile_executor._scope``). Two threads meeting one kernel on a new key do not both tune:
one tunes, the other waits for its result.

Inside, a kernel that meets a tuning key it has not seen compiles all of its pruned configs in the
executor's workers — with exactly this call's arguments, so each compile is the one its benchmark
launch looks up — and benchmarks each config as soon as its compile is in this process's caches,
while the rest still compile. While no worker is ready for them, queued configs compile in this
process — on a few caller lanes (threads) beside the tune's thread, which benchmarks them as they
land, else on the tune's thread one at a time, as stock Triton would — so a cold start is never
slower than stock. Leaders within noise of each other that were timed while compiles still ran are
timed again on the quiet machine, and those timings decide (``docs/triton.md``, "Timing
integrity"). By default every config is timed with a short ``do_bench`` budget and only the
leaders within noise of the best with Triton's full one, on a quiet GPU (``docs/triton.md``,
"Screening"); ``use(screening=False)`` / ``install(screening=False)`` times every config with the
full budget, as stock does. Configs whose compiled kernels are identical (``num_stages`` of a
kernel without pipelined loops) are timed once and share the timing (``docs/triton.md``,
"Identical kernels"). Everything else is Triton's own: pruning, ``do_bench`` (a ``do_bench=`` of
yours too, never screened), the hooks, ``reset_to_zero`` /
``restore_value``, ``cache_results`` (a disk hit compiles nothing), ``knobs.autotuning.listener``,
``bench_time``, ``configs_timings``, ``best_config``. No worker touches the GPU.

Failures: ``OutOfResources``, ``PTXASError`` and ``CompileTimeAssertionFailure`` time a config
``inf`` as in Triton; a compile that crashes or hangs its worker (past the executor's timeout) is
timed ``inf`` too and logged once (logger ``precompile_executor.triton.autotune``) with the
compiler's captured output — it never takes this process down (a config compiled in this process,
in a lane or on the tune's thread, behaves as in stock Triton). If every config fails, Triton's
final launch raises. Only Triton 3.6 and 3.9 are supported: :func:`use` and :func:`install` check
the autotuner's seam and refuse anything else with ``UnsupportedTritonError``, patching nothing.
See ``docs/triton.md``, "With ``@triton.autotune``".

Where each config compiled — in workers, in caller lanes, here, failed — per kernel:
:func:`statistics`. A kernel whose launch specialises otherwise than the compile sent for it (a
hook or an argument the integration cannot reproduce) is named in one WARNING and tuned by stock
Triton from then on; host ``TensorDescriptor`` arguments whose configs' ``pre_hook`` sets their
block shape (TMA kernels) are reproduced: each hook runs on copies of them before its config is
sent."""

from ._autotune_guard import KernelCompiles, statistics
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
    "KernelCompiles",
    "UnsupportedTritonError",
    "check_triton",
    "imports_that_launch",
    "install",
    "installed",
    "statistics",
    "triton_version",
    "uninstall",
    "use",
]
