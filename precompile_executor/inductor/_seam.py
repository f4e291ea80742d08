"""The seam of ``precompile_executor.inductor``: check torch's Inductor, patch, restore; the scope.

torch 2.11 and 2.13 send Inductor's background compiles through six class attributes, which
this module replaces while a ``use()`` block or an ``install()`` is open and puts back when the
last one closes (``docs/inductor.md``, "The seam"):

* ``AsyncCompile.use_process_pool`` (classmethod) and ``AsyncCompile.process_pool``
  (staticmethod, ``lru_cache``'d): the Triton kernels' pool, and its readiness;
* ``AsyncCompile.submit`` (classmethod): the caller's thread pool, where C++ builds go;
* ``AsyncCompile.triton``: Inductor's own, wrapped to count a kernel compiled in the caller;
* ``AlgorithmSelectorCache.make_precompile_fn``: max-autotune's precompile of template choices
  (Triton choices go through ``AsyncCompile.triton`` when the pool is ready);
* ``CppBenchmarkRequest.precompile``: a C++ template choice's build.

What replaces them is ``_compiles.Routes``. :func:`check_torch` pins the release series and
checks every signature and name this relies on, and refuses anything else with
:class:`UnsupportedTorchError` before anything is patched.

The scope (``_scope.Scope``), what the patch replaced and the default executor live in
``_state.STATE`` (``precompile_executor.inductor.state``).

Threads: the scope patches and restores under its lock; the replacements consult it on whichever
thread compiles.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import Any

from .._scope import OFF, check_executor
from .._validate import installed_version, release_series
from . import _compiles, _default
from ._state import STATE

SUPPORTED_TORCH_SERIES = ("2.11", "2.13")
"""torch release series whose Inductor this module was written against and tested with."""


class UnsupportedTorchError(RuntimeError):
    """The installed torch is not one whose Inductor compile seam this integration knows.

    Nothing was patched. The message names what differs; install torch 2.11 or 2.13, or compile
    without ``precompile_executor.inductor`` (Inductor's own pool).
    """


def torch_version() -> str:
    """Return the installed torch's version, e.g. ``"2.13.0+cpu"``."""
    return installed_version("torch")


def check_torch(*, version: str | None = None) -> None:
    """Check that the installed torch has exactly the Inductor seam this module patches.

    Args:
        version: the version to check instead of the installed one (for tests).

    Raises:
        UnsupportedTorchError: another release series, a changed signature, or a missing
            name; the message says which, and that nothing was patched.
    """
    found = torch_version() if version is None else version
    _check_series(found)
    problems = _seam_problems()
    if problems:
        raise UnsupportedTorchError(
            f"torch {found}'s Inductor is not the one precompile_executor.inductor patches "
            "(nothing was patched):\n  " + "\n  ".join(problems)
        )


def _check_series(found: str) -> None:
    """Refuse a torch of another release series (no import: the version is metadata)."""
    if release_series(found) not in SUPPORTED_TORCH_SERIES:
        raise UnsupportedTorchError(
            f"precompile_executor.inductor supports torch "
            f"{' and '.join(s + '.x' for s in SUPPORTED_TORCH_SERIES)}, found {found}: the "
            "Inductor internals it replaces (AsyncCompile.process_pool/use_process_pool/submit, "
            "AlgorithmSelectorCache.make_precompile_fn) change between releases. Nothing was "
            "patched. Install one of those, or compile without precompile_executor.inductor."
        )


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _names_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _method_problems(
    owner: type, name: str, kind: type, params: tuple[str, ...], uses: tuple[str, ...] = ()
) -> list[str]:
    where = f"{owner.__name__}.{name}"
    raw = owner.__dict__.get(name)
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if not isinstance(raw, kind) or not callable(fn) or _params(fn) != params:
        return [f"{where} is not a {kind.__name__} with parameters {params}"]
    code = getattr(inspect.unwrap(fn), "__code__", None)
    used = _names_used(code) if code is not None else set()
    return [f"{where} no longer uses {n}" for n in uses if n not in used]


def _seam_problems() -> list[str]:
    from torch._inductor import async_compile, autotune_process, codecache, select_algorithm
    from torch._inductor.compile_worker import utils
    from torch._inductor.runtime import compile_tasks, triton_heuristics

    compile_ = async_compile.AsyncCompile
    problems = [
        *_method_problems(compile_, "process_pool", staticmethod, ()),
        *_method_problems(compile_, "use_process_pool", classmethod, ("cls",)),
        *_method_problems(compile_, "submit", classmethod, ("cls", "task")),
        *_method_problems(compile_, "_get_ready", staticmethod, ()),
        *_method_problems(
            compile_,
            "triton",
            types.FunctionType,
            ("self", "kernel_name", "source_code", "device_str"),
            ("use_process_pool", "process_pool", "_worker_compile_triton"),
        ),
        *_method_problems(
            compile_, "cpp", types.FunctionType, ("self", "source_code"), ("submit",)
        ),
        *_method_problems(
            compile_,
            "cpp_pybinding",
            types.FunctionType,
            ("self", "argtypes", "source_code"),
            ("submit",),
        ),
        *_method_problems(
            select_algorithm.AlgorithmSelectorCache,
            "make_precompile_fn",
            types.FunctionType,
            ("self", "choices", "name", "inputs_key", "precompilation_timeout_seconds"),
            ("use_process_pool", "triton", "bmreq", "module_path", "kernel_name"),
        ),
        *_method_problems(
            autotune_process.TritonBenchmarkRequest,
            "make_run_fn",
            types.FunctionType,
            ("self", "input_tensors", "out"),
            ("load_by_key_path", "module_path", "kernel_name"),
        ),
        *_method_problems(
            triton_heuristics.CachingAutotuner,
            "_precompile_worker",
            types.FunctionType,
            ("self",),
            ("compile_results", "configs", "launchers"),
        ),
        *_method_problems(
            triton_heuristics.CachingAutotuner,
            "precompile",
            types.FunctionType,
            ("self", "warm_cache_only", "reload_kernel", "static_triton_bundle_key"),
            ("lock", "_precompile_worker", "_make_launchers"),
        ),
        *_method_problems(
            autotune_process.CppBenchmarkRequest,
            "precompile",
            types.FunctionType,
            ("self",),
            ("CppCodeCache", "source_code"),
        ),
    ]
    if not callable(getattr(compile_.__dict__.get("process_pool"), "__func__", None)) or not (
        callable(getattr(compile_.__dict__["process_pool"].__func__, "cache_clear", None))
    ):
        problems.append("AsyncCompile.process_pool is no longer an lru_cache'd function")
    ptxas = getattr(compile_tasks, "_set_triton_ptxas_path", None)
    if not callable(ptxas) or _params(ptxas) != ():
        problems.append("compile_tasks._set_triton_ptxas_path is not a function of no arguments")
    for module, name, params in (
        (compile_tasks, "_worker_compile_triton", ("load_kernel", "extra_env", "extra_config")),
        (codecache, "_worker_compile_cpp", ("lock_path", "cpp_builders")),
        (codecache, "_load_triton_kernel_from_source", ("kernel_name", "source_code")),
    ):
        fn = getattr(module, name, None)
        if not inspect.isfunction(fn) or _params(fn) != params:
            problems.append(f"{module.__name__}.{name} is not a function with parameters {params}")
    load_async = inspect.getattr_static(codecache.CppCodeCache, "load_async", None)
    fn = getattr(load_async, "__func__", None)
    if not inspect.isfunction(fn) or "submit_fn" not in _params(fn):
        problems.append("CppCodeCache.load_async no longer takes submit_fn")
    elif "_worker_compile_cpp" not in _names_used(fn.__code__):
        problems.append("CppCodeCache.load_async no longer submits _worker_compile_cpp")
    if not isinstance(getattr(codecache.PyCodeCache, "modules_no_attr", None), dict):
        problems.append("PyCodeCache.modules_no_attr is not a dict")
    if not isinstance(getattr(autotune_process, "TritonGPUBenchmarkRequest", None), type):
        problems.append("torch._inductor.autotune_process.TritonGPUBenchmarkRequest is missing")
    if not isinstance(getattr(codecache.CppCodeCache, "cache", None), dict):
        problems.append("CppCodeCache.cache is not a dict")
    for name in ("remove_future", "get"):
        if not callable(getattr(async_compile.CompiledTritonKernels, name, None)):
            problems.append(f"CompiledTritonKernels.{name} is missing")
    if not isinstance(getattr(codecache, "CodeCacheFuture", None), type):
        problems.append("torch._inductor.codecache.CodeCacheFuture is missing")
    if not callable(getattr(async_compile, "get_compile_threads", None)):
        problems.append("torch._inductor.async_compile.get_compile_threads is missing")
    if not isinstance(getattr(utils, "_IN_TOPLEVEL_PROCESS", None), bool):
        problems.append("torch._inductor.compile_worker.utils._IN_TOPLEVEL_PROCESS is missing")
    return problems


# -- patching ----------------------------------------------------------------------------------


def _executor_now() -> Executor | None:
    executor = STATE.scope.current()
    if executor is OFF:
        return None
    if executor is None:
        return _default.default_executor()
    assert isinstance(executor, Executor)
    return executor


def _patch() -> None:
    check_torch()  # before anything is patched
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path

    # Inductor's compile workers point Triton at torch's bundled ptxas, where the wheel has one
    # (_worker_compile_triton); stock's caller does so before it compiles a kernel itself
    # (AsyncCompile.triton without a ready pool). Inside use() no kernel compiles in the caller
    # that way, yet the caller still compiles what the workers compiled (benchmarking a choice,
    # a fused epilogue), and Triton's disk cache is keyed by the ptxas version: with another
    # ptxas every such compile would miss and start over. Set once, as Inductor does.
    _set_triton_ptxas_path()
    from torch._inductor.autotune_process import CppBenchmarkRequest
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    found = {
        "process_pool": AsyncCompile.__dict__["process_pool"],
        "use_process_pool": AsyncCompile.__dict__["use_process_pool"],
        "submit": AsyncCompile.__dict__["submit"],
        "triton": AsyncCompile.__dict__["triton"],
        "make_precompile_fn": AlgorithmSelectorCache.__dict__["make_precompile_fn"],
        "cpp_precompile": CppBenchmarkRequest.__dict__["precompile"],
    }
    routes = _compiles.Routes(
        _executor_now,
        {
            name: getattr(raw, "__func__", raw)  # the plain functions under the descriptors
            for name, raw in found.items()
        },
    )

    def process_pool() -> Any:
        return routes.process_pool()

    # Inductor's at-fork hook and its exit handler clear the original's cache through this name.
    process_pool.cache_clear = found["process_pool"].__func__.cache_clear  # type: ignore[attr-defined]

    def triton(self: Any, *args: Any, **kwargs: Any) -> Any:
        return routes.triton(self, *args, **kwargs)

    def make_precompile_fn(self: Any, *args: Any, **kwargs: Any) -> Any:
        return routes.make_precompile_fn(self, *args, **kwargs)

    def precompile(self: Any) -> None:
        routes.cpp_precompile(self)

    for owner, name, new in (
        (AsyncCompile, "process_pool", staticmethod(process_pool)),
        (AsyncCompile, "use_process_pool", classmethod(routes.use_process_pool)),
        (AsyncCompile, "submit", classmethod(routes.submit)),
        (AsyncCompile, "triton", triton),
        (AlgorithmSelectorCache, "make_precompile_fn", make_precompile_fn),
        (CppBenchmarkRequest, "precompile", precompile),
    ):
        STATE.saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, new)


