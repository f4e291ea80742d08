"""The seam of ``precompile_executor.triton.autotune``: check Triton's autotuner, patch, restore.

Triton has no extension point for how ``@triton.autotune`` compiles its candidates: the first
launch of each config inside ``Autotuner._bench`` compiles it, one after another. In Triton 3.6
and 3.9 ``Autotuner.run`` calls, on a tuning key it has not seen, ``self.prune_configs(kwargs)``
once and then ``self._bench(*args, config=config, **kwargs)`` once per pruned config (inside its
nested ``benchmark``, possibly through ``check_disk_cache``). Those three methods are looked up on
the instance, so replacing them *on the class* is seen by every autotuned kernel, and that is all
this module touches:

* ``run``: records which autotuner is running with which arguments (a :class:`~._autotune_tune.Tune`
  per call, in a context variable) and, when the call returns or raises, puts the JIT's in-memory
  cache back as a stock run would leave it;
* ``prune_configs``: hands the pruned list to that call's tune (it compiles nothing yet, so a
  ``cache_results`` disk hit, or a single remaining config, compiles nothing);
* ``_bench``: on the first config, submits every pruned config's compile and benchmarks each one,
  through the original ``_bench``, as soon as it lands; the other calls return those timings.

:func:`check_triton` pins the versions and checks every signature and private name this relies on,
and refuses anything else with :class:`~._errors.UnsupportedTritonError` before patching anything.

Threads: patching and restoring happen under ``_lock``. ``use()`` scopes its executor to the
calling thread's context (a ``ContextVar``); ``install()`` applies to every thread that has no
``use()`` block of its own. A tune runs entirely on the thread that launched the kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import inspect
import threading
import types
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import Any

from . import _autotune_tune as _tune
from ._errors import UnsupportedTritonError

SUPPORTED_TRITON_SERIES = ("3.6", "3.9")
"""Triton release series whose autotuner this module was written against and tested with."""

_RUN_PARAMS = ("self", "args", "kwargs")
_PRUNE_PARAMS = ("self", "kwargs")
_BENCH_PARAMS = ("self", "args", "config", "meta")
_JIT_RUN_PARAMS = ("self", "args", "grid", "warmup", "kwargs")

_lock = threading.RLock()
_users = 0
"""``install()`` (counted once) plus every ``use()`` block still open; the patch stays while > 0."""
_originals: dict[str, Any] = {}


def triton_version() -> str:
    """Return the installed Triton's version, e.g. ``"3.6.0"``."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        import triton

        return str(triton.__version__)


def check_triton(*, version: str | None = None) -> None:
    """Check that the installed Triton has exactly the autotuner seam this module patches.

    Args:
        version: the version to check instead of the installed one (for tests).

    Raises:
        UnsupportedTritonError: another release series, a changed signature, or a missing
            name; the message says which, and that nothing was patched.
    """
    found = triton_version() if version is None else version
    series = ".".join(found.split("+")[0].split(".")[:2])
    if series not in SUPPORTED_TRITON_SERIES:
        raise UnsupportedTritonError(
            f"precompile_executor.triton.autotune supports Triton "
            f"{' and '.join(s + '.x' for s in SUPPORTED_TRITON_SERIES)}, found {found}: the "
            "autotuner's internals it relies on (Autotuner.run/prune_configs/_bench, "
            "AsyncCompileMode) change between releases. Nothing was patched. Install one of "
            "those, or autotune without precompile_executor.triton.autotune."
        )
    problems = _seam_problems()
    if problems:
        raise UnsupportedTritonError(
            f"Triton {found}'s autotuner is not the one precompile_executor.triton.autotune "
            "patches (nothing was patched):\n  " + "\n  ".join(problems)
        )


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _names_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _seam_problems() -> list[str]:
    from triton.compiler import errors as compiler_errors
    from triton.runtime import _async_compile, errors, jit
    from triton.runtime.autotuner import Autotuner

    problems = []
    for name, want in (("run", _RUN_PARAMS), ("prune_configs", _PRUNE_PARAMS)):
        fn = inspect.getattr_static(Autotuner, name, None)
        if not inspect.isfunction(fn) or _params(fn) != want:
            problems.append(f"Autotuner.{name} is not a method with parameters {want}")
    bench = inspect.getattr_static(Autotuner, "_bench", None)
    if not inspect.isfunction(bench) or _params(bench) != _BENCH_PARAMS:
        problems.append(f"Autotuner._bench is not a method with parameters {_BENCH_PARAMS}")
    run = inspect.getattr_static(Autotuner, "run", None)
    if inspect.isfunction(run):
        used = _names_used(run.__code__)
        for name in ("prune_configs", "_bench", "check_disk_cache", "cache"):
            if name not in used:
                problems.append(f"Autotuner.run no longer uses self.{name}")
    jit_run = inspect.getattr_static(jit.JITFunction, "run", None)
    if not inspect.isfunction(jit_run) or _params(jit_run) != _JIT_RUN_PARAMS:
        problems.append(f"JITFunction.run is not a method with parameters {_JIT_RUN_PARAMS}")
    do_compile = inspect.getattr_static(jit.JITFunction, "_do_compile", None)
    if not inspect.isfunction(do_compile) or not any(
        isinstance(c, types.CodeType) and c.co_name == "async_compile"
        for c in do_compile.__code__.co_consts
    ):
        problems.append("JITFunction._do_compile no longer submits an async_compile closure")
    if inspect.isfunction(do_compile) and not any(
        isinstance(c, types.CodeType)
        and c.co_name == "finalize_compile"
        and {"kernel_cache", "key"} <= set(c.co_freevars)
        for c in do_compile.__code__.co_consts
    ):
        problems.append(
            "JITFunction._do_compile's finalize_compile no longer closes over kernel_cache and key"
        )
    mode = getattr(_async_compile, "AsyncCompileMode", None)
    if mode is None or not callable(getattr(mode, "submit", None)):
        problems.append("triton.runtime._async_compile.AsyncCompileMode.submit is missing")
    if not isinstance(getattr(_async_compile, "active_mode", None), contextvars.ContextVar):
        problems.append("triton.runtime._async_compile.active_mode is not a ContextVar")
    future_kernel = getattr(_async_compile, "FutureKernel", None)
    if future_kernel is None or not callable(getattr(future_kernel, "result", None)):
        problems.append("triton.runtime._async_compile.FutureKernel.result is missing")
    for module, name in (
        (errors, "OutOfResources"),
        (errors, "PTXASError"),
        (compiler_errors, "CompileTimeAssertionFailure"),
    ):
        if not isinstance(getattr(module, name, None), type):
            problems.append(f"{module.__name__}.{name} is missing")
    return problems


