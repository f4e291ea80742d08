"""The parent side: Helion's ``PrecompileFuture.create`` and ``wait_for_all``, on an executor.

:func:`create` replaces ``PrecompileFuture.create``: it prepares one config's task and returns a
:class:`HelionFuture`, which has the attributes Helion's autotuner reads (``ok``,
``failure_reason``, ``process``, ``started``, ``elapsed``, ...). :func:`wait_for_all` replaces
``PrecompileFuture.wait_for_all``: it submits the batch to the executor in use (the scope rule:
``_warm.current_executor``), at most ``ctx.jobs`` at a time in order, and settles each future as
its task finishes.

Data flow (one batch)::

    Helion's benchmark provider                  this module                       executor
    create(ctx, config, fn, args, ...) ──► fork:  run host code with a raising launcher,
      (per config)                                 keep Helion's precompiler ─► ForkCompile
                                           spawn: serialize the generated module ─► GeneratedKernel
                                           cluster executor (fork mode): take the
                                             precompiler apart ─► ClusterCompile
                                           ◄── HelionFuture (not submitted yet)
    wait_for_all(futures) ───────────────► spawn: share_args(ctx.args) once for the batch
                                           submit ≤ ctx.jobs at a time ─────────► fork child /
                                             (timeout = autotune_compile_timeout    warm worker /
                                              read now, counted from the real start) a node's pool
                                           settle each as it finishes ◄──────────── TaskResult,
                                             ok / "error" / "timeout", elapsed,      the compiled
                                                                                     kernel, or
                                                                                     RemoteError
                                             Helion's classification: "raise" ─► exc.TritonError
    list[bool] (aligned with futures) ◄─── release the shared arguments
    Ctrl-C or "raise" anywhere: cancel what has not started, kill the running groups, re-raise.

Threads: everything here runs on the autotuner's thread; the executor's threads only complete the
standard futures this module waits on.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Literal

from .. import (
    PrecompileExecutor,
    RemoteError,
    TaskResult,
    TaskTimeoutError,
    WorkerCrashedError,
)
from .. import wait_for_all as _executor_wait_for_all
from .._cluster_executor import ClusterExecutor
from ..gpu import SharedArgs, run_once, share_args
from . import _adaptive, _cluster_task, _warm
from ._fork_task import ForkCompile
from ._lease import lease_dir
from ._spawn_task import generated_kernel
from ._state import STATE

log = logging.getLogger("precompile_executor.helion")

POLL_S = 0.05
"""How often the wait loop wakes to notice tasks that started (for ``elapsed`` of failures)."""

FailureReason = Literal["ok", "error", "timeout"]


@dataclasses.dataclass(frozen=True)
class TaskProcess:
    """Stands in for Helion's ``mp.Process``: which process ran the config's task.

    Attributes:
        pid: the forked child, the spawn worker, or the node's pool worker that compiled.
        path: ``"fork"``, ``"spawn"`` or ``"cluster"`` (fork mode on a cluster executor).
    """

    pid: int
    path: str


@dataclasses.dataclass(eq=False)
class HelionFuture:
    """One config's precompile, as Helion's autotuner sees it.

    Attributes read by Helion: ``ok`` (None until settled), ``failure_reason``, ``process`` (not
    None once a process ran the task), ``started``, ``elapsed`` (seconds from the task's real
    start on a process), ``config``. ``error`` holds the task's exception, if any.
    """

    ctx: Any
    config: Any
    path: Literal["fork", "spawn", "cluster"]
    task: Any  # ForkCompile, GeneratedKernel or ClusterCompile
    timeout: float
    decorator: str
    future: Future[Any] | None = None
    process: TaskProcess | None = None
    start_time: float | None = None
    end_time: float | None = None
    ok: bool | None = None
    failure_reason: FailureReason | None = None
    error: BaseException | None = None
    job: Any = None
    """Path ``"cluster"``: the ``CompileJob``; ``future`` is its future."""
    cut: _adaptive.Threshold | None = None
    """Set when the stream cut this config by Helion's adaptive timeout (``Stream``)."""
    fallback: ForkStandIn | None = None
    """Spawn mode, while the executor has started no spawn task: what the config's fork-mode
    compile is prepared from, should the stream run it instead of a spawn task no worker has
    taken (``Stream._steal_while_workers_start``)."""
    submitted_at: float | None = None
    """``time.monotonic()`` when the stream submitted the task."""
    stealing: bool = False
    """Set while the stream cancels the spawn task to run :attr:`fallback` (``Stream._done``
    then drops the cancelled future)."""

    @property
    def task_future(self) -> Future[Any] | None:
        """The executor's future of the task now: for a cluster compile, its last send
        (``CompileJob.task_future``: ``running()`` there, and what a kill reaches)."""
        if self.job is not None and self.job.task_future is not None:
            return self.job.task_future  # type: ignore[no-any-return]
        return self.future

    @property
    def started(self) -> bool:
        """Whether a process started this config's task."""
        return self.start_time is not None

    @property
    def elapsed(self) -> float:
        """Seconds from the task's real start to its end (or to now)."""
        if self.start_time is None:
            return 0.0
        return (self.end_time or time.time()) - self.start_time

    def seconds_left(self) -> float:
        """Seconds before the timeout, as Helion computes it."""
        if self.end_time is not None:
            return 0.0
        return self.timeout - self.elapsed

    def is_alive(self) -> bool:
        """Whether the task is running now."""
        task = self.task_future
        return task is not None and task.running()

    def cancel(self) -> None:
        """Stop the task (kill its process group if it runs); the config fails."""
        task = self.task_future
        if task is not None and not task.done():
            _kill([task])
        if self.ok is None:
            self.end_time = time.time()
            self.ok = False
            self.failure_reason = "error"

    def __call__(self) -> bool:
        """Run this one config and return whether it succeeded (Helion's single-future path)."""
        return wait_for_all([self])[0]


