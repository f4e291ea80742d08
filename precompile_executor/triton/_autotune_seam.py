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

Scope: one :class:`~precompile_executor._scope.Scope` (``_state.STATE.scope``) holds the open
``use()`` blocks and the installation, with the rule every integration follows: while a block is
open, an autotune started on *any* thread goes through it (autograd's backward threads, pool
threads, threads started before the block); an inner ``use(ex)`` wins for what runs in its own
context; else the newest open block; else ``install()``'s executor; else stock. The scope
activates the seam (check Triton, patch) when its first holder arrives and restores Triton's
methods when the last leaves; Triton's originals are kept in one place
(``_state.STATE.originals``) and never dropped, so a tune still running on another thread when
the last block closes finishes with them.

Threads: a tune runs entirely on the thread that launched the kernel. Two threads meeting the
same autotuner on a tuning key it has not seen do not both tune: one tunes and the other waits
for its result (``_autotune_tune.tuning_lock``; stock Triton shares ``Autotuner.nargs`` between
them and crashes, https://github.com/triton-lang/triton/issues/11494).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import types
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import Any

from .._scope import OFF, check_executor
from .._validate import installed_version, release_series
from . import _autotune_tune as _tune
from ._errors import UnsupportedTritonError
from ._state import STATE
from ._submit import start_default_warm_up

SUPPORTED_TRITON_SERIES = ("3.6", "3.9")
"""Triton release series whose autotuner this module was written against and tested with."""

_RUN_PARAMS = ("self", "args", "kwargs")
_PRUNE_PARAMS = ("self", "kwargs")
_BENCH_PARAMS = ("self", "args", "config", "meta")
_JIT_RUN_PARAMS = ("self", "args", "grid", "warmup", "kwargs")


def triton_version() -> str:
    """Return the installed Triton's version, e.g. ``"3.6.0"``."""
    return installed_version("triton")


def check_triton(*, version: str | None = None) -> None:
    """Check that the installed Triton has exactly the autotuner seam this module patches.

    Args:
        version: the version to check instead of the installed one (for tests).

    Raises:
        UnsupportedTritonError: another release series, a changed signature, or a missing
            name; the message says which, and that nothing was patched.
    """
    found = triton_version() if version is None else version
    series = release_series(found)
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
    """Return whether an autotune starting now, on this thread, compiles its configs in workers
    (a ``use()`` block is open on some thread, or ``install()`` was called)."""
    return STATE.scope.current() is not OFF


def _activate() -> None:
    """The scope's first holder: check Triton, then patch (under the scope's lock)."""
    check_triton()
    from triton.runtime.autotuner import Autotuner

    for name, patched in _patches().items():
        current = Autotuner.__dict__[name]
        if current is not patched:  # kept across deactivations: see the module docstring
            STATE.originals[name] = current
        setattr(Autotuner, name, patched)


def _patches() -> dict[str, Any]:
    return {
        "run": patched_run,
        "prune_configs": _tune.patched_prune_configs,
        "_bench": _tune.patched_bench,
    }


def _deactivate() -> None:
    """The scope's last holder left: put Triton's methods back (under the scope's lock)."""
    from triton.runtime.autotuner import Autotuner

    for name in _patches():
        setattr(Autotuner, name, STATE.originals[name])


STATE.scope.connect(_activate, _deactivate)


def patched_run(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Autotuner.run``: stock when no block is open and nothing is installed, else tuned in
    the scope's current executor (``_autotune_tune.run``)."""
    block = STATE.scope.current_block()
    if block is None:
        return STATE.originals["run"](self, *args, **kwargs)
    return _tune.run(self, block.executor, args, kwargs, **block.options)


@contextlib.contextmanager
def use(executor: Executor | None = None, *, screening: bool = True) -> Iterator[None]:
    """While the block is open, ``@triton.autotune`` kernels compile their configs in ``executor``.

    The block is open for the whole process: an autotune that starts, on a tuning key its
    kernel has not seen, on *any* thread while it is open — this one, autograd's backward
    threads, a ``threading.Thread`` or pool thread, one started before the block — compiles every
    pruned config in the executor's workers and benchmarks each as soon as it is in this
    process's cache. Blocks nest: the innermost block of this thread's context wins for what runs
    inside it; a thread with no block of its own follows the most recently entered open block.
    Triton's methods are put back when the last block (and any ``install()``) ends, also on an
    exception. See ``docs/triton.md``, "Which autotunes a block covers".

    Args:
        executor: where to compile; ``None`` means the shared default ``PrecompileExecutor``,
            started warm in the background as the block opens (workers with torch and Triton
            imported and one compile for this GPU's target done; until they are ready, this
            thread compiles configs itself, as stock Triton would). An executor's per-task
            timeout bounds each compile (``PrecompileExecutor(timeout=...)``).
        screening: time every config with a short ``do_bench`` budget first and give Triton's
            full budget only to the leaders within noise of the best, on a quiet GPU
            (successive halving: ``docs/triton.md``, "Screening"). On by default;
            ``screening=False`` gives every config Triton's full budget, as stock does. A
            kernel with its own ``do_bench=`` is always timed as given.

    Raises:
        UnsupportedTritonError: the installed Triton is not 3.6 or 3.9 or its autotuner differs;
            nothing was patched.
        TypeError: ``executor`` is neither ``None`` nor a ``concurrent.futures.Executor``, or
            ``screening`` is not a bool; nothing was opened or patched.
    """
    block = STATE.scope.enter(check_executor(executor), _options(screening))
    try:
        if executor is None:
            start_default_warm_up()
        yield
    finally:
        STATE.scope.exit(block)


def install(executor: Executor | None = None, *, screening: bool = True) -> None:
    """Make ``@triton.autotune`` kernels compile their configs in ``executor``, process-wide.

    Every thread's autotunes use it while no ``use()`` block is open; an open block takes
    precedence everywhere (see :func:`use`). A second ``install()`` replaces the executor;
    :func:`uninstall` undoes it. Called first in a program, before the kernels' library is
    imported, it starts the default executor warming while the program imports.

    Args:
        executor: where to compile; ``None`` means the shared default ``PrecompileExecutor``,
            started warm in the background at once (see :func:`use`).
        screening: see :func:`use`.

    Raises:
        UnsupportedTritonError: see :func:`use`; nothing was patched.
        TypeError: see :func:`use`.
    """
    previous = STATE.scope.install(check_executor(executor), _options(screening))
    if executor is None:
        try:
            start_default_warm_up()
        except BaseException:
            STATE.scope.uninstall()  # leave nothing installed: the caller sees why
            if previous is not None:
                STATE.scope.install(previous.executor, previous.options)
            raise


def _options(screening: Any) -> dict[str, Any]:
    """The block's options for ``_autotune_tune.run``, checked before anything is opened."""
    if not isinstance(screening, bool):
        raise TypeError(f"screening must be True or False, not {screening!r:.80}")
    return {"screening": screening}


def uninstall() -> None:
    """Undo :func:`install`; autotunes outside ``use()`` blocks are stock Triton's again.

    Does nothing if not installed.
    """
    STATE.scope.uninstall()
