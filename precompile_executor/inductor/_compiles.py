"""What runs in place of Inductor's compile pool while an ``inductor`` scope is open.

Inductor hands every compile it runs in the background to one of two places, both on
``torch._inductor.async_compile.AsyncCompile``:

* ``process_pool().submit(_worker_compile_triton, load_kernel, extra_env, extra_config)`` for a
  Triton kernel — and, from ``AlgorithmSelectorCache.make_precompile_fn``, for each Triton
  template choice max-autotune will benchmark — once ``use_process_pool()`` says the pool is
  ready (stock: only after a first no-op task came back, so the first kernels compile in the
  caller);
* ``submit(task)``, a thread pool in the caller, for everything else; for a C++ kernel the task
  is ``functools.partial(_worker_compile_cpp, lock_path, builders)``, which runs the compiler
  and leaves the library on disk for the caller's ``load_fn`` to load.

:class:`Routes` holds the replacements ``_seam`` installs: ``use_process_pool`` is true once a
worker of the executor in scope has answered a real probe (:class:`Readiness`, as stock gates
its own pool; until then Inductor compiles in the caller, counted in :data:`COUNTS`),
``process_pool`` is a small adapter (:class:`ExecutorPool`) that sends the task to the executor
in scope, ``submit`` sends C++ builds there once it is ready and leaves every other task to
Inductor's threads, ``triton`` is Inductor's, counted when it compiled in the caller,
``make_precompile_fn`` marks the compiles it submits as template precompiles, and
``CppBenchmarkRequest.precompile`` (max-autotune's C++ template choices, built in a thread of
the caller by stock) builds through the same C++ route once the executor is ready. Each task
is Inductor's own function and arguments; its result comes back pickled, as from Inductor's own
pool, and lands where Inductor puts it (its code caches, ``CompiledTritonKernels``, the kernel
objects).

A compile that the *executor* failed — its worker crashed, it ran past the timeout or past the
memory limit — reaches Inductor as that error (``WorkerCrashedError``, ``TaskTimeoutError``,
``TaskMemoryError``) where Inductor reads the task's result, and Inductor reports it as it
reports any compile error. So that compiling the same code again compiles it afresh rather than
re-raising the cached failure, :class:`CompileFuture` forgets the failed entry in Inductor's
in-memory cache, and a C++ build's partial outputs, at the moment Inductor reads the failure.

Threads: the replacements run on whichever thread Inductor calls them from (the compiling
thread; for C++ templates, the threads of max-autotune's precompile pool). :data:`COUNTS` is
guarded by its own lock. ``CompileFuture`` copies the executor future's outcome on the thread
that settles it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from typing import Any, Final

from .. import TaskMemoryError, TaskTimeoutError, WorkerCrashedError
from .._base import BaseExecutor, in_background

log = logging.getLogger("precompile_executor.inductor")

KINDS: Final = ("cpp", "triton", "template", "other")
"""What a compile sent to the executor was: a C++ kernel, a Triton kernel, a max-autotune
template choice (Triton or C++), or another Inductor pool task (CuteDSL and similar)."""

CALLER_KINDS: Final = ("cpp", "triton", "template")
"""The kinds counted when Inductor compiled them in the caller because the executor was not
ready (no worker had answered its probe yet, or it failed the probe)."""

FAULTS: Final = (WorkerCrashedError, TaskTimeoutError, TaskMemoryError)
"""Failures that are the executor's verdict on the process, not the compiler's on the code."""


@dataclasses.dataclass(frozen=True)
class InductorStatistics:
    """How many of Inductor's compiles ran on an executor, in this process, since it started
    (or since ``precompile_executor.inductor.state.reset()``).

    Attributes:
        cpp: C++ kernel builds (``AsyncCompile.cpp`` / ``cpp_pybinding``).
        triton: Triton kernel compiles (``AsyncCompile.triton``).
        template: max-autotune's precompiles of template choices (Triton or C++).
        other: other tasks of Inductor's process pool (CuteDSL and similar kernels).
        failed: of all of these, how many failed (a compile error or a fault).
        caller_cpp: C++ kernel builds Inductor ran in the caller's threads because the executor
            was not ready yet (no worker had answered its readiness probe) or failed its probe.
        caller_triton: Triton kernels Inductor compiled in the caller for that reason.
        caller_template: max-autotune's template choices precompiled in the caller's threads
            for that reason.
    """

    cpp: int = 0
    triton: int = 0
    template: int = 0
    other: int = 0
    failed: int = 0
    caller_cpp: int = 0
    caller_triton: int = 0
    caller_template: int = 0

    @property
    def total(self) -> int:
        """All compiles that ran on an executor."""
        return self.cpp + self.triton + self.template + self.other

    @property
    def in_caller(self) -> int:
        """All compiles that ran in the caller because the executor was not ready."""
        return self.caller_cpp + self.caller_triton + self.caller_template


class Counts:
    """The process's compile counts (one instance, :data:`COUNTS`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent = dict.fromkeys(KINDS, 0)
        self._caller = dict.fromkeys(CALLER_KINDS, 0)
        self._failed = 0

    def in_caller(self, kind: str) -> None:
        """Count one compile of ``kind`` Inductor ran in the caller: the executor not ready."""
        with self._lock:
            self._caller[kind] += 1
        log.debug("a %s compile ran in the caller: the executor's workers are not ready", kind)

    def sent(self, kind: str) -> None:
        """Count one compile of ``kind`` sent to an executor."""
        with self._lock:
            self._sent[kind] += 1

    def failed(self) -> None:
        """Count one compile that failed."""
        with self._lock:
            self._failed += 1

    def snapshot(self) -> InductorStatistics:
        """Return the counts so far."""
        with self._lock:
            caller = {f"caller_{kind}": n for kind, n in self._caller.items()}
            return InductorStatistics(**self._sent, failed=self._failed, **caller)

    def reset(self) -> None:
        """Count from zero again (``state.reset()``)."""
        with self._lock:
            self._sent = dict.fromkeys(KINDS, 0)
            self._caller = dict.fromkeys(CALLER_KINDS, 0)
            self._failed = 0