# -- create --------------------------------------------------------------------------------------


def create(
    ctx: Any,
    config: Any,
    fn: Any,
    args: Sequence[object],
    result_path: str,
    args_path: str | None,
) -> Any:
    """``PrecompileFuture.create`` on the executor in use (same signature, same errors).

    ``result_path`` and ``args_path`` are not used: results come back through the executor, and
    spawn mode shares ``ctx.args`` itself, once per batch.
    """
    from helion import exc
    from helion.autotuner.logger import classify_triton_exception, match_unrecoverable_runtime_error
    from helion.autotuner.precompile_future import (
        PrecompileFuture,
        _prepare_precompiler_for_fork,
        _serialize_compiled_fn,
    )

    mode = ctx.settings.autotune_precompile
    decorator = ctx.kernel.format_kernel_decorator(config, ctx.settings)
    timeout = float(ctx.settings.autotune_compile_timeout)
    on_cluster = isinstance(_warm.current_executor(), ClusterExecutor)
    if mode == "spawn" and on_cluster:
        raise exc.AutotuneError(
            "autotune_precompile='spawn' runs each config once on a GPU, and a cluster "
            "executor's nodes are not this GPU: set autotune_precompile='fork' (or "
            'HELION_AUTOTUNE_PRECOMPILE="fork"), whose compiles run on the nodes for this '
            'process\'s GPU, or use a local PrecompileExecutor (docs/helion.md, "On a cluster").'
        )
    if mode == "spawn":
        try:
            spec = _serialize_compiled_fn(fn)
        except RuntimeError as err:
            raise exc.AutotuneError(
                "Failed to serialize compiled kernel for spawn precompile."
                ' Set HELION_AUTOTUNE_PRECOMPILE="fork" to fall back to fork mode.'
            ) from err
        task = generated_kernel(spec, lease_dir())
        spawned = HelionFuture(ctx, config, "spawn", task, timeout, decorator)
        if _may_steal(_warm.current_executor()):
            spawned.fallback = ForkStandIn(fn, tuple(args))
        return spawned
    # Fork mode, exactly as Helion prepares it: the launch arguments are captured here.
    try:
        precompiler = _prepare_precompiler_for_fork(
            fn, args, config, ctx.kernel, decorator, ctx.log
        )
    except Exception as e:
        e.__traceback__ = None
        if match_unrecoverable_runtime_error(e):
            raise
        if classify_triton_exception(e) == "raise" and not ctx.settings.autotune_ignore_errors:
            raise
        return PrecompileFuture.skip(ctx, config, False)
    if precompiler is None:  # already in Triton's in-memory cache
        return PrecompileFuture.skip(ctx, config, True)
    if on_cluster:  # a node cannot fork this process: the compile travels as a Triton task
        compile_task = _cluster_task.cluster_compile(precompiler, decorator)
        return HelionFuture(ctx, config, "cluster", compile_task, timeout, decorator)
    # The child inherits this process's Triton as it is: fork it warm (_warm.start_caller_warm_up).
    _warm.wait_caller_warm_up()
    return HelionFuture(
        ctx, config, "fork", ForkCompile(precompiler, decorator), timeout, decorator
    )


