"""Helion integration: Helion's autotuner precompiles on a :class:`PrecompileExecutor` and
benchmarks each config as soon as its precompile lands.

One line, scoped::

    import precompile_executor.helion

    with precompile_executor.helion.use():
        kernel.autotune(args)            # autotune_precompile="fork" or "spawn", as usual

or process-wide: ``precompile_executor.helion.install()`` (``uninstall()`` undoes it). Without an
argument both build the process's executor for Helion once (``import_helion`` in the warm
template, the current CUDA device, Helion's ``autotune_precompile_jobs``) and, in spawn mode, warm
it in the background; ``use(ex)`` takes an executor of your own.

Which executor — the scope rule, the same in every integration (``docs/helion.md``, "Which
executor: the scope rule"): a ``use()`` block is open for the whole process while it is open, so
an autotune on any thread goes through it; the innermost block of the current context wins, then
the newest block open anywhere, then ``install()``'s executor, else Helion runs stock.

Fastest is ``install()`` as the program's first lines, before ``import torch`` and ``import
helion``: Helion's benchmark subprocess (and, in spawn mode, the executor's template) then starts
beside the program's own imports.

* **Helion's benchmark subprocess, started ahead**: ``install()`` and ``use()`` start Helion's
  measuring worker (its own loop) before the autotune needs it; the autotune takes it over, and
  while installed it stays warm for the next autotune. Until it is warm, configs are measured in
  the autotuning process by Helion's in-process path (``measure_while_worker_starts=False``
  waits for it instead).
* **Streaming**: every search's benchmark provider becomes :class:`StreamingBenchmarkProvider`,
  which submits each config's precompile as soon as Helion generated its code and benchmarks each
  config as soon as its precompile succeeds, in completion order; each result is Helion's own.
* Helion's **fork** mode compiles each config in a child forked by the executor's fork path
  (compile only, no CUDA in the child); a failed compile is reported as failed (Helion 1.5.1's own
  fork child exits 0 and records it as ok).
* With a **cluster executor** (``DaskPrecompileExecutor``, ``RayPrecompileExecutor``), fork mode's
  compiles run on the nodes as compile-only Triton tasks for this process's GPU, their files sent
  back into its Triton cache; spawn mode is refused there (``docs/helion.md``, "On a cluster").
* Helion's **spawn** mode runs each config once, between device synchronisations, on the
  executor's warm spawn workers: each worker loads a generated module once per source and the
  kernel arguments once per batch, and a sticky CUDA error fails only its config and replaces
  its worker. A cross-process GPU lease keeps worker runs off the GPU while Helion measures.

Timeouts (``autotune_compile_timeout``) count from each task's real start and kill its process
group; Helion's classification decides what aborts the autotune ("raise" →
``helion.exc.TritonError``; ``autotune_ignore_errors`` respected); Ctrl-C kills every running
task. Only Helion 1.5.1 is supported: :func:`use` checks the version and every signature it relies
on and refuses anything else with :class:`UnsupportedHelionError`, patching nothing. See
``docs/helion.md``.

Importing this module imports neither Helion nor torch; :func:`use` imports Helion, and so does
reading ``StreamingBenchmarkProvider``.

``state`` is the integration's process-wide state in one object (``_state.HelionState``): its
``statistics()`` counts the configs measured in the autotuning process while the benchmark
subprocess started; its ``reset()`` (for tests) closes every block and the installation, kills
the spare benchmark worker, stops the default executor and forgets it all.
"""

from typing import Any

from ._seam import (
    SUPPORTED_HELION_VERSIONS,
    UnsupportedHelionError,
    check_helion,
    helion_version,
    install,
    installed,
    uninstall,
    use,
)
from ._spawn_task import import_helion
from ._state import STATE as state

__all__ = [
    "SUPPORTED_HELION_VERSIONS",
    "StreamingBenchmarkProvider",
    "UnsupportedHelionError",
    "check_helion",
    "helion_version",
    "import_helion",
    "install",
    "installed",
    "state",
    "uninstall",
    "use",
]


def __getattr__(name: str) -> Any:
    # The provider subclasses Helion's: importing it imports Helion, so only on demand.
    if name == "StreamingBenchmarkProvider":
        from ._provider import StreamingBenchmarkProvider

        return StreamingBenchmarkProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
