"""Caller side: turn one Triton compile into a task, and its result into a ``CompiledKernel``.

::

    caller                                         worker process
    ------                                         --------------
    ASTSource(fn, signature, constexprs, attrs)
      │  expected_hash(); cache hit? ─► done, no task
      ▼
    CompileRequest (KernelRef, plain data) ──────► compile_request()
                                                     load_kernel(): import, or rebuild from source
                                                     triton.compile() into a private temp cache
    CompiledArtifacts (hash, {name: bytes}) ◄───── read the group's files as bytes
      │  install(): put files, then the group, into the caller's cache
      ▼
    CompiledKernel(src, group, hash) ─► CompileJob.future

The future a :class:`CompileJob` holds resolves in the executor's result thread, as soon as the
worker's answer arrives; a task's exception (a ``RemoteError`` proxy from
:class:`~precompile_executor.PrecompileExecutor`) becomes the future's exception unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from typing import Any

from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.compiler import ASTSource

from .._errors import ClusterNodeLost
from . import _worker
from ._cache import cached_group, expected_hash, install, load_compiled, metadata_filename
from ._classify import classify
from ._kernel_ref import kernel_ref, unwrap_jit_function
from ._messages import CompiledArtifacts, CompileRequest, encode_constexprs
from ._prewarm import caller_warming
from ._state import STATE
from ._target import parse_target
from ._worker import compile_request

NODE_LOST_RESENDS = 2
"""Times one compile is sent again after the cluster node that held it was lost. A cluster
backend never re-runs a task itself (it may have killed its node); a compile runs in a pool
worker of the node, whose crash fails that compile alone and leaves the node up, so a lost node
is the machine or its host process, and the compile may safely run elsewhere. Bounded, so that
a compile that does take nodes down cannot take the whole cluster."""


@dataclasses.dataclass(eq=False)
class CompileJob:
    """One compile as the caller sees it: sent to a worker, or found in the cache.

    Attributes:
        request: what was (or would have been) sent.
        future: resolves to the caller's ``CompiledKernel``, or to the task's exception.
        cached: the caller's cache already held the result; no task was submitted.
        artifacts: what the worker sent back, once it has.
        submitted_at: ``time.perf_counter()`` when the job was created.
        finished_at: ``time.perf_counter()`` when its future resolved.
        task_future: the executor's future of the compile task (``None`` when cached); join
            it with ``PrecompileExecutor.timeline()`` records by their ``future``. On a
            cluster, the future of the last send (see :data:`NODE_LOST_RESENDS`); after
            :meth:`reroute`, the future of the compile on the executor it was moved to.
        installed_at: ``time.monotonic()`` when the artifacts were in the caller's cache (the
            clock of the executor's timeline).
        resends: times the compile was sent again because the cluster node that held it was
            lost (at most :data:`NODE_LOST_RESENDS`).
        rerouted: the compile was taken out of the executor's queue before any worker started
            it and runs on the executor given to :meth:`reroute` (a caller lane) instead.
    """

    request: CompileRequest
    future: Future[Any]
    cached: bool = False
    artifacts: CompiledArtifacts | None = None
    submitted_at: float = dataclasses.field(default_factory=time.perf_counter)
    finished_at: float | None = None
    task_future: Future[Any] | None = None
    installed_at: float | None = None
    resends: int = 0
    rerouted: bool = False
    _executor: Executor | None = dataclasses.field(default=None, repr=False)
    _src: Any = dataclasses.field(default=None, repr=False)
    _moved: Future[Any] | None = dataclasses.field(default=None, repr=False)
    """The task future :meth:`reroute` cancelled: its cancellation does not end the job."""
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    """Serialises :meth:`reroute` (a tune's thread and a lane's thread may both move jobs)."""

    @property
    def description(self) -> str:
        """The kernel, its constexprs and main options, e.g. ``matmul[BLOCK_M=64, num_warps=4]``."""
        return self.request.description

    def result(self, timeout: float | None = None) -> Any:
        """Wait at most ``timeout`` seconds and return the ``CompiledKernel`` (see ``Future``)."""
        return self.future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait at most ``timeout`` seconds and return the task's exception, if any."""
        return self.future.exception(timeout)

    def done(self) -> bool:
        """Return whether the job has finished (compiled, failed, cancelled or cached)."""
        return self.future.done()

    def bind(self, executor: Executor, src: Any) -> None:
        """Submit the compile of ``src`` (an ``ASTSource``: the kernel its result loads) to
        ``executor``; cancelling :attr:`future` cancels the task."""
        self._executor, self._src = executor, src
        self.task_future = executor.submit(compile_request, self.request)
        self.future.add_done_callback(self._cancel_task)
        self.task_future.add_done_callback(self._finish)

    def reroute(self, executor: Executor) -> Future[Any] | None:
        """Move the compile, if no worker has started it, to ``executor``; return its new task
        future, or ``None`` (a worker has it, it is done, or the job is).

        The task is taken back by ``cancel()``, which returns True only while no worker has the
        task, and then none ever will (docs/design.md, "Sending ahead": the honest queue): the
        compile runs once, in one place. :attr:`future` is not cancelled: the compile runs as
        :func:`compile_request` on ``executor`` (threads of this process compile straight into
        its cache) and finishes the job through the same path as a worker's — its result is the
        ``CompiledKernel`` loaded from the cache, its exception the job's exception. Should
        ``executor`` refuse it (shut down), it goes back to the job's own executor.
        """
        with self._lock:
            task = self.task_future
            if task is None or self.rerouted or task.done() or self.future.done():
                return None
            self._moved = task
            if not task.cancel():  # a worker has it: it finishes the job
                self._moved = None
                return None
            self.rerouted = True
        try:
            again = executor.submit(compile_request, self.request)
        except RuntimeError:  # shut down (interpreter exit): the job's own executor compiles it
            self.rerouted = False
            assert self._executor is not None  # a job with a task was bound
            try:
                again = self._executor.submit(compile_request, self.request)
            except RuntimeError as exc:  # that one too: the refusal is the job's outcome
                again = Future()
                again.set_exception(exc)
        self.task_future = again
        again.add_done_callback(self._finish)
        if self.future.cancelled():  # cancelled meanwhile: _cancel_task saw the old task
            again.cancel()
        return again

    def _cancel_task(self, done: Future[Any]) -> None:
        if done.cancelled() and self.task_future is not None:
            self.task_future.cancel()

    def _finish(self, done: Future[Any]) -> None:
        """Resolve :attr:`future` from the task future ``done`` (on the thread that completed
        it: the executor's result thread, a lane's thread)."""
        outer, request = self.future, self.request
        if done.cancelled():
            if done is not self._moved:  # a task moved by reroute() is no cancellation
                outer.cancel()
            return
        exc = done.exception()
        lost = isinstance(exc, ClusterNodeLost)
        if lost and self.resends < NODE_LOST_RESENDS and not outer.done():
            # A compile is a pure function of its request, so one whose node was lost is sent
            # again and lands on another node (docs/dask.md, "Compile on CPU nodes").
            assert self._executor is not None
            try:
                again = self._executor.submit(compile_request, request)
            except RuntimeError:
                pass  # the executor was shut down meanwhile: the loss stands
            else:
                self.resends += 1
                self.task_future = again
                again.add_done_callback(self._finish)
                if outer.cancelled():
                    again.cancel()
                return
        if not outer.set_running_or_notify_cancel():
            return
        if exc is None:
            try:
                artifacts: CompiledArtifacts = done.result()
                group = install(artifacts, request.expected_hash)
                self.installed_at = time.monotonic()
                kernel = load_compiled(self._src, group, artifacts.hash)
            except BaseException as install_exc:  # noqa: BLE001 - delivered through the future
                exc = install_exc
            else:
                self.artifacts = artifacts
                self.finished_at = time.perf_counter()
                outer.set_result(kernel)
                return
        self.finished_at = time.perf_counter()
        outer.set_exception(exc)