STEALS_WHILE_WORKERS_START = True
"""Spawn mode: while the executor has started no spawn task (its workers still start), the
autotuner's thread compiles queued configs on the fork path instead (docs/helion.md, "Cold start:
nothing waits for workers"). ``False``: every config waits for a spawn worker."""

STEAL_AFTER_S = 0.5
"""A spawn task is run on the fork path instead only once it has waited this long for a worker:
warm workers take a task within milliseconds, so a warm executor never loses one."""


@dataclasses.dataclass(frozen=True)
class ForkStandIn:
    """What a spawn-mode config's fork-mode compile is prepared from, if it comes to that:
    Helion's compiled function and the batch's arguments."""

    fn: Any
    args: tuple[object, ...]


def _may_steal(executor: Any) -> bool:
    """Whether spawn tasks on ``executor`` may still run on the fork path instead: a local
    executor that has started no spawn task yet."""
    return (
        STEALS_WHILE_WORKERS_START
        and isinstance(executor, PrecompileExecutor)
        and not executor.statistics().spawn_tasks
    )


def _fork_compile(hf: HelionFuture) -> ForkCompile | None:
    """``hf``'s fork-mode compile, prepared as Helion's fork mode prepares it (the host code run
    with a launcher that only captures its arguments), or ``None`` if that fails or the kernel is
    in Triton's memory cache already: the config then waits for a spawn worker."""
    from helion.autotuner.precompile_future import _prepare_precompiler_for_fork

    assert hf.fallback is not None
    ctx = hf.ctx
    try:
        precompiler = _prepare_precompiler_for_fork(
            hf.fallback.fn, hf.fallback.args, hf.config, ctx.kernel, hf.decorator, ctx.log
        )
    except Exception as error:  # noqa: BLE001 - the spawn task reports it, as without this
        log.debug("no fork-path stand-in for %s: %s", hf.config, error)
        return None
    if precompiler is None:
        return None
    _warm.wait_caller_warm_up()
    return ForkCompile(precompiler, hf.decorator)


# -- wait_for_all --------------------------------------------------------------------------------


def wait_for_all(futures: list[Any], desc: str | None = None) -> list[bool]:
    """``PrecompileFuture.wait_for_all`` on the executor in use; one bool per future, in order.

    Raises:
        helion.exc.TritonError: a config failed with an error Helion classifies as "raise"
            (unless ``autotune_ignore_errors``); every other task was cancelled or killed.
        BaseException: Ctrl-C (or any error) while waiting, after cancelling and killing.
    """
    from helion.autotuner.progress_bar import iter_with_progress

    ours = [f for f in futures if isinstance(f, HelionFuture) and f.ok is None]
    native = [f for f in futures if not isinstance(f, HelionFuture) and f.ok is None]
    if native:  # not created by us (e.g. installed mid-batch): Helion's own wait handles them
        STATE.helion_wait_for_all()(native, None)
    progress = iter_with_progress(
        range(len(futures)), total=len(futures), description=desc, enabled=desc is not None
    )
    next(progress, None)
    for _ in range(len(futures) - len(ours)):
        next(progress, None)
    if ours:
        with _shared_args(ours) as shared:
            _run(_warm.current_executor(), ours, shared, progress)
    result = []
    for f in futures:
        assert f.ok is not None
        if f.failure_reason is None:
            f.failure_reason = "ok" if f.ok else "error"
        result.append(bool(f.ok))
    return result


