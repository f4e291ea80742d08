"""Worker side: compile one :class:`~._messages.CompileRequest` and return its cache files.

The worker never writes to the caller's Triton cache and never assumes it can see it: it compiles
into a private, temporary cache directory, reads the group's files back as bytes and deletes the
directory. The caller installs those bytes in its own cache (see ``_cache.py``). So a worker may
run on another machine, as long as it has the same Triton (and ``ptxas``) as the caller — which
the caller checks by comparing cache hashes.

When the task runs in the caller's own process (a ``ThreadPoolExecutor``), redirecting Triton's
process-wide cache directory would race with the caller's other compiles, so the task compiles
straight into the caller's cache instead.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from triton import knobs
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile
from triton.runtime.cache import FileCacheManager

from .._costs import estimated_cost
from ._costs import compile_estimate
from ._errors import CacheKeyMismatchError
from ._kernel_ref import load_kernel
from ._messages import CompiledArtifacts, CompileRequest, decode_constexprs

in_compile_worker = False
"""True in a process that has run a compile (or a module import) for another process: a worker.
``precompile_executor.triton.autotune``'s ``use()``/``install()`` there start no executor of
their own (a library that opens them at import, imported by a worker, must not start a pool
per worker)."""

_redirect_lock = threading.Lock()
"""Serialises compiles that redirect Triton's process-wide cache directory and environment.
A worker process runs one task at a time, so this lock costs nothing there."""


@estimated_cost(compile_estimate)  # the executor orders compiles longest first (see _costs.py)
def compile_request(request: CompileRequest) -> CompiledArtifacts:
    """Compile ``request`` and return the resulting cache group as bytes.

    This is the task that :func:`precompile_executor.triton.precompile` and the AsyncCompileMode
    adapter submit to the executor; it is a plain module-level function so that it pickles by
    reference.

    Raises:
        KernelTransferError: the kernel cannot be loaded in this process.
        CacheKeyMismatchError: this process's Triton computes a different cache hash.
        Exception: whatever ``triton.compile`` raises (``CompilationError``, ``PTXASError``, …).
    """
    global in_compile_worker
    if os.getpid() != request.caller_pid:
        in_compile_worker = True  # before load_kernel imports the kernel's module
    fn, loaded_by = load_kernel(request.kernel)
    src = ASTSource(
        fn, dict(request.signature), decode_constexprs(request.constexprs), dict(request.attrs)
    )
    target = GPUTarget(*request.target)
    options = dict(request.options)
    env_vars = dict(request.env_vars)
    start = time.perf_counter()
    if os.getpid() == request.caller_pid:
        kernel = triton_compile(src, target=target, options=options, _env_vars=env_vars)
        files = _read_group(kernel.metadata_group)
    else:
        with _redirect_lock, _environment(env_vars), _private_cache():
            kernel = triton_compile(src, target=target, options=options, _env_vars=env_vars)
            files = _read_group(kernel.metadata_group)
    elapsed_s = time.perf_counter() - start
    if kernel.hash != request.expected_hash:
        raise CacheKeyMismatchError.from_hashes(request.expected_hash, kernel.hash, os.getpid())
    return CompiledArtifacts(
        hash=kernel.hash,
        metadata_filename=next(name for name in files if name.endswith(".json")),
        files=files,
        compile_time_s=elapsed_s,
        worker_pid=os.getpid(),
        loaded_by=loaded_by,
        shared_memory_bytes=int(getattr(kernel.metadata, "shared", 0) or 0),
    )


def _read_group(group: Mapping[str, str]) -> dict[str, bytes]:
    return {name: Path(path).read_bytes() for name, path in group.items()}


@contextmanager
def _private_cache() -> Iterator[None]:
    """Point Triton's file cache at a fresh temporary directory for the duration."""
    with (
        tempfile.TemporaryDirectory(prefix="precompile-executor-triton-") as cache_dir,
        knobs.cache.scope(),
    ):
        knobs.cache.dir = cache_dir
        # A remote or custom cache manager configured for the caller is not ours to fill.
        knobs.cache.manager_class = FileCacheManager
        yield


@contextmanager
def _environment(env_vars: Mapping[str, str]) -> Iterator[None]:
    """Set the caller's cache-invalidating environment variables, unset the others."""
    ours = get_cache_invalidating_env_vars()
    saved: dict[str, Any] = {name: os.environ.get(name) for name in set(ours) | set(env_vars)}
    try:
        for name in ours:
            if name not in env_vars:
                os.environ.pop(name, None)
        for name, value in env_vars.items():
            if ours.get(name) != value:  # the same setting may be spelled "1" here, "true" there
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def import_modules(names: tuple[str, ...], caller_pid: int) -> list[str]:
    """Import kernels' modules ahead of their compiles (``_preimport``); return those that
    failed. In the caller's own process (a thread pool) it does nothing: they are imported."""
    global in_compile_worker
    failed: list[str] = []
    if os.getpid() == caller_pid:
        return failed
    in_compile_worker = True
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the compile that needs it reports its own error
            failed.append(name)
    return failed
