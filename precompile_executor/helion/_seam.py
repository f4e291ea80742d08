"""The seam: check Helion's precompile hooks, swap them for ours, put them back.

Helion 1.5.1 has no supported extension point for precompilation: ``autotune_precompile`` takes
only ``"fork"``, ``"spawn"`` or ``None``. Its benchmark provider calls exactly two static methods
of the class ``helion.autotuner.precompile_future.PrecompileFuture`` — ``create(ctx=, config=,
fn=, args=, result_path=, args_path=)`` once per config, then ``wait_for_all(futures, desc=None)``
once per batch — and imports the class object, so replacing those two attributes on the class is
seen by every caller (rebinding a module-level name would not be). That is all this module
touches. Because this code moved several times in 2026, :func:`check_helion` pins the version and
the signatures and names every private helper we reuse, and refuses anything else.

Which executor (:func:`use`, :func:`install`): one rule for every integration, the scope rule
(``docs/helion.md``, "Which executor: the scope rule"; ``precompile_executor._scope``). A
``use()`` block is open for the whole process while it is open: an autotune on any thread goes
through it. The innermost block of the current context wins, then the newest block open
anywhere, then ``install()``'s executor, else Helion runs stock. Helion's methods are patched
once, when the first holder arrives, and put back when the last leaves (the scope's
activate/deactivate); the patched methods ask the scope which executor to use at each call.

Threads: patching and restoring run under the scope's lock, on the thread of the arriving or
leaving holder; the patched methods run on whatever thread runs the autotune.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

from .. import PrecompileExecutor
from .._cluster_executor import ClusterExecutor
from .._scope import check_executor
from . import _bench_worker, _warm, _while_starting
from ._errors import UnsupportedHelionError as UnsupportedHelionError  # the seam's API
from ._state import STATE, Originals
from ._warm import HelionExecutor
from ._warm import current_executor as current_executor  # re-exported: the seam's API
from ._warm import uses as uses

SUPPORTED_HELION_VERSIONS = ("1.5.1",)
"""Helion releases whose precompile seam this module was written against and tested with."""

_CREATE_PARAMS = ("ctx", "config", "fn", "args", "result_path", "args_path")
_WAIT_PARAMS = ("futures", "desc")
_SKIP_PARAMS = ("ctx", "config", "ok")
_CONTEXT_FIELDS = {"settings", "log", "kernel", "args", "jobs"}
_PRIVATE_HELPERS = (
    ("helion.autotuner.precompile_future", "_prepare_precompiler_for_fork"),
    ("helion.autotuner.precompile_future", "_serialize_compiled_fn"),
    ("helion.autotuner.precompile_future", "_load_compiled_fn"),
    ("helion.autotuner.precompile_future", "_unload_compiled_fn"),
    ("helion.autotuner.precompile_future", "SerializedCompiledFunction"),
    ("helion.autotuner.logger", "classify_triton_exception"),
    ("helion.autotuner.logger", "maybe_dump_triton_failure"),
    ("helion.autotuner.logger", "log_generated_triton_code_debug"),
    ("helion.autotuner.logger", "format_triton_compile_failure"),
    ("helion.autotuner.logger", "SUPPRESSED_TRITON_CODE_MSG"),
    ("helion.autotuner.progress_bar", "iter_with_progress"),
    ("helion.autotuner.benchmarking", "synchronize_device"),
    ("helion.runtime.precompile_shim", "classify_triton_exception"),
    ("helion.exc", "TritonError"),
    ("helion.autotuner.benchmark_provider", "BenchmarkResult"),
    ("helion.autotuner.benchmark_provider", "_searching_candidates"),
    ("helion.autotuner.benchmark_provider", "_unset_fn"),
    ("helion.autotuner.logger", "capture_output"),
    ("helion.runtime.triton.launcher", "compile_only_launch_args"),
    ("helion.autotuner.benchmark_provider", "_clone_args"),
    ("helion.autotuner.benchmark_worker", "BenchmarkWorker"),
    ("helion.autotuner.benchmark_worker", "_worker_loop"),
    ("helion.autotuner.effort_profile", "get_effort_profile"),
    ("helion.autotuner.benchmark_job", "BenchmarkJob"),
)
# The streaming provider (``_provider``) overrides or calls these LocalBenchmarkProvider methods;
# ``*`` marks where keyword-only parameters start.
_PROVIDER_METHODS = {
    "__init__": ("self", "kernel", "settings", "config_spec", "args", "log", "autotune_metrics"),
    "benchmark": ("self", "configs", "*", "desc", "raise_if_no_viable_config"),
    "_benchmark_function": ("self", "config", "fn", "*", "effective_source_hash"),
    "benchmark_isolated": (
        "self",
        "fns",
        "*",
        "warmup",
        "rep",
        "desc",
        "fresh_process",
        "args_slots",
        "timeout",
    ),
    "_create_precompile_future": ("self", "config", "fn"),
    "_subprocess_benchmark_enabled": ("self",),
    "_budget_exceeded_synced": ("self",),
    "_compute_baseline": ("self",),
    "_compute_effective_tolerances": ("self",),
    "setup": ("self",),
    "_precompile_context": ("self",),
    "_next_precompile_result_path": ("self",),
    "cleanup": ("self",),
}
# Helion's benchmark subprocess, which the provider starts early (_bench_worker).
_WORKER_METHODS = {
    "__init__": ("self", "device"),
    "_start": ("self",),
    "_kill": ("self",),
    "run": ("self", "job", "timeout"),
    "shutdown": ("self",),
}
_WORKER_SETTINGS = ("autotune_benchmark_subprocess", "autotune_benchmark_timeout")
# What LocalBenchmarkProvider derives from its baseline run (in __init__): the provider defers
# the run in fork mode and computes these on first use (_provider, "the baseline").
_AFTER_BASELINE = (
    "_baseline_output",
    "mutated_arg_indices",
    "_baseline_post_args",
    "_effective_atol",
    "_effective_rtol",
)
# Names these functions' code must still use: how the provider is chosen and reached.
_CODE_USES = (
    ("helion.autotuner.base_search", "BaseSearch", "__init__", "_benchmark_provider_cls"),
    ("helion.autotuner.base_search", "BaseSearch", "_prepare", "_benchmark_provider_cls"),
    (
        "helion.autotuner.benchmark_provider",
        "LocalBenchmarkProvider",
        "benchmark",
        "_create_precompile_future",
    ),
    ("helion.autotuner.benchmark_provider", "LocalBenchmarkProvider", "benchmark", "wait_for_all"),
    (
        "helion.autotuner.benchmark_provider",
        "LocalBenchmarkProvider",
        "benchmark",
        "_no_viable_config_error",
    ),
    (
        "helion.autotuner.benchmark_provider",
        "LocalBenchmarkProvider",
        "benchmark",
        "_benchmark_function",
    ),
    # measuring in this process while the benchmark subprocess starts (_while_starting): the
    # in-process path is the one _benchmark_function takes with the subprocess path off
    (
        "helion.autotuner.benchmark_provider",
        "LocalBenchmarkProvider",
        "_benchmark_function",
        "_subprocess_benchmark_enabled",
    ),
    # the benchmark worker the provider starts early: where Helion keeps and uses it
    (
        "helion.autotuner.benchmark_provider",
        "LocalBenchmarkProvider",
        "__init__",
        "_benchmark_worker",
    ),
    (
        "helion.autotuner.benchmark_provider",
        "LocalBenchmarkProvider",
        "_run_subprocess_benchmark_job",
        "_benchmark_worker",
    ),
    (
        "helion.autotuner.benchmark_provider",
        "LocalBenchmarkProvider",
        "cleanup",
        "_benchmark_worker",
    ),
    ("helion.autotuner.benchmark_worker", "BenchmarkWorker", "_start", "_process"),
    ("helion.autotuner.benchmark_worker", "BenchmarkWorker", "_start", "_parent_connection"),
    ("helion.autotuner.benchmark_worker", "BenchmarkWorker", "__init__", "_parent_connection"),
    ("helion.autotuner.benchmark_worker", "BenchmarkWorker", "run", "_parent_connection"),
    # the baseline's results, set in __init__ and deferred by the provider in fork mode
    *(
        ("helion.autotuner.benchmark_provider", "LocalBenchmarkProvider", "__init__", name)
        for name in (
            "_compute_baseline",
            "_compute_effective_tolerances",
            *_AFTER_BASELINE,
        )
    ),
)


def helion_version() -> str:
    """Return the installed Helion's version (raises ``UnsupportedHelionError`` if absent)."""
    try:
        return importlib.metadata.version("helion")
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedHelionError(
            "Helion is not installed: pip install 'precompile-executor[helion]'"
        ) from None