def installed() -> bool:
    """Return whether autotunes launched on this thread compile their configs in workers."""
    return _tune.current_executor() is not _tune.OFF


def _acquire() -> None:
    """Check Triton and patch the autotuner for one more user (first user: patch)."""
    global _users
    with _lock:
        if _users == 0:
            check_triton()
            from triton.runtime.autotuner import Autotuner

            for name, patched in (
                ("run", _tune.patched_run),
                ("prune_configs", _tune.patched_prune_configs),
                ("_bench", _tune.patched_bench),
            ):
                _originals[name] = Autotuner.__dict__[name]
                _tune.ORIGINALS[name] = _originals[name]
                setattr(Autotuner, name, patched)
        _users += 1


def _release() -> None:
    """One user fewer; the last one puts Triton's methods back."""
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            from triton.runtime.autotuner import Autotuner

            for name, original in _originals.items():
                setattr(Autotuner, name, original)
            _originals.clear()


@contextlib.contextmanager
def use(executor: Executor | None = None) -> Iterator[None]:
    """Within the block, ``@triton.autotune`` kernels compile their configs in ``executor``.

    Autotunes launched on this thread (this context) inside the block, on a tuning key they have
    not seen, compile every pruned config in the executor's workers and benchmark each one as
    soon as it is in this process's cache. Blocks nest; the innermost wins. Triton's methods are
    put back when the last block (and any ``install()``) ends, also on an exception.

    Args:
        executor: where to compile; ``None`` means the shared default ``PrecompileExecutor``.
            Its per-task timeout bounds each compile (``PrecompileExecutor(timeout=...)``).

    Raises:
        UnsupportedTritonError: the installed Triton is not 3.6 or 3.9 or its autotuner differs;
            nothing was patched.
    """
    _acquire()
    token = _tune.scoped_executor.set(executor)
    try:
        yield
    finally:
        _tune.scoped_executor.reset(token)
        _release()


def install(executor: Executor | None = None) -> None:
    """Make every thread's ``@triton.autotune`` kernels compile their configs in ``executor``.

    A second ``install()`` replaces the executor; :func:`uninstall` undoes it. A ``use()`` block
    takes precedence on its own thread.

    Args:
        executor: where to compile; ``None`` means the shared default ``PrecompileExecutor``.

    Raises:
        UnsupportedTritonError: see :func:`use`; nothing was patched.
    """
    with _lock:
        if _tune.process_executor[0] is _tune.OFF:
            _acquire()
        _tune.process_executor[0] = executor


def uninstall() -> None:
    """Undo :func:`install`; autotunes outside ``use()`` blocks are stock Triton's again.

    Does nothing if not installed.
    """
    with _lock:
        if _tune.process_executor[0] is _tune.OFF:
            return
        _tune.process_executor[0] = _tune.OFF
        _release()