def build_request(
    src: Any, target: Any, options: Mapping[str, Any], env_vars: Mapping[str, str]
) -> CompileRequest:
    """Return the picklable :class:`CompileRequest` for ``triton.compile(src, target, options)``.

    Raises:
        KernelTransferError: the kernel cannot be sent to another process.
        UnsupportedTritonError: see :func:`expected_hash`.
    """
    return CompileRequest(
        kernel=kernel_ref(src.fn),
        signature=dict(src.signature),
        constexprs=encode_constexprs(src.constants),
        attrs={tuple(path): value for path, value in dict(src.attrs).items()},
        target=(target.backend, target.arch, target.warp_size),
        options=dict(options),
        env_vars=dict(env_vars),
        expected_hash=expected_hash(src, target, options, env_vars),
        caller_pid=os.getpid(),
    )


def submit_compile(
    executor: Executor,
    src: Any,
    target: Any,
    options: Mapping[str, Any],
    env_vars: Mapping[str, str],
    *,
    force: bool = False,
) -> CompileJob:
    """Compile ``src`` for ``target`` in ``executor`` unless the caller's cache has it.

    Args:
        executor: runs :func:`compile_request`; any ``concurrent.futures.Executor``.
        src: a ``triton.compiler.ASTSource``.
        target: a ``GPUTarget``.
        options: backend options (``num_warps``, ``num_stages``, …).
        env_vars: the caller's cache-invalidating environment variables.
        force: compile even if the caller's cache has the result.

    Returns:
        The job; its future resolves to a ``CompiledKernel`` loaded from the caller's cache.
    """
    with caller_warming:  # a background warm_caller() still hashing: wait, don't hash twice
        pass
    request = build_request(src, target, options, env_vars)
    outer: Future[Any] = Future()
    job = CompileJob(request, outer)
    group = None if force else cached_group(request.expected_hash, metadata_filename(src))
    if group is not None:
        job.cached = True
        outer.set_running_or_notify_cancel()
        job.finished_at = time.perf_counter()
        outer.set_result(load_compiled(src, group, request.expected_hash))
        return job
    job.bind(executor, src)
    return job