def check_helion(*, version: str | None = None) -> None:
    """Check that the installed Helion has exactly the seam this integration patches.

    Args:
        version: the version to check instead of the installed one (for tests).

    Raises:
        UnsupportedHelionError: another version, a changed signature, or a missing helper; the
            message says which, and that nothing was patched.
    """
    found = helion_version() if version is None else version
    if found not in SUPPORTED_HELION_VERSIONS:
        raise UnsupportedHelionError(
            f"precompile_executor.helion supports Helion {', '.join(SUPPORTED_HELION_VERSIONS)}, "
            f"found {found}: its precompile seam (PrecompileFuture.create/wait_for_all) changes "
            "between releases. Nothing was patched. Install helion==1.5.1, or autotune without "
            "precompile_executor.helion.use()."
        )
    problems = _seam_problems()
    if problems:
        raise UnsupportedHelionError(
            f"Helion {found}'s precompile seam is not the one precompile_executor.helion "
            "patches (nothing was patched):\n  " + "\n  ".join(problems)
        )


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _params_with_star(fn: Any) -> tuple[str, ...]:
    out: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in out:
            out.append("*")
        out.append(p.name)
    return tuple(out)


def _seam_problems() -> list[str]:
    from helion.autotuner import precompile_future as pf

    problems = []
    cls = pf.PrecompileFuture
    for name, want in (
        ("create", _CREATE_PARAMS),
        ("wait_for_all", _WAIT_PARAMS),
        ("skip", _SKIP_PARAMS),
    ):
        raw = inspect.getattr_static(cls, name, None)
        if not isinstance(raw, staticmethod):
            problems.append(f"PrecompileFuture.{name} is not a staticmethod")
            continue
        got = _params(raw.__func__)
        if got != want:
            problems.append(f"PrecompileFuture.{name}{got} != expected {want}")
    fields = {f.name for f in dataclasses.fields(pf.PrecompileContext)}
    if not fields >= _CONTEXT_FIELDS:
        problems.append(f"PrecompileContext lacks {sorted(_CONTEXT_FIELDS - fields)}")
    for module_name, attr in _PRIVATE_HELPERS:
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):
            problems.append(f"{module_name}.{attr} is missing")
    # The fork task reads the exception that Helion's finish_it() swallows through the
    # module-global classify_triton_exception it calls (see _fork_task).
    from helion.runtime import precompile_shim

    finish_it = _inner_code(precompile_shim.make_precompiler.__code__, "finish_it")
    if finish_it is None or "classify_triton_exception" not in finish_it.co_names:
        problems.append("make_precompiler's finish_it no longer calls classify_triton_exception")
    problems += _provider_problems()
    return problems


