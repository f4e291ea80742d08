"""TorchInductor's compiles on a :class:`~precompile_executor.PrecompileExecutor`, in one line.

Scoped::

    import precompile_executor.inductor

    with precompile_executor.inductor.use():
        compiled = torch.compile(model)
        compiled(x)                      # its compiles run as tasks on the executor

or process-wide: ``precompile_executor.inductor.install()`` (``uninstall()`` undoes it). Without
an argument both use the process's shared default executor (Inductor's worker count, a warm
template with torch and Inductor imported, warmed in the background); ``use(ex)`` takes an
executor of your own, whose ``timeout`` and ``memory_limit`` then bound every compile. As
stock Inductor does with its own pool, compiles go to the executor once a worker has answered
a readiness probe; until then Inductor compiles in the caller, and :func:`statistics` counts it.

Inside, Inductor's Triton kernels, its C++ kernel builds and max-autotune's precompiles of
template choices run in the executor's processes instead of Inductor's compile pool and the
caller's threads; their results land in Inductor's caches and kernel objects as from its own
pool. A compile that crashes its process, hangs past the timeout or exceeds the memory limit
fails alone with the library's error (``WorkerCrashedError``, ``TaskTimeoutError``,
``TaskMemoryError``), which Inductor reports as it reports a compile error; the next compile in
the process runs as usual. :func:`statistics` counts the compiles per kind.

Only torch 2.11 and 2.13 are supported: :func:`use` and :func:`install` check the version and
every name they replace, and refuse anything else with :class:`UnsupportedTorchError`, patching
nothing. See ``docs/inductor.md``.

Importing this module imports neither torch nor Inductor; :func:`use` does.

``state`` is the integration's process-wide state in one object (``_state.InductorState``): its
``reset()`` (for tests) closes every block and the installation, stops the default executor and
forgets it, and counts from zero again.
"""

from ._compiles import InductorStatistics
from ._seam import (
    SUPPORTED_TORCH_SERIES,
    UnsupportedTorchError,
    check_torch,
    install,
    installed,
    statistics,
    torch_version,
    uninstall,
    use,
)
from ._state import STATE as state
from ._worker import import_inductor

__all__ = [
    "SUPPORTED_TORCH_SERIES",
    "InductorStatistics",
    "UnsupportedTorchError",
    "check_torch",
    "import_inductor",
    "install",
    "installed",
    "state",
    "statistics",
    "torch_version",
    "uninstall",
    "use",
]