@contextlib.contextmanager
def _shared_args(futures: list[HelionFuture]) -> Iterator[dict[int, Any]]:
    """Kernel arguments for spawn tasks, by ``id(ctx.args)``: saved once for this batch."""
    with contextlib.ExitStack() as stack:
        shared: dict[int, Any] = {}
        for f in futures:
            if f.path == "spawn" and id(f.ctx.args) not in shared:
                shared.update(stack.enter_context(shared_args(f.ctx.args)))
        yield shared


@contextlib.contextmanager
def shared_args(args: Sequence[object]) -> Iterator[dict[int, Any]]:
    """``{id(args): handle}`` for spawn tasks of one batch; released on exit.

    weights_only loading takes tensors and plain data; anything else (a callable epilogue, say)
    travels with each task instead, cloudpickled.
    """
    values = tuple(args)
    handle: Any = share_args(values) if _plain(values) else values
    try:
        yield {id(args): handle}
    finally:
        if isinstance(handle, SharedArgs):
            handle.release()


def _plain(value: Any) -> bool:
    import torch

    if isinstance(
        value, (torch.Tensor, int, float, bool, str, bytes, type(None), torch.dtype, torch.device)
    ):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _run(
    executor: PrecompileExecutor | ClusterExecutor[Any],
    futures: list[HelionFuture],
    shared: dict[int, Any],
    progress: Iterator[int],
) -> None:
    stream = Stream(executor, shared)
    with stream:
        for hf in futures:
            stream.add(hf)
        stream.close_input()
        for _ in stream.settled():
            next(progress, None)