def _provider_problems() -> list[str]:
    from helion.autotuner import base_search, benchmark_provider

    problems = []
    local = benchmark_provider.LocalBenchmarkProvider
    for name, want in _PROVIDER_METHODS.items():
        raw = inspect.getattr_static(local, name, None)
        if not inspect.isfunction(raw):
            problems.append(f"LocalBenchmarkProvider.{name} is not a method")
            continue
        got = _params_with_star(raw)
        if got != want:
            problems.append(f"LocalBenchmarkProvider.{name}{got} != expected {want}")
    from helion.autotuner.benchmark_worker import BenchmarkWorker
    from helion.runtime.settings import Settings

    for name, want in _WORKER_METHODS.items():
        raw = inspect.getattr_static(BenchmarkWorker, name, None)
        if not inspect.isfunction(raw) or _params(raw) != want:
            problems.append(f"BenchmarkWorker.{name}{want} is missing or changed")
    from helion.autotuner import benchmark_worker

    loop = getattr(benchmark_worker, "_worker_loop", None)
    if not inspect.isfunction(loop) or _params(loop) != ("connection", "device"):
        problems.append("benchmark_worker._worker_loop(connection, device) is missing or changed")
    from helion.autotuner import benchmark_job, kernel_args

    from ._bench_worker import RELEASED_CACHES

    for cached in RELEASED_CACHES:
        fn = getattr(benchmark_job, cached, None) or getattr(kernel_args, cached, None)
        if not hasattr(fn, "cache_clear"):
            problems.append(f"Helion's worker-side cache {cached} is missing or not a cache")
    fields = {f.name for f in dataclasses.fields(Settings)}
    for name in _WORKER_SETTINGS:
        if name not in fields:
            problems.append(f"Settings.{name} is missing")
    prepare = inspect.getattr_static(base_search.BaseSearch, "_prepare", None)
    if not inspect.isfunction(prepare) or _params(prepare) != ("self",):
        problems.append("BaseSearch._prepare(self) is missing or changed")
    for module_name, cls_name, method, name in _CODE_USES:
        cls = getattr(importlib.import_module(module_name), cls_name, None)
        fn = inspect.getattr_static(cls, method, None) if cls is not None else None
        code = getattr(fn, "__code__", None)
        if code is None or name not in _names(code):
            problems.append(f"{cls_name}.{method} no longer uses {name}")
    return problems


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _inner_code(code: types.CodeType, name: str) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            found = _inner_code(const, name)
            if found is not None:
                return found
    return None