def precompile(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[Any, Any] | None = None,
    *,
    target: Any,
    options: Mapping[str, Any] | None = None,
    attrs: Mapping[Any, Any] | None = None,
    executor: Executor | None = None,
    force: bool = False,
) -> CompileJob:
    """Compile a ``@triton.jit`` kernel in a worker and install the result in the caller's cache.

    The arguments are those of ``triton.compile(ASTSource(fn, signature, constexprs, attrs),
    target=target, options=options)``; afterwards that call, and a launch that specialises the
    same way, is a cache hit in this process.

    Args:
        kernel: a ``JITFunction`` (autotune/heuristics wrappers are unwrapped).
        signature: argument name to Triton type, e.g. ``{"x_ptr": "*fp32", "n": "i32",
            "BLOCK": "constexpr"}``.
        constexprs: argument name (or path) to value for the ``constexpr`` arguments.
        target: ``"cuda:90"``-style string or a ``GPUTarget``; no GPU is needed.
        options: backend options such as ``num_warps``, ``num_stages``.
        attrs: argument path to attributes, e.g. ``{(0,): [["tt.divisibility", 16]]}``.
        executor: where to compile; a shared :class:`~precompile_executor.PrecompileExecutor`
            by default.
        force: compile even when the caller's cache already has the result.

    Returns:
        A :class:`CompileJob`; ``job.result(timeout)`` is the ``CompiledKernel``.
    """
    fn = unwrap_jit_function(kernel)
    src = ASTSource(fn, dict(signature), dict(constexprs or {}), dict(attrs or {}))
    return submit_compile(
        executor if executor is not None else default_executor(),
        src,
        parse_target(target),
        dict(options or {}),
        get_cache_invalidating_env_vars(),
        force=force,
    )


def default_executor() -> Executor:
    """Return the process-wide :class:`~precompile_executor.PrecompileExecutor` used when no
    executor is given, creating it on first use (its idle workers exit on their own).

    Its workers are warm: :func:`~._prewarm.prewarm_worker` runs once in their template —
    ``import torch, triton``, one tiny compile for this process's GPU target (``"cuda:90"``
    while it has no CUDA context), a lower CPU priority — and every worker is forked from there.
    """
    with STATE.lock:
        if STATE.default is None:
            from precompile_executor import PrecompileExecutor

            from ._prewarm import WORKER_NICENESS, prewarm_worker
            from ._target import caller_target

            STATE.default = PrecompileExecutor(
                classify=classify,
                initializer=prewarm_worker,
                initargs=(caller_target(), WORKER_NICENESS),
            )
        return STATE.default


def start_default_warm_up() -> None:
    """Build the default executor and start its workers on a background thread, once.

    ``precompile_executor.triton.autotune.use()`` and ``install()`` call it as they open, so
    the workers' start (an interpreter, the imports, a first compile: seconds) runs off the
    first autotune's critical path; a tune that starts meanwhile compiles in this process the
    configs no worker is ready for. Does nothing in a compile worker
    (``_worker.in_compile_worker``).
    """
    if _worker.in_compile_worker:
        return  # a library opened use()/install() while a worker imported it: no pool here
    executor = default_executor()
    with STATE.lock:
        if STATE.warming is not None:
            return
        STATE.warming = threading.Thread(
            target=_warm_up,
            args=(executor,),
            name="precompile-executor-triton-warm-up",
            daemon=True,
        )
        STATE.warming.start()


def _warm_up(executor: Executor) -> None:
    from ._preimport import announce, loaded_kernel_modules

    log = logging.getLogger("precompile_executor.triton")
    warm_up = getattr(executor, "warm_up", None)
    if callable(warm_up):
        try:
            warm_up()
        except Exception:  # noqa: BLE001 - tasks start workers on demand anyway
            with STATE.lock:
                discarded = executor is not STATE.default
            if discarded:  # state.reset() stopped it: its warm-up ends in an error by design
                return
            log.warning(
                "starting the default executor's workers in the background failed (they start "
                "on demand)",
                exc_info=True,
            )
    try:
        # The kernels' modules already loaded (a use() block opened after the library's
        # import): each worker imports them before its next config. Scanned once the workers
        # are up, so the scan's Python does not compete with a first tune that compiles here
        # (a tune announces its own kernel's module itself).
        announce(executor, loaded_kernel_modules())
    except Exception:  # noqa: BLE001 - only a lost head start
        log.debug("announcing the loaded kernels' modules failed", exc_info=True)