def _restore() -> None:
    while STATE.saved:
        owner, name, original = STATE.saved.pop()
        setattr(owner, name, original)


STATE.scope.connect(_patch, _restore)


# -- the public forms ---------------------------------------------------------------------------


@contextlib.contextmanager
def use(executor: Executor | None = None) -> Iterator[Executor]:
    """Within the block, Inductor's compiles run as tasks on ``executor``.

    While the block is open, ``torch.compile`` on any thread sends its Triton kernels, its C++
    kernels and max-autotune's template precompiles to the executor instead of Inductor's own
    pool and threads (an inner block of the current context wins; then the newest open block;
    then :func:`install`'s executor). Inductor's methods are put back when the last block (and
    any installation) closes, also on an exception.

    Until a worker of the executor has answered a readiness probe, Inductor compiles in the
    caller, as stock does until its own pool has answered; :func:`statistics` counts those
    compiles (``caller_cpp``, ``caller_triton``, ``caller_template``).

    Args:
        executor: where to compile; ``None`` means the process's shared default
            ``PrecompileExecutor`` (Inductor's worker count, a template with torch and Inductor
            imported), whose warm-up starts at once in the background, before this checks and
            imports Inductor. Its ``timeout`` and ``memory_limit`` bound each compile.

    Yields:
        The executor in use.

    Raises:
        UnsupportedTorchError: the installed torch is not 2.11 or 2.13, or its Inductor differs;
            nothing was patched.
        TypeError: ``executor`` is neither ``None`` nor a ``concurrent.futures.Executor``;
            nothing was opened or patched.
    """
    used = _start(check_executor(executor))
    block = STATE.scope.enter(executor)
    try:
        yield used
    finally:
        STATE.scope.exit(block)