class Stream:
    """Runs one batch of configs' tasks on an executor and hands them back as they finish.

    :meth:`add` queues a config's task (submitted at once while fewer than ``ctx.jobs`` run; the
    rest are submitted from the completion callbacks, so the window stays full while the caller
    is busy elsewhere, e.g. benchmarking). :meth:`settled` yields each future in completion order,
    settled and reported as Helion would (a "raise" verdict raises ``helion.exc.TritonError``).
    Leaving the ``with`` block — normally, on that error or on Ctrl-C — cancels what has not
    started and kills the process groups of what runs.

    Threads: :meth:`add`, :meth:`settled` and the ``with`` block run on the autotuner's thread;
    ``_done`` runs on the executor's thread that completes a future (or on the caller's, if the
    future was already done), under ``_lock``, and submits only spawn tasks (fork-path tasks
    fork the caller: they are submitted on the autotuner's thread only).
    """

    def __init__(
        self,
        executor: PrecompileExecutor | ClusterExecutor[Any],
        shared: dict[int, Any],
        *,
        search: Any = None,
    ) -> None:
        self._executor = executor
        self._shared = shared
        self._search = search
        self._rule: _adaptive.AdaptiveRule | None = None
        self._rule_read = False
        self._compile_times: list[float] = []
        self._steals_over = not STEALS_WHILE_WORKERS_START
        self.stolen = 0
        """Spawn-mode configs compiled on the fork path while the workers started."""
        self._lock = threading.RLock()
        self._waiting: collections.deque[HelionFuture] = collections.deque()
        self._running: dict[Future[Any], HelionFuture] = {}
        self._finished: queue.SimpleQueue[HelionFuture] = queue.SimpleQueue()
        self._views: dict[tuple[str, float], Any] = {}
        self._all: list[HelionFuture] = []
        self._handed = 0
        self._input_closed = False
        self._closed = False
        self.waited_s = 0.0
        """Seconds :meth:`settled` spent waiting for the next task to finish (statistics)."""

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, hf: HelionFuture) -> None:
        """Queue ``hf``'s task; it starts as soon as fewer than ``ctx.jobs`` tasks run."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the precompile stream is closed")
            if not self._rule_read:  # the batch's settings, as Helion reads them per batch
                self._rule_read = True
                self._rule = _adaptive.rule_for(hf.ctx.settings, self._search)
            self._all.append(hf)
            self._waiting.append(hf)
            self._submit_more()

    def close_input(self) -> None:
        """No more :meth:`add` calls: :meth:`settled` ends after the last one finishes."""
        with self._lock:
            self._input_closed = True
        # The adaptive timeout counts a task's time from the first poll that saw it running;
        # fork-path tasks run from their submit, and the autotuner may be busy (Helion's
        # baseline) before it next polls.
        self._note_starts()

    def pending(self) -> int:
        """Configs added and not handed back by :meth:`settled` yet."""
        with self._lock:
            return len(self._all) - self._handed

    def settled(self) -> Iterator[HelionFuture]:
        """Yield each added future as its task finishes, settled (``ok``, ``failure_reason``,
        ``elapsed``...) and reported; stops when input is closed and all were handed back.

        Raises:
            helion.exc.TritonError: a config failed with an error Helion classifies as "raise".
        """
        while True:
            with self._lock:
                self._submit_more()
                if self._input_closed and self._handed == len(self._all):
                    return
            self._steal_while_workers_start()
            self._cut_overdue()
            t0 = time.perf_counter()
            try:
                hf = self._finished.get(timeout=POLL_S)
            except queue.Empty:
                self._note_starts()
                continue
            finally:
                self.waited_s += time.perf_counter() - t0
            with self._lock:
                self._handed += 1
            _settle(hf)
            if hf.failure_reason in ("ok", "error") and hf.process is not None:
                self._compile_times.append(hf.elapsed)  # what Helion's rule counts
            _report(hf)  # raises helion.exc.TritonError on "raise"
            yield hf

    def close(self) -> None:
        """Cancel what has not started, kill what runs; unsettled futures fail ("error")."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            running = [hf.task_future or future for future, hf in self._running.items()]
        _kill(running)
        now = time.time()
        for hf in self._all:
            if hf.ok is None:
                hf.end_time = hf.end_time or now
                hf.ok = False
                hf.failure_reason = "error"

    def _steal_while_workers_start(self) -> None:
        """Spawn mode on a cold executor: until it has started a spawn task, each queued spawn
        task that no worker has taken (its future still cancellable: the executor keeps a task
        PENDING until a worker really starts it) is cancelled and its config compiled on the
        fork path instead (:attr:`HelionFuture.fallback`, compile only, as Helion's fork mode) —
        the autotune does not wait for the workers' start-up; once a worker has answered, the
        rest go to the workers. Autotuner's thread only (the fork path forks the caller)."""
        if self._steals_over:
            return
        waited = time.monotonic() - STEAL_AFTER_S
        with self._lock:
            queued = [
                (future, hf)
                for future, hf in self._running.items()
                if hf.path == "spawn"
                and hf.fallback is not None
                and hf.submitted_at is not None
                and hf.submitted_at <= waited
                and not future.running()
            ]
        if not queued:
            return
        if not _may_steal(self._executor):
            self._steals_over = True
            return
        for future, hf in queued:
            compile_task = _fork_compile(hf)
            if compile_task is None:
                hf.fallback = None
                continue
            with self._lock:
                if self._closed:
                    return
                hf.stealing = True
                try:
                    taken = future.cancel()  # runs _done here when it succeeds
                finally:
                    hf.stealing = False
                if not taken:
                    continue  # a worker started it: it stays a spawn task
                hf.path, hf.task, hf.fallback = "fork", compile_task, None
                try:
                    new = self._submit(hf)
                except BaseException as error:  # the executor is shut down, say
                    new = Future()
                    new.set_exception(error)
                hf.future = new
                self._running[new] = hf
                self.stolen += 1
                if self.stolen == 1:
                    log.info(
                        "compiling Helion configs on the fork path (compile only) while the "
                        "executor's spawn workers start (docs/helion.md, \"Cold start: nothing "
                        'waits for workers")'
                    )
            new.add_done_callback(self._done)

    def _cut_overdue(self) -> None:
        """Helion's adaptive timeout, from this batch's compile times (``_adaptive``): cut every
        config compiling past the threshold — its process group killed, the config failed as a
        timeout — and log each cut once. Runs on the autotuner's thread, each time
        :meth:`settled` looks for the next finished config (every ``POLL_S`` while it waits), so
        a cut comes at most one measurement late; ``elapsed`` is counted from the first poll that
        saw the task running, so a cut is never early."""
        if self._rule is None:
            return
        with self._lock:
            if not self._input_closed or self._closed:
                return  # the batch's size is not known yet
            batch = len(self._all)
        self._note_starts()
        with self._lock:
            running = [hf for hf in self._running.values() if hf.cut is None and hf.started]
        if not running:
            return
        timeout = min(hf.timeout for hf in running)
        cut = _adaptive.threshold(self._compile_times, batch, self._rule, timeout)
        if cut is None:
            return
        elapsed = {id(hf): hf.elapsed for hf in running}
        late = set(_adaptive.overdue(elapsed, cut))
        victims = [hf for hf in running if id(hf) in late]
        for hf in victims:
            hf.cut = cut
            log.info(
                "Helion's adaptive compile timeout: cut %s after %.1fs compiling (threshold %s)",
                hf.config,
                elapsed[id(hf)],
                cut.describe(),
            )
        _kill([f for f in (hf.task_future for hf in victims) if f is not None])

    def _note_starts(self) -> None:
        now = time.time()
        with self._lock:
            running = list(self._running.values())
        for hf in running:
            task = hf.task_future
            if hf.start_time is None and task is not None and task.running():
                hf.start_time = now  # refined from the worker's own clock on success/timeout

    def _submit_more(self) -> None:
        while self._waiting and not self._closed:
            hf = self._waiting[0]
            if len(self._running) >= max(1, int(hf.ctx.jobs or 1)):
                return
            self._waiting.popleft()
            try:
                future = self._submit(hf)
            except BaseException as error:  # the executor is shut down, say: the config fails
                hf.future = Future()
                hf.future.set_exception(error)
                hf.end_time = time.time()
                self._finished.put(hf)
                continue
            hf.future = future
            hf.submitted_at = time.monotonic()
            self._running[future] = hf
            future.add_done_callback(self._done)

    def _submit(self, hf: HelionFuture) -> Future[Any]:
        view = self._views.get((hf.path, hf.timeout))
        if view is None:
            if hf.path == "cluster":  # a node's pool runs it; the result is the compiled kernel
                view = self._executor.options(timeout=hf.timeout)
            else:
                view = self._executor.options(timeout=hf.timeout, path=hf.path, with_output=True)
            self._views[(hf.path, hf.timeout)] = view
        if hf.path == "cluster":
            hf.job = _cluster_task.submit(view, hf.task)
            return hf.job.future  # type: ignore[no-any-return]
        if hf.path == "spawn":
            task: Any = run_once(hf.task, self._shared[id(hf.ctx.args)], label=hf.decorator)
        else:
            task = hf.task
        return view.submit(task)

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            hf = self._running.pop(future, None)
            if hf is None or hf.stealing:  # a stolen spawn task: its config runs on
                return  # the fork path now (_steal_while_workers_start)
            hf.end_time = time.time()
            self._finished.put(hf)
            # Spawn and cluster tasks are sends: refill the window from here, while the
            # autotuner is busy benchmarking. The fork path forks the caller; it forks only on
            # the autotuner's thread, as Helion's own fork mode does (add() and settled()
            # refill it).
            if self._waiting and self._waiting[0].path != "fork":
                self._submit_more()