# -- patching: once, for the first holder of the scope ---------------------------------------------


def _patch() -> Originals:
    """Replace Helion's three attributes with ours; return what was there (the scope's
    ``activate``: run under its lock when the first holder arrives)."""
    from helion.autotuner.base_search import BaseSearch
    from helion.autotuner.precompile_future import PrecompileFuture

    from . import _future

    found = Originals(
        inspect.getattr_static(PrecompileFuture, "create"),
        inspect.getattr_static(PrecompileFuture, "wait_for_all"),
        inspect.getattr_static(BaseSearch, "_prepare"),
    )
    PrecompileFuture.create = staticmethod(_future.create)
    PrecompileFuture.wait_for_all = staticmethod(_future.wait_for_all)
    BaseSearch._prepare = _streaming_prepare(found.prepare)
    return found


def _restore(found: Originals) -> None:
    """Put Helion's attributes back (the scope's ``deactivate``: the last holder left)."""
    from helion.autotuner.base_search import BaseSearch
    from helion.autotuner.precompile_future import PrecompileFuture

    PrecompileFuture.create = found.create
    PrecompileFuture.wait_for_all = found.wait_for_all
    BaseSearch._prepare = found.prepare


STATE.connect(_patch, _restore)


def _streaming_prepare(original: Any) -> Any:
    """``BaseSearch._prepare`` that builds the streaming provider where the search would build
    Helion's plain ``LocalBenchmarkProvider`` (a provider class the caller chose is kept)."""
    from helion.autotuner.benchmark_provider import LocalBenchmarkProvider

    from ._provider import StreamingBenchmarkProvider

    def _prepare(self: Any) -> None:
        if getattr(self, "_benchmark_provider_cls", None) is LocalBenchmarkProvider:
            self._benchmark_provider_cls = StreamingBenchmarkProvider
        original(self)
        provider = getattr(self, "benchmark_provider", None)
        if isinstance(provider, StreamingBenchmarkProvider):
            # Its adaptive timeout's quantile and lower bound (``_adaptive.rule_for``); a
            # search without them, or a provider kept elsewhere, falls back to the effort profile.
            provider.search = self

    _prepare.__wrapped__ = original  # type: ignore[attr-defined]
    return _prepare