def install(executor: Executor | None = None) -> None:
    """Make Inductor's compiles in this process run as tasks on ``executor`` until
    :func:`uninstall`; a second ``install()`` replaces the executor. ``use()`` blocks take
    precedence while open.

    Args:
        executor: where to compile; ``None`` means the shared default (see :func:`use`).

    Raises:
        UnsupportedTorchError: see :func:`use`; nothing was patched.
        TypeError: see :func:`use`.
    """
    _start(check_executor(executor))
    STATE.scope.install(executor)


def _start(executor: Executor | None) -> Executor:
    """``executor``, or the default executor with its warm-up started: before the seam's check
    imports Inductor (seconds), so that the workers start meanwhile. Only the release series is
    checked first (no import), so that an unsupported torch starts nothing."""
    if executor is not None:
        return executor
    _check_series(torch_version())
    return _default.default_executor()


def uninstall() -> None:
    """Undo :func:`install` (a no-op if not installed); compiles outside ``use()`` blocks are
    Inductor's own again."""
    STATE.scope.uninstall()


def installed() -> bool:
    """Return whether a compile starting now, on this thread, would run on an executor."""
    return STATE.scope.current() is not OFF


def statistics() -> _compiles.InductorStatistics:
    """How many of Inductor's compiles ran on an executor in this process, per kind."""
    return STATE.counts.snapshot()