COUNTS: Final = Counts()
"""The process's counts; ``_state.InductorState.counts`` holds this object."""


@dataclasses.dataclass
class Ordering:
    """Whether Inductor's compiles start in the order Inductor sent them
    (:func:`in_submission_order`); ``_state.InductorState.in_submission_order`` reads and
    sets it (kept here so that this module needs nothing from ``_state``)."""

    in_submission_order: bool = True


ORDERING: Final = Ordering()

_template_targets: contextvars.ContextVar[TemplateTargets | None] = contextvars.ContextVar(
    "precompile_executor_inductor_template", default=None
)
"""Set while ``make_precompile_fn`` submits a template's choices (:class:`TemplateTargets`)."""


class CompileFuture(Future[Any]):
    """The future Inductor holds for one compile on the executor: the executor's outcome, and on
    a fault, ``forget`` called (once) when Inductor reads it.

    ``cancel()`` cancels the executor's task (a compile still queued does not run).
    """

    def __init__(
        self,
        inner: Future[Any],
        forget: Callable[[], None],
        land: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__()
        self._inner = inner
        self._forget: Callable[[], None] | None = forget
        self._land = land
        inner.add_done_callback(self._copy)

    def _copy(self, inner: Future[Any]) -> None:
        if inner.cancelled():
            super().cancel()
            self.set_running_or_notify_cancel()
            return
        error = inner.exception()
        if error is None:
            result = inner.result()
            if self._land is not None:
                # Before the result is set: whoever waits for it finds the kernel landed.
                try:
                    self._land(result)
                except Exception:  # noqa: BLE001 - the caller then compiles it, as stock does
                    log.debug("landing a compiled template choice failed", exc_info=True)
            self.set_result(result)
        else:
            COUNTS.failed()
            self.set_exception(error)

    def cancel(self) -> bool:
        return self._inner.cancel()

    def result(self, timeout: float | None = None) -> Any:
        try:
            return super().result(timeout)
        except FAULTS:
            self._forget_once()
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = super().exception(timeout)
        if isinstance(error, FAULTS):
            self._forget_once()
        return error

    def _forget_once(self) -> None:
        # Two threads reading the failure at once may both call it: forgetting is idempotent.
        forget, self._forget = self._forget, None
        if forget is not None:
            forget()


class Readiness:
    """Whether each executor's workers have answered Inductor's readiness probe (one instance,
    :data:`READINESS`).

    Stock Inductor submits a no-op (``AsyncCompile._get_ready``) to its pool the first time it
    asks ``use_process_pool()``, and sends compiles to the pool only once that no-op came back;
    until then it compiles in the caller, so a cold pool never holds a compile up. Here the same
    no-op goes to the executor in scope, once per executor (or view) for the process's life,
    inside :func:`~precompile_executor._base.in_background` (nobody waits for it: the switch
    interval stays the program's). A probe that fails (the executor shut down, broken, its
    worker lost) logs one WARNING and leaves that executor's compiles in the caller.

    Threads: any thread asks; the probes are kept under a lock; a probe's done-callback logs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probes: weakref.WeakKeyDictionary[Executor, Future[Any]] = weakref.WeakKeyDictionary()
        self._warned: weakref.WeakSet[Executor] = weakref.WeakSet()

    def probe(self, executor: Executor) -> Future[Any]:
        """The executor's readiness probe, sent the first time it is asked for."""
        with self._lock:
            probe = self._probes.get(executor)
        if probe is not None:
            return probe
        sent = _send_probe(executor)
        with self._lock:  # two threads asking at once: the first one stored wins
            probe = self._probes.setdefault(executor, sent)
        if probe is not sent:
            sent.cancel()
        return probe

    def ready(self, executor: Executor) -> bool:
        """Whether a worker of ``executor`` has answered its probe (sent now if not yet)."""
        probe = self.probe(executor)
        if not probe.done():
            return False
        if not probe.cancelled() and probe.exception() is None:
            return True
        self._warn_once(executor, probe)
        return False

    def _warn_once(self, executor: Executor, probe: Future[Any]) -> None:
        with self._lock:
            if executor in self._warned:
                return
            self._warned.add(executor)
        error = "cancelled" if probe.cancelled() else repr(probe.exception())
        log.warning(
            "precompile_executor.inductor: the executor %r failed Inductor's readiness probe "
            "(%s), so Inductor compiles in the caller, as without a compile pool; "
            "inductor.statistics() counts those compiles. Give use()/install() a working "
            "executor (or none, for the shared default) to compile on workers again.",
            executor,
            error,
        )

    def reset(self) -> None:
        """Forget every probe (``state.reset()``; a forked child, whose parent's probes it
        never sees answered)."""
        self._lock = threading.Lock()
        self._probes = weakref.WeakKeyDictionary()
        self._warned = weakref.WeakSet()


def _send_probe(executor: Executor) -> Future[Any]:
    from torch._inductor.async_compile import AsyncCompile

    asked = time.monotonic()
    name = repr(executor)  # not the executor: the probe, kept weakly keyed by it, must not hold it
    try:
        with in_background():
            probe = _unlimited(executor).submit(AsyncCompile._get_ready)
    except Exception as exc:  # noqa: BLE001 - shut down or broken: Readiness warns once
        probe = Future()
        probe.set_exception(exc)
        return probe

    def answered(done: Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            log.info(
                "Inductor's compiles go to %r from now on: a worker answered its readiness "
                "probe after %.2f s (%d compiles ran in the caller until then)",
                name,
                time.monotonic() - asked,
                COUNTS.snapshot().in_caller,
            )

    probe.add_done_callback(answered)
    return probe


def _unlimited(executor: Executor) -> Executor:
    """``executor`` without a time or memory limit, for the probe: a worker's process with
    torch imported is over a compile's memory limit on its own, and the probe asks whether a
    worker answers, not how fast. ``executor`` itself where it has neither: a view's future
    holds its view, and the probe, weakly keyed by ``executor``, must not hold that."""
    if not isinstance(executor, BaseExecutor):
        return executor
    limits = executor._options  # this package's executor: its (or its view's) options
    if limits.timeout is None and limits.memory_limit is None:
        return executor
    return executor.options(timeout=None, memory_limit=None)


READINESS: Final = Readiness()
"""The process's probes; ``_state.InductorState.readiness`` holds this object."""
os.register_at_fork(after_in_child=READINESS.reset)


class ExecutorPool:
    """What ``AsyncCompile.process_pool()`` returns in scope: a pool that sends to ``executor``.

    Inductor calls only ``submit(fn, *args)`` on it (and ``shutdown`` at exit, through its pool
    registry, which this pool never enters).
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Send ``fn(*args, **kwargs)`` to the executor (Inductor's readiness probe: the
        executor's one probe, :class:`Readiness`)."""
        from torch._inductor.async_compile import AsyncCompile
        from torch._inductor.runtime.compile_tasks import _worker_compile_triton

        if fn is AsyncCompile._get_ready:
            return READINESS.probe(self.executor)
        forget: Callable[[], None] = _nothing
        land: Callable[[Any], None] | None = None
        if fn is _worker_compile_triton:
            source = _triton_source(args[0])
            targets = _template_targets.get()
            kind = "triton" if targets is None else "template"
            forget = functools.partial(_forget_triton, source)
            target = None if targets is None or source is None else targets.get(source)
            if target is not None:
                land = functools.partial(_land_template, *target)
        else:
            kind = "other"
        COUNTS.sent(kind)
        executor = in_submission_order(self.executor)
        return CompileFuture(executor.submit(fn, *args, **kwargs), forget, land)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing: the executor is the caller's (or the shared default), not Inductor's."""


def _nothing() -> None:
    pass


_submitted = itertools.count(1)
"""Numbers Inductor's compiles in the order they were sent (``next()`` is atomic in CPython)."""


def in_submission_order(executor: Executor) -> Executor:
    """``executor``, or a view of it under which this compile starts after every compile of
    Inductor's sent before it (``state.in_submission_order``, the default).

    Inductor waits for its compiles in about the order it sent them: a template's choices,
    then the next template's (a fusion decision waits for one template's), then each fused
    candidate; its own pool runs them first come, first served. The executor's cost order
    would not: every Inductor compile is predicted from one function (its arguments are a
    kernel loader, paths and flags), so those sent before a first duration was observed
    (nothing known: predicted 0) would start after those sent later (predicted: the mean),
    and the first template's choices could be the last to start. Priorities just below the
    executor's own, falling with each compile and staying above ``own - 1``, order them among
    themselves alone (tests/test_inductor.py,
    ``test_inductors_compiles_start_in_the_order_inductor_submitted_them``). An executor
    without ``options()`` is used as it is.
    """
    if not ORDERING.in_submission_order or not isinstance(executor, BaseExecutor):
        return executor
    own = executor._options.priority  # this package's executor: its (or its view's) priority
    return executor.options(priority=own - 1.0 + 1.0 / (1 + next(_submitted)))


def _triton_source(load_kernel: Any) -> str | None:
    """The kernel source of ``functools.partial(_load_triton_kernel_from_source, name, src)``."""
    args: tuple[Any, ...] = getattr(load_kernel, "args", ())
    return args[1] if len(args) == 2 and isinstance(args[1], str) else None


def _forget_triton(source: str | None) -> None:
    from torch._inductor.async_compile import CompiledTritonKernels

    if source is not None:
        CompiledTritonKernels.remove_future(source)


class TemplateTargets:
    """Where each Triton template choice of one ``make_precompile_fn`` call is to land: its
    kernel source (what Inductor sends to compile; it reads it from the choice's
    ``module_path``) → (``module_path``, ``kernel_name``). Read from the files on the first
    lookup, that is once the call submits a compile (not when its timings are cached)."""

    def __init__(self, choices: Any) -> None:
        self._choices = list(choices) if isinstance(choices, (list, tuple)) else []
        self._targets: dict[str, tuple[str, str]] | None = None

    def get(self, source: str) -> tuple[str, str] | None:
        """The (module path, kernel name) whose module holds ``source``, if a choice's."""
        if self._targets is None:
            from torch._inductor.autotune_process import TritonGPUBenchmarkRequest

            self._targets = {}
            for choice in self._choices:
                request = getattr(choice, "bmreq", None)
                if not isinstance(request, TritonGPUBenchmarkRequest):
                    continue
                try:
                    with open(request.module_path) as file:
                        self._targets[file.read()] = (request.module_path, request.kernel_name)
                except OSError:
                    continue  # Inductor's own read fails alike, and reports it
        return self._targets.get(source)


def _land_template(module_path: str, kernel_name: str, result: Any) -> None:
    """Give a template choice's kernel in the caller the compile the executor returned.

    Benchmarking a choice runs ``getattr(module, kernel_name)`` of the module Inductor loaded
    for it (``TritonBenchmarkRequest.make_run_fn``: ``PyCodeCache.load_by_key_path``, cached by
    path), and that kernel compiles itself in the caller when it has no compile results
    (``CachingAutotuner.precompile``), one choice after another: the kernel the worker built
    (``_worker_compile_triton`` returns it) is nowhere Inductor looks. Stock reaches the same
    state only when its pool is not ready yet and the choice compiles in a thread of the caller,
    on that very kernel. Here the worker's compile results become that kernel's, as
    ``_precompile_worker`` would have set them; launching (loading the binary) stays with the
    caller, as for every kernel from Inductor's pool.
    """
    from torch._inductor.codecache import PyCodeCache

    compiled = result[0] if isinstance(result, tuple) and result else None
    results = getattr(compiled, "compile_results", None)
    module = PyCodeCache.modules_no_attr.get(module_path)
    kernel = getattr(module, kernel_name, None)
    if not results or kernel is None or not hasattr(kernel, "compile_results"):
        return
    with kernel.lock:
        if kernel.compile_results or kernel.launchers:
            return  # compiled meanwhile: keep what the caller has
        kernel.compile_results = list(results)
        kernel.configs = None


def _forget_cpp(task: functools.partial[Any]) -> None:
    """Forget a failed C++ build: its ``load_fn`` in the code caches and its partial outputs.

    The caches are keyed by the hash of the code and its command lines, which is the lock
    file's name (``CppCodeCache.load_async``); while a key is cached no second build of it
    starts, so the entry under it is this build's.
    """
    from torch._inductor import codecache

    lock_path, builders = task.args[0], task.args[1]
    key = os.path.basename(lock_path).removesuffix(".lock")
    for cache in _cpp_caches(codecache):
        cache.pop(key, None)
    # A build killed mid-write can leave a truncated library or object behind, and
    # load_async skips a build whose output exists.
    for builder in builders:
        try:
            os.unlink(builder.get_target_file_path())
        except FileNotFoundError:
            pass


def _cpp_caches(codecache: Any) -> list[dict[str, Any]]:
    caches: list[dict[str, Any]] = []
    for name in ("CppCodeCache", "CppPythonBindingsCodeCache", "CppWrapperCodeCache"):
        cache = getattr(getattr(codecache, name, None), "cache", None)
        if isinstance(cache, dict) and not any(cache is c for c in caches):
            caches.append(cache)
    return caches


class Routes:
    """The replacements ``_seam`` installs, sending to whichever executor ``executor_now()``
    returns (``None``: no scope is open, so Inductor's originals run).

    Args:
        executor_now: the executor for a compile starting now, on this thread.
        originals: Inductor's functions as found (``process_pool``, ``use_process_pool``,
            ``submit``, ``triton``, ``make_precompile_fn``, ``cpp_precompile``; the functions
            under the static- and classmethods), to fall back to.
    """

    def __init__(
        self, executor_now: Callable[[], Executor | None], originals: Mapping[str, Any]
    ) -> None:
        self._executor_now = executor_now
        self._originals = dict(originals)

    def process_pool(self) -> Any:
        """``AsyncCompile.process_pool()``: a pool on the executor in scope."""
        executor = self._executor_now()
        if executor is None:
            return self._originals["process_pool"]()
        return ExecutorPool(executor)

    def use_process_pool(self, cls: Any) -> bool:
        """``AsyncCompile.use_process_pool()``: true once a worker of the executor answered its
        readiness probe (:class:`Readiness`), as stock gates its own pool; false while Inductor
        compiles in the caller on purpose (``compile_threads`` 1, or Proton profiling).

        Inside ``make_precompile_fn`` Inductor asks this once per Triton template choice it is
        about to precompile, and precompiles the choice in its caller-side threads when the
        answer is no: each such no is counted as a template choice compiled in the caller."""
        executor = self._executor_now()
        if executor is None:
            return bool(self._originals["use_process_pool"](cls))
        from torch._inductor import config

        if not _parallel() or getattr(config.triton, "proton_profiling", False):
            return False
        if READINESS.ready(executor):
            return True
        if _template_targets.get() is not None:
            COUNTS.in_caller("template")
        return False

    def submit(self, cls: Any, task: Callable[..., Any]) -> Any:
        """``AsyncCompile.submit(task)``: a C++ build goes to the executor once it is ready
        (before that, Inductor's thread pool builds it, counted); any other task to Inductor's
        thread pool."""
        executor = self._executor_now()
        if executor is not None and _is_cpp_build(task) and _parallel():
            if READINESS.ready(executor):
                return self.submit_cpp(executor, task, "cpp")
            COUNTS.in_caller("cpp")
        return self._originals["submit"](cls, task)

    def triton(self, compiler: Any, /, *args: Any, **kwargs: Any) -> Any:
        """``AsyncCompile.triton``: Inductor's own; a kernel it compiled in the caller, neither
        cached nor sent to the pool (the executor not ready yet), is counted."""
        if self._executor_now() is None or not _parallel():
            return self._originals["triton"](compiler, *args, **kwargs)
        from torch._inductor.async_compile import CompiledTritonKernels
        from torch._inductor.codecache import CodeCacheFuture

        source = args[1] if len(args) > 1 else kwargs.get("source_code")
        cached = isinstance(source, str) and CompiledTritonKernels.get(source) is not None
        kernel = self._originals["triton"](compiler, *args, **kwargs)
        interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
        if not cached and not interpreted and not isinstance(kernel, CodeCacheFuture):
            COUNTS.in_caller("template" if _template_targets.get() is not None else "triton")
        return kernel

    @staticmethod
    def submit_cpp(executor: Executor, task: Any, kind: str) -> CompileFuture:
        """Send one C++ build (``partial(_worker_compile_cpp, ...)``) to ``executor``."""
        COUNTS.sent(kind)
        ordered = in_submission_order(executor)
        return CompileFuture(ordered.submit(task), functools.partial(_forget_cpp, task))

    def make_precompile_fn(self, selector: Any, /, *args: Any, **kwargs: Any) -> Any:
        """``AlgorithmSelectorCache.make_precompile_fn``: Inductor's, with the Triton compiles it
        submits counted as template precompiles, each landing in the choice's kernel that
        benchmarking runs (:func:`_land_template`)."""
        if self._executor_now() is None:
            return self._originals["make_precompile_fn"](selector, *args, **kwargs)
        choices = args[0] if args else kwargs.get("choices", ())
        token = _template_targets.set(TemplateTargets(choices))
        try:
            return self._originals["make_precompile_fn"](selector, *args, **kwargs)
        finally:
            _template_targets.reset(token)

    def cpp_precompile(self, request: Any) -> None:
        """``CppBenchmarkRequest.precompile``: stock builds the choice with
        ``CppCodeCache.load`` in a thread of the caller; here the same ``load_async`` sends the
        build to the executor and this thread loads the library once it is on disk."""
        executor = self._executor_now()
        if executor is None:
            self._originals["cpp_precompile"](request)
            return
        if not _parallel() or not READINESS.ready(executor):
            if _parallel():
                COUNTS.in_caller("template")
            self._originals["cpp_precompile"](request)
            return
        from torch._inductor.codecache import CppCodeCache

        submit = functools.partial(self.submit_cpp, executor, kind="template")
        CppCodeCache.load_async(request.source_code, device_type="cpu", submit_fn=submit)()


def _parallel() -> bool:
    """Whether Inductor compiles in the background at all (``compile_threads`` > 1)."""
    from torch._inductor.async_compile import get_compile_threads

    return get_compile_threads() > 1


def _is_cpp_build(task: Any) -> bool:
    from torch._inductor.codecache import _worker_compile_cpp

    return isinstance(task, functools.partial) and task.func is _worker_compile_cpp