# -- holders: use() blocks and the installation ------------------------------------------------


def installed() -> bool:
    """Whether Helion's precompile runs on an executor now: a :func:`use` block is open (on any
    thread) or :func:`install` is in effect."""
    return STATE.active()


def _arrive(
    executor: HelionExecutor | None, *, process_wide: bool, measure_while_worker_starts: Any
) -> Any:
    """Everything before a holder joins the scope: the head starts, the check, the default
    executor; then ``join(executor, options)`` (the scope's ``enter`` or ``install``), whose
    first call patches Helion. Returns what ``join`` returned; on a refusal nothing stays
    built."""
    check_executor(
        executor,
        (PrecompileExecutor, ClusterExecutor),
        "a PrecompileExecutor or a cluster executor (fork mode only)",
    )
    options = _while_starting.options(measure_while_worker_starts)
    with STATE.lock:
        STATE.arriving += 1  # a concurrent last exit leaves a spare started here alone
    try:
        if "helion" not in sys.modules and helion_version() in SUPPORTED_HELION_VERSIONS:
            # Ahead of `import helion` (install() at the top of a program): Helion's benchmark
            # worker and, in spawn mode, the executor's template import Helion beside this
            # process's own import (docs/helion.md, "Warm-up off the clock").
            _bench_worker.prestart_before_helion()
            if executor is None:
                _warm.start_before_helion()
        try:
            check_helion()  # before anything is patched; on refusal nothing stays built
        except BaseException:
            _warm.discard_early()
            raise
        if process_wide:
            # install(): one spare per process, kept warm across autotunes. A use() block
            # leaves the start to its autotune's provider: blocks that autotune nothing (a
            # kernel already tuned) would each start and kill a process for nothing.
            _bench_worker.prestart_with_torch()  # a no-op when the spare above is there
        built = executor is None
        resolved = _warm.default_executor() if executor is None else executor
        join = STATE.scope.install if process_wide else STATE.scope.enter
        joined = join(executor, options)
    except BaseException:
        with STATE.lock:
            STATE.arriving -= 1
        if not STATE.active():
            _bench_worker.discard()  # a spare started for this holder, which never arrived
        raise
    with STATE.lock:
        STATE.arriving -= 1
    if built and _warm.default_mode_is_spawn():
        _warm.start_default_warm_up()
    _warm.start_caller_warm_up()  # fork-mode children inherit it (docs/helion.md, "Fork mode")
    return joined, resolved


