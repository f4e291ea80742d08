"""Helion integration: Helion's autotuner precompiles on a :class:`PrecompileExecutor`.

One line, scoped::

    import precompile_executor.helion

    ex = PrecompileExecutor(16, initializer=precompile_executor.helion.import_helion)
    with precompile_executor.helion.use(ex):
        kernel.autotune(args)            # autotune_precompile="fork" or "spawn", as usual

or process-wide: ``precompile_executor.helion.install(ex)`` (``uninstall()`` undoes it).

* Helion's **fork** mode compiles each config in a child forked by the executor's fork path
  (compile only, no CUDA in the child); a failed compile is reported as failed (Helion 1.5.1's own
  fork child exits 0 and records it as ok).
* Helion's **spawn** mode runs each config once, between device synchronisations, on the
  executor's warm spawn workers: each worker loads a generated module once per source and the
  kernel arguments once per batch, and a sticky CUDA error fails only its config and replaces
  its worker.

Timeouts (``autotune_compile_timeout``) count from each task's real start and kill its process
group; Helion's classification decides what aborts the autotune ("raise" →
``helion.exc.TritonError``; ``autotune_ignore_errors`` respected); Ctrl-C kills every running
task. Only Helion 1.5.1 is supported: :func:`use` checks the version and the seam's signatures and
refuses anything else with :class:`UnsupportedHelionError`, patching nothing. See
``docs/helion.md``.

Importing this module imports neither Helion nor torch; :func:`use` imports Helion.
"""

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

__all__ = [
    "SUPPORTED_HELION_VERSIONS",
    "UnsupportedHelionError",
    "check_helion",
    "helion_version",
    "import_helion",
    "install",
    "installed",
    "uninstall",
    "use",
]
