"""Spawn mode, worker side: run one config of a Helion kernel once between synchronisations.

Runs in a warm spawn worker (never imports the parent-side executor). What Helion's spawn mode
does in a fresh interpreter per config, done on a worker that stays:

* The generated kernel module travels as source (Helion's ``SerializedCompiledFunction``: the
  generated module's text, its function name, and the files of kernel-origin modules a fresh
  process could not import); Helion's ``ctx``, ``fn`` and bound kernel stay in the parent. The
  worker ``exec``s each source once and keeps the function, keyed by a hash of the source, the
  function name and the Triton cache directory (:data:`_modules`, at most
  :data:`MODULE_CACHE_SIZE`, least recently used dropped and unloaded).
* The kernel arguments travel as a :class:`~precompile_executor.gpu.SharedArgs` handle: saved
  once per batch by the parent, loaded at most once per worker per batch.
* :class:`~precompile_executor.gpu.RunOnce` synchronises, calls :class:`GeneratedKernel` (compile
  plus one launch, then a synchronisation while the output is still referenced) and synchronises.
  A sticky CUDA error fails this config and retires this worker (the executor replaces it).
* ``TRITON_*`` variables are those of the parent when it submitted the batch (Helion points
  ``TRITON_CACHE_DIR`` at a temporary directory while it autotunes), set for the call and put
  back after it, so the worker fills the cache the parent will launch from.
* Timing integrity (``docs/helion.md``, "GPU lease"): the generated host function first runs with
  a launcher that only compiles (Helion's ``compile_only_launch_args``, Triton's
  ``run(warmup=True)``), outside any lease; then the real call — a Triton cache hit, one launch —
  and its synchronisation run under the GPU's shared lease, which Helion's measurements take
  exclusively.

Threads: a worker runs one task at a time on its main thread; ``_modules`` is only touched there.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

MODULE_CACHE_SIZE = 256
"""Generated modules a worker keeps loaded; each holds its compiled kernels (tens of KiB)."""

_modules: collections.OrderedDict[str, Any] = collections.OrderedDict()
"""This worker's loaded generated functions, by :func:`source_key`, least recently used first."""


def source_key(spec: Any, triton_env: Mapping[str, str]) -> str:
    """The module cache's key: source, function name and the Triton cache it compiles into."""
    h = hashlib.sha256()
    for part in (spec.function_name, spec.source_code, triton_env.get("TRITON_CACHE_DIR", "")):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def triton_environment() -> dict[str, str]:
    """The ``TRITON_*`` variables of this process now (taken in the parent at submit time)."""
    return {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}


@contextlib.contextmanager
def in_triton_environment(wanted: Mapping[str, str]) -> Iterator[None]:
    """Within the block, this process's ``TRITON_*`` variables are exactly ``wanted``."""
    saved = triton_environment()
    for key in saved.keys() - wanted.keys():
        del os.environ[key]
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key in triton_environment().keys() - saved.keys():
            del os.environ[key]
        os.environ.update(saved)


def _load(spec: Any, key: str) -> Any:
    fn = _modules.get(key)
    if fn is not None:
        _modules.move_to_end(key)
        return fn
    from helion.autotuner.precompile_future import _load_compiled_fn, _unload_compiled_fn

    fn = _load_compiled_fn(spec)
    _modules[key] = fn
    while len(_modules) > MODULE_CACHE_SIZE:
        _, old = _modules.popitem(last=False)
        with contextlib.suppress(Exception):
            _unload_compiled_fn(old)
    return fn


def loaded_modules() -> int:
    """How many generated modules this worker holds (for tests and statistics)."""
    return len(_modules)


@dataclasses.dataclass(frozen=True)
class GeneratedKernel:
    """A picklable stand-in for one config's generated host function.

    Attributes:
        spec: Helion's ``SerializedCompiledFunction`` for the config.
        triton_env: the parent's ``TRITON_*`` variables when it submitted the batch.
        key: :func:`source_key` of the two.
    """

    spec: Any
    triton_env: Mapping[str, str]
    key: str
    lease_dir: str | None = None

    def __call__(self, *args: Any) -> None:
        """Load (or reuse) the module, compile, then call it once and synchronise while its
        output lives, under this GPU's shared lease."""
        from helion.autotuner.benchmarking import synchronize_device

        from ._lease import device_lease

        with in_triton_environment(self.triton_env):
            fn = _load(self.spec, self.key)
            if _takes_launcher(fn):
                # Compile only: no kernel runs, no lease. Anything unexpected here is left to the
                # real call below, which reports it (a real compile error compiles again there).
                with contextlib.suppress(Exception):
                    fn(*args, _launcher=_compile_only)
            lease = device_lease(self.lease_dir) if self.lease_dir is not None else None
            with lease.shared() if lease is not None else contextlib.nullcontext():
                output = fn(*args)
                synchronize_device()
                del output


def _takes_launcher(fn: Any) -> bool:
    import inspect

    try:
        return "_launcher" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _compile_only(triton_kernel: Any, grid: Any, *args: Any, **kwargs: Any) -> None:
    """A Helion ``_launcher`` that compiles the launch's specialisation and launches nothing."""
    from helion.runtime.triton.launcher import compile_only_launch_args

    run_args, run_kwargs = compile_only_launch_args(*args, **kwargs)
    triton_kernel.run(*run_args, grid=grid, warmup=True, **run_kwargs)


def generated_kernel(spec: Any, lease_dir: str | None = None) -> GeneratedKernel:
    """Build the task's kernel for ``spec`` with this process's ``TRITON_*`` variables."""
    env = triton_environment()
    return GeneratedKernel(spec, env, source_key(spec, env), lease_dir)


def import_helion(target: str | None = None) -> None:
    """An ``initializer`` for spawn workers: import Helion, torch and Triton once — in the warm
    template, whose workers are forked with it done (``import helion`` asks
    ``torch.cuda.is_available()``, which leaves only the CUDA driver's idle thread: the template
    still forks, and its workers use CUDA; tested by ``tests/test_gpu.py``,
    ``test_an_initializer_that_asks_if_cuda_is_available``).

    Without it the first task on each worker pays the imports inside its timeout. With a Triton
    ``target`` (e.g. ``"cuda:90"``) it also compiles one tiny kernel for it
    (:func:`precompile_executor.triton.prewarm`), so no config pays the process's cold first
    compile: ``PrecompileExecutor(16, initializer=import_helion, initargs=("cuda:90",))``.
    """
    import helion  # noqa: F401
    import torch  # noqa: F401
    import triton  # noqa: F401

    if target is not None:
        from ..triton import prewarm

        prewarm(target)