def _kill(futures: list[Future[Any]]) -> None:
    """Cancel what has not started and kill the process groups of what runs, then return."""
    # wait_for_all's documented behaviour on expiry: the rest are cancelled and killed.
    with contextlib.suppress(TimeoutError):
        _executor_wait_for_all(futures, timeout=0, ignore_errors=True, progress=False)


def _settle(hf: HelionFuture) -> None:
    """Record the outcome of ``hf``'s finished task (no logging, no raising)."""
    assert hf.future is not None
    if hf.end_time is None:
        hf.end_time = time.time()
    if hf.future.cancelled():
        hf.ok, hf.failure_reason = False, "error"
        return
    error = hf.future.exception()
    if error is None and hf.path == "cluster":
        artifacts = hf.job.artifacts
        if artifacts is None:  # the caller's cache had it: nothing ran, nothing to wait for
            hf.start_time = hf.end_time
        else:
            hf.start_time = hf.end_time - artifacts.compile_time_s
            hf.process = TaskProcess(artifacts.worker_pid, hf.path)
        hf.ok, hf.failure_reason = True, "ok"
        return
    if error is None:
        result: TaskResult = hf.future.result()
        hf.start_time = hf.end_time - result.elapsed_s
        hf.process = TaskProcess(result.worker_pid, hf.path)
        hf.ok, hf.failure_reason = True, "ok"
        return
    hf.error = error
    hf.ok = False
    if isinstance(error, RemoteError) and error.worker_pid:
        hf.process = TaskProcess(error.worker_pid, hf.path)
        if hf.start_time is None:
            hf.start_time = hf.end_time  # finished between two polls: under POLL_S
    if isinstance(error, TaskTimeoutError):
        hf.start_time = hf.end_time - error.elapsed_s
        hf.failure_reason = "timeout"
    elif hf.cut is not None and isinstance(error, WorkerCrashedError):
        # Killed by the adaptive timeout (Stream._cut_overdue): a timeout, as Helion's own is.
        pid = hf.process.pid if hf.process is not None else 0
        hf.error = TaskTimeoutError(hf.cut.seconds, hf.elapsed, pid)
        hf.error.__cause__ = error
        hf.failure_reason = "timeout"
    else:
        hf.failure_reason = "error"


