"""Triton integration: compile ``@triton.jit`` kernels in worker processes, use them here.

Importing this package imports Triton (``import precompile_executor`` does not).

* :func:`precompile` — compile one kernel for a signature, constexprs, options and target in a
  worker; the cache files come back as bytes and are installed in this process's Triton cache, so
  this process's next compile or launch of that kernel and config is a cache hit.
* :func:`async_compile_executor` — an executor for Triton's own ``AsyncCompileMode`` that runs
  the compiles in worker processes and hands Triton real ``CompiledKernel`` objects.
* :func:`warm` — compile every config of ``@triton.autotune`` kernels for argument specs
  (:class:`TensorSpec`, ``TensorSpec.descriptor()`` for host TMA descriptors, :func:`launch`),
  in parallel, before the autotuner's first call; a config's ``pre_hook`` runs on copies of the
  descriptors first (:class:`PreHookError` if it raises).
* :func:`classify` — the ``classify`` hook that knows Triton's expected failures.
* :func:`parse_target` — ``"cuda:90"`` → ``GPUTarget``; no GPU is needed to compile for one.
* :func:`triton_prior_s` — the prior compile-time estimate of a config (block sizes, warps), for
  a compile function of your own (``precompile_executor.estimated_cost``); ``precompile``,
  ``warm`` and ``AsyncCompileMode`` use it, and history beside the Triton cache, already.
* :func:`compile_only_driver` — lets Triton's JIT (``kernel.warmup``) specialise and compile for an
  explicit target on a machine without a GPU.
* ``state`` — the integration's process-wide state in one object (``_state.TritonState``): the
  ``autotune.use()`` blocks and installation, the default executor and its warm-up thread, the
  modules announced to workers; its ``reset()`` (for tests) closes, stops and forgets all of it.

Data flow (one compile)::

    caller: ASTSource ─► CompileRequest (KernelRef + plain data) ─► executor.submit(...)
    worker: load kernel (import or rebuild from source) ─► triton.compile() in a private temp
            cache ─► CompiledArtifacts (hash, {file name: bytes})
    caller: install files + group in its own cache ─► CompiledKernel(src, group, hash)

See ``docs/triton.md``.
"""

from .._costs import triton_prior_s
from ._async import TritonCompileExecutor, async_compile_executor
from ._cache import expected_hash, install
from ._classify import Classification, classify
from ._driver import CompileOnlyDriver, compile_only_driver
from ._errors import CacheKeyMismatchError, KernelTransferError, UnsupportedTritonError
from ._kernel_ref import KernelRef, kernel_ref, load_kernel, unwrap_jit_function
from ._messages import CompiledArtifacts, CompileRequest
from ._prewarm import prewarm
from ._state import STATE as state
from ._submit import CompileJob, precompile
from ._target import format_target, parse_target
from ._warm import (
    ConfigResult,
    KernelSpecs,
    Launch,
    PreHookError,
    TensorSpec,
    WarmReport,
    configs_of,
    count_configs,
    launch,
    warm,
)
from ._worker import compile_request

__all__ = [
    "CacheKeyMismatchError",
    "Classification",
    "CompileJob",
    "CompileOnlyDriver",
    "CompileRequest",
    "CompiledArtifacts",
    "ConfigResult",
    "KernelRef",
    "KernelSpecs",
    "KernelTransferError",
    "Launch",
    "PreHookError",
    "TensorSpec",
    "TritonCompileExecutor",
    "UnsupportedTritonError",
    "WarmReport",
    "async_compile_executor",
    "classify",
    "compile_only_driver",
    "compile_request",
    "configs_of",
    "count_configs",
    "expected_hash",
    "format_target",
    "install",
    "kernel_ref",
    "launch",
    "load_kernel",
    "parse_target",
    "prewarm",
    "precompile",
    "state",
    "triton_prior_s",
    "unwrap_jit_function",
    "warm",
]
