"""A worker initializer that pays a process's cold first compile before the first real one."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import triton
import triton.language as tl
from triton.compiler import ASTSource

from . import _worker
from ._cache import expected_hash
from ._target import parse_target


@triton.jit  # type: ignore[untyped-decorator]
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def prewarm(target: str = "cuda:90") -> None:
    """Import torch and triton and compile one tiny kernel for ``target`` (no GPU needed).

    The first compile in a process costs about 0.35 s more than the same compile later in it
    (loading the compiler's libraries and dialects). Use this as a worker initializer — or call
    it from yours — so that the first real config is not the cold one:
    ``PrecompileExecutor(initializer=prewarm, initargs=("cuda:90",))``. With the default
    ``start="template"`` it runs once, in the template, and every worker forked from it starts
    warm; it starts no thread and never touches CUDA, so the template stays safe to fork.

    The kernel goes to a throw-away cache, never the caller's.
    """
    import torch  # noqa: F401 - what an autotuner's compile worker imports anyway

    cache = tempfile.mkdtemp(prefix="precompile-prewarm-")
    old = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
        source = ASTSource(fn=_double, signature=_SIGNATURE, constexprs={"BLOCK": 1024})
        triton.compile(source, target=parse_target(target), options={"num_warps": 4})
    finally:
        if old is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = old
        shutil.rmtree(cache, ignore_errors=True)


caller_warming = threading.RLock()
"""Held while :func:`warm_caller` runs: a compile submitted meanwhile waits for it (``_submit``)
rather than hashing Triton's installation a second time beside it."""


def warm_caller(target: str = "cuda:90") -> None:
    """The caller's half of :func:`prewarm`: what this process pays before its first compile.

    Computes a compile's cache key for ``target`` once — Triton hashes its whole installation
    for the first key of a process (``triton_key``: 0.3–0.7 s) and loads the target's backend.
    A ``PrecompileExecutor`` with ``initializer=prewarm`` runs it on a background thread of the
    caller while its workers start (``prewarm.in_caller``; docs/design.md, "The caller's half of
    an initializer"), so the first autotune or ``warm()`` after it does not pay this itself.
    """
    with caller_warming:
        source = ASTSource(fn=_double, signature=_SIGNATURE, constexprs={"BLOCK": 1024})
        expected_hash(source, parse_target(target), {"num_warps": 4}, {})


prewarm.in_caller = warm_caller  # type: ignore[attr-defined]


WORKER_NICENESS = 5
"""How much lower than the autotuning process the default executor's workers run (``os.nice``
increment): under contention the caller's benchmarking thread gets about three times a worker's
share of a core (CFS weights), so a pool as large as the machine does not slow the timings it
waits for. Measured with a CPU-bound stand-in for the caller: docs/benchmarks.md, "Answers of
retired probes"."""


def prewarm_worker(target: str = "cuda:90", niceness: int = WORKER_NICENESS) -> None:
    """The default executor's initializer: a compile-only worker at a lower priority, warm.

    Hides every GPU from the worker (``CUDA_VISIBLE_DEVICES=""``: it only compiles, for an
    explicit target), so importing a kernel's library there — which may ask CUDA for the
    device's capability at import — never creates a CUDA context per worker; lowers its CPU
    priority (:data:`WORKER_NICENESS`); then :func:`prewarm`. With ``start="template"`` it runs
    once, in the template, and every worker forked from it inherits all three.
    """
    _worker.in_compile_worker = True
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if niceness:
        try:
            os.nice(niceness)
        except OSError:  # a sandbox may refuse: the workers only compete harder
            pass
    prewarm(target)


def _warm_caller_for_worker(target: str = "cuda:90", niceness: int = WORKER_NICENESS) -> None:
    warm_caller(target)


prewarm_worker.in_caller = _warm_caller_for_worker  # type: ignore[attr-defined]