def _report(hf: HelionFuture) -> None:
    """Log ``hf``'s failure as Helion does; raise ``helion.exc.TritonError`` on "raise"."""
    from helion import exc
    from helion.autotuner.logger import (
        SUPPRESSED_TRITON_CODE_MSG,
        classify_triton_exception,
        format_triton_compile_failure,
        log_generated_triton_code_debug,
        maybe_dump_triton_failure,
    )

    error, ctx = hf.error, hf.ctx
    if error is None:
        return
    ignore = bool(ctx.settings.autotune_ignore_errors)
    if hf.failure_reason == "timeout":
        if not ignore:
            ctx.log.warning(f"Timeout after {hf.elapsed:.0f}s compiling {hf.config}")
        return
    remote_tb = getattr(error, "remote_traceback", None) or None
    output = getattr(error, "captured_output", None) or None
    maybe_dump_triton_failure(
        ctx.kernel, hf.config, error, remote_traceback=remote_tb, captured_output=output
    )
    # Helion's spawn mode: a dead child leaves no result file, which it logs at debug level.
    crashed = isinstance(error, WorkerCrashedError)
    verdict = "debug" if crashed else classify_triton_exception(error)
    if ignore:
        verdict = "debug"
    prefix = f"Generated Triton code for {hf.decorator}:"
    log_generated_triton_code_debug(ctx.log, ctx.kernel, hf.config, prefix=prefix)
    if verdict == "raise":
        ctx.kernel.maybe_log_repro(ctx.log.error, ctx.args, hf.config)
        name = getattr(error, "exc_type", "") or type(error).__qualname__
        raise exc.TritonError(
            error=f"{name}: {error}", decorator=hf.decorator, code=SUPPRESSED_TRITON_CODE_MSG
        ) from error
    formatted = format_triton_compile_failure(hf.config, error, ctx.kernel)
    if remote_tb:
        formatted = f"{formatted}\nRemote traceback ({hf.path} process {hf.process}):\n{remote_tb}"
    if not ignore:
        ctx.log.debug(formatted)
        ctx.kernel.maybe_log_repro(ctx.log.debug, ctx.args, hf.config)