@contextlib.contextmanager
def use(
    executor: HelionExecutor | None = None, *, measure_while_worker_starts: bool = True
) -> Iterator[HelionExecutor]:
    """Within the block, Helion's autotunes precompile on ``executor`` and benchmark each config
    as soon as its precompile lands.

    The block is open for the whole process while it is open: an autotune started on *any*
    thread (the one that entered it, autograd's, a ``threading.Thread``, a pool thread, one that
    existed before) goes through it. Where several are open, the innermost block entered in the
    current context wins, then the most recently entered block still open anywhere, then
    :func:`install`'s executor (docs/helion.md, "Which executor: the scope rule"). Blocks may
    exit in any order; the last holder to leave puts Helion's methods back, also on an exception.

    Helion's ``autotune_precompile="fork"`` runs each config's compile on the executor's fork
    path; ``"spawn"`` runs each config once on the executor's warm spawn workers. A cluster
    executor (``DaskPrecompileExecutor``, ``RayPrecompileExecutor``) takes fork mode only: each
    compile runs on a node for this process's GPU and its files come back here; spawn mode is
    refused there (docs/helion.md, "On a cluster"). Without an
    executor, the process's executor for Helion is built once (``import_helion`` in the template,
    the current CUDA device, Helion's ``autotune_precompile_jobs``) and, in spawn mode, warmed in
    the background at once; until a spawn worker has answered, configs waiting for one are
    compiled on the fork path instead (docs/helion.md, "Cold start: nothing waits for
    workers"). An autotune in the block starts Helion's benchmark subprocess when its provider is
    built and, at its end, keeps it warm for the next autotune while a holder is open; when the
    last holder leaves, a spare nobody took is killed. While that subprocess is still starting,
    configs are measured in the autotuning process by Helion's own in-process path, and every
    later one in the subprocess (docs/helion.md, "Measured here while the benchmark subprocess
    starts").

    Example::

        with precompile_executor.helion.use():
            kernel.autotune(args)

    Args:
        executor: where to precompile; ``None``: the process's executor for Helion.
        measure_while_worker_starts: ``True`` (the default): while Helion's benchmark
            subprocess has not finished its cold start, measure configs in the autotuning
            process, giving up the subprocess's isolation (its timeout on a kernel that hangs,
            a sticky CUDA error kept out of this process) for those configs only. ``False``:
            every measurement waits for the subprocess, as with Helion alone.

    Yields:
        The executor (the default executor when none was given).

    Raises:
        UnsupportedHelionError: the installed Helion is not a supported version (nothing is
            patched).
        TypeError: ``executor`` is neither a :class:`PrecompileExecutor` nor a cluster
            executor (``DaskPrecompileExecutor``, ``RayPrecompileExecutor``: fork mode's
            compiles run on its nodes, spawn mode is refused; docs/helion.md, "On a cluster"),
            or ``measure_while_worker_starts`` is not a bool; nothing was opened.
    """
    block, resolved = _arrive(
        executor, process_wide=False, measure_while_worker_starts=measure_while_worker_starts
    )
    try:
        yield resolved
    finally:
        STATE.scope.exit(block)
        STATE.discard_doomed()


def install(
    executor: HelionExecutor | None = None, *, measure_while_worker_starts: bool = True
) -> None:
    """Make every later Helion autotune in this process, on any thread, precompile on
    ``executor`` (default: the process's executor for Helion, as :func:`use` builds it) where no
    :func:`use` block is open (docs/helion.md, "Which executor: the scope rule").

    The process-wide form of :func:`use`; :func:`uninstall` undoes it. Installing again
    replaces the executor (the spare benchmark worker stays). Called as the program's first
    lines, before ``import torch`` and ``import helion``, it starts Helion's benchmark
    subprocess (and, in spawn mode, the executor's template) beside the program's own imports;
    while installed, that subprocess stays warm from one autotune to the next (docs/helion.md,
    "Helion's benchmark subprocess, started before the autotune").

    Args:
        executor: as in :func:`use`.
        measure_while_worker_starts: as in :func:`use` (a spare already warm when the autotune
            starts leaves nothing to measure here).

    Raises:
        UnsupportedHelionError: the installed Helion is not a supported version.
        TypeError: ``executor`` is neither a :class:`PrecompileExecutor` nor a cluster
            executor, or ``measure_while_worker_starts`` is not a bool (as in :func:`use`).
    """
    _arrive(executor, process_wide=True, measure_while_worker_starts=measure_while_worker_starts)


def uninstall() -> None:
    """Undo :func:`install` (a no-op if it is not installed); open :func:`use` blocks stay."""
    STATE.scope.uninstall()
    STATE.discard_doomed()
