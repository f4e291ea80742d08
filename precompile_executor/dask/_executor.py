"""``DaskPrecompileExecutor``: the caller side; tasks run on node-local pools of a dask cluster.

Data flow::

    submit(fn, *args)                               caller's thread
      │ cloudpickle (fn, args, kwargs) → blob; a failure fails this future only
      ▼
    priority heap ── futures PENDING, cancel() works
      │ dispatcher thread: while a node has a free slot (window = its dask threads, capped by
      │ max_workers_per_node): Client.submit(run_task, …bytes…, key, workers=[node],
      │ allow_other_workers=False, pure=False, retries=0) — still PENDING, still cancellable
      ▼
    node: run_task ─► NodePlugin.run ─► node-local PrecompileExecutor (timeouts, group kills,
      │ crash isolation, capture, classification) ─── "started" event on this executor's topic
      │                                               ─► IO loop thread: future → RUNNING
      ▼
    plain outcome (bytes, str, numbers) ─► dask callback thread: result unpickled here, or the
      RemoteError proxy rebuilt from its record ─► future; the node's slot is free again

Who owns what: the caller's lock guards the heap, ``in_flight`` (key → task), the nodes and the
counters. A task in flight is resolved by whoever pops it from ``in_flight``: the dask callback
thread (an outcome), the dispatcher (its node left: :class:`NodeLostError`) or the thread that
cancelled its future (then the dispatcher kills it on its node). Only the dispatcher thread
talks to dask in blocking calls (``submit``, ``cancel``, ``run``, ``nthreads``); the client's IO
loop thread only marks futures running; the dask callback thread only fetches outcomes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import itertools
import logging
import pickle
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, InvalidStateError
from concurrent.futures import wait as futures_wait
from typing import Any, Literal, TypeVar

import cloudpickle

from precompile_executor import (
    Classification,
    RemoteError,
    ResultSerializationError,
    SerializationError,
    TaskResult,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
)

from .._executor import results_in_order, submit_ahead
from .._validate import (
    check_buffersize,
    check_chunksize,
    check_cost,
    check_flag,
    check_priority,
    check_timeout,
    describe_unpicklable,
)
from . import _node
from ._plan import departed, free_slots, pick_node
from ._plugin import NodeCleanupPlugin, NodePlugin

log = logging.getLogger("precompile_executor.dask")

T = TypeVar("T")

NODE_POLL_S = 0.2
"""How often the dispatcher asks the scheduler which nodes exist: a lost node's tasks fail, and
a new node gets tasks, at most this much later than the scheduler knows."""

FETCH_POLL_S = 0.5
"""The callback thread fetches an outcome in steps this long, giving up once the task is
resolved otherwise (its node died after finishing, before the outcome could be fetched)."""

_AFTER_SHUTDOWN = "cannot schedule new futures after shutdown"


class NodeLostError(WorkerCrashedError):
    """The dask worker (node) that held the task left the cluster: its process died or was
    removed. The task may be the cause, so it is not run again; other tasks go on elsewhere.

    Attributes:
        node: the dask worker's address.
    """

    def __init__(self, node: str, detail: str = "") -> None:
        msg = (
            f"dask worker {node} left the cluster while it held the task; the task is not re-run "
            "(it may be the cause). The other tasks go on on the remaining nodes; check that "
            "node's log (an OOM kill, a crashed dask worker)"
        )
        RemoteError.__init__(self, f"{msg}; {detail}" if detail else msg)
        self.node = node
        self.exitcode = None
        self.signal_name = None
        self.exc_type = type(self).__name__
        self.exc_module = type(self).__module__
        self._detail = detail

    def __reduce__(self) -> Any:
        return (type(self), (self.node, self._detail))


@dataclasses.dataclass(frozen=True)
class DaskExecutorStatistics:
    """An immutable snapshot of a :class:`DaskPrecompileExecutor`, from ``statistics()``.

    Attributes:
        queued: tasks in the caller's queue (PENDING).
        dispatched: tasks sent to a node that has not started them yet (PENDING).
        running: tasks running on a node's pool.
        completed: tasks that returned a value.
        failed: tasks that raised, timed out, crashed or lost their node.
        cancelled: tasks cancelled before they started.
        timed_out: failed tasks that ran past their timeout.
        crashed: failed tasks whose pool worker died, or whose node was lost.
        nodes: dask workers taking tasks now.
        slots: tasks all nodes may hold at once (the sum of their windows).
        nodes_lost: nodes that left while this executor ran.
    """

    queued: int
    dispatched: int
    running: int
    completed: int
    failed: int
    cancelled: int
    timed_out: int
    crashed: int
    nodes: int
    slots: int
    nodes_lost: int


@dataclasses.dataclass(frozen=True)
class _Options:
    timeout: float | None
    priority: float
    with_output: bool
    cost: float | None = None  # a hint: longer starts first among equal priorities


@dataclasses.dataclass(eq=False)
class _Task:
    id: int
    key: str
    future: Future[Any]
    blob: bytes
    opts: _Options
    state: Literal["queued", "dispatched", "running"] = "queued"
    node: str = ""
    token: str = ""
    dask_future: Any = None

    def sort_key(self) -> tuple[float, float, int]:
        """Higher priority first, then the longest cost hint, then the oldest."""
        return (-self.opts.priority, -(self.opts.cost or 0.0), self.id)


@dataclasses.dataclass(eq=False)
class _Node:
    address: str
    token: str
    window: int
    keys: set[str] = dataclasses.field(default_factory=set)


_ids = itertools.count(1)


class _State:
    """Everything the executor and its ``options()`` views share; see the module docstring."""

    def __init__(self, client: Any, plugin_name: str, workers: frozenset[str] | None) -> None:
        self.client = client
        self.plugin_name = plugin_name
        self.topic = f"{plugin_name}-started"
        self.only = workers
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.poked = False
        self.queue: list[tuple[tuple[float, float, int], _Task]] = []
        self.in_flight: dict[str, _Task] = {}
        self.nodes: dict[str, _Node] = {}
        self.kills: list[_Task] = []
        self.held = 0
        self.closing = False
        self.broken: BaseException | None = None  # a node's pool could not start: like the stdlib
        self.completed = self.failed = self.cancelled = 0
        self.timed_out = self.crashed = self.nodes_lost = 0
        self.thread = threading.Thread(
            target=self.run, name="precompile-dask-dispatch", daemon=True
        )

    def poke(self) -> None:
        """Wake the dispatcher (lock held)."""
        self.poked = True
        self.wake.notify()

    # -- the dispatcher thread -------------------------------------------------------------------

    def run(self) -> None:
        next_refresh = 0.0
        while True:
            with self.wake:
                if not self.poked:
                    self.wake.wait(max(0.0, next_refresh - time.monotonic()))
                self.poked = False
                kills, self.kills = self.kills, []
            for task in kills:
                self.kill_on_node(task, cancel_dask=True)
            if time.monotonic() >= next_refresh:
                self.refresh()
                next_refresh = time.monotonic() + NODE_POLL_S
            with self.lock:
                sends = self.plan()
                done = (
                    self.closing
                    and not self.in_flight
                    and not self.kills
                    and not any(not t.future.cancelled() for _, t in self.queue)
                )
            for task in sends:
                self.send(task)
            if done and not sends:
                break
        self.close()

    def plan(self) -> list[_Task]:
        """Move queued tasks to nodes with free slots, best priority first (lock held)."""
        if self.held:
            return []
        free = free_slots(
            {a: n.window for a, n in self.nodes.items()},
            {a: len(n.keys) for a, n in self.nodes.items()},
        )
        sends: list[_Task] = []
        while self.queue:
            address = pick_node(free)
            if address is None:
                break
            _, task = heapq.heappop(self.queue)
            if task.future.cancelled():
                continue
            node = self.nodes[address]
            task.state, task.node, task.token = "dispatched", address, node.token
            node.keys.add(task.key)
            self.in_flight[task.key] = task
            free[address] -= 1
            sends.append(task)
        return sends

    def send(self, task: _Task) -> None:
        try:
            fut = self.client.submit(
                _node.run_task,
                self.plugin_name,
                task.token,
                task.key,
                task.blob,
                task.opts.timeout,
                task.opts.with_output,
                self.topic,
                key=task.key,
                workers=[task.node],
                allow_other_workers=False,
                pure=False,
                retries=0,
            )
        except Exception as exc:  # noqa: BLE001 - a closed client, say: fail this task only
            if self.take(task):
                self.finish(task, exc=RuntimeError(f"dask refused the task: {exc!r}"))
            return
        with self.lock:
            task.dask_future = fut
        fut.add_done_callback(lambda f: self.on_dask_done(task, f))

    def kill_on_node(self, task: _Task, *, cancel_dask: bool) -> None:
        """Stop ``task`` on its node: dask forgets it, the node cancels or kills it."""
        fut, task.dask_future = task.dask_future, None
        if cancel_dask and fut is not None:
            with contextlib.suppress(Exception):
                fut.cancel()
        try:
            self.client.run(
                _node.kill, self.plugin_name, task.key, workers=[task.node], on_error="ignore"
            )
        except Exception:  # noqa: BLE001 - the node is gone: nothing left to kill
            pass

    def refresh(self) -> None:
        """Learn which nodes exist; fail the tasks of nodes that left (dispatcher thread)."""
        try:
            present: dict[str, int] = self.client.nthreads()
        except Exception:  # noqa: BLE001 - a closing client: the dask futures say the rest
            return
        if self.only is not None:
            present = {a: n for a, n in present.items() if a in self.only}
        new = [a for a in present if a not in self.nodes]
        found: dict[str, Any] = {}
        if new:
            try:
                found = self.client.run(
                    _node.describe, self.plugin_name, workers=new, on_error="return"
                )
            except Exception:  # noqa: BLE001 - asked again at the next refresh
                found = {}
        lost: list[tuple[str, _Task]] = []
        with self.lock:
            for address, info in found.items():
                if isinstance(info, dict) and address in present:
                    self.nodes[address] = _Node(address, info["token"], int(info["window"]))
            for address in departed(self.nodes, present):
                node = self.nodes.pop(address)
                self.nodes_lost += 1
                for key in node.keys:
                    task = self.in_flight.pop(key, None)
                    if task is not None:
                        lost.append((address, task))
            if found or lost:
                self.poked = True
        for address, task in lost:
            log.warning("dask worker %s left; its task %s fails", address, task.key)
            with contextlib.suppress(Exception):
                if task.dask_future is not None:
                    task.dask_future.cancel()
            self.finish(task, exc=NodeLostError(address))

    def close(self) -> None:
        """Undo the constructor's registrations (a closed client has nothing left to undo)."""
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(self.topic)
        with contextlib.suppress(Exception):
            self.client.unregister_worker_plugin(self.plugin_name)

    # -- other threads ---------------------------------------------------------------------------

    def take(self, task: _Task) -> bool:
        """Claim ``task`` out of ``in_flight``: True for the one caller that resolves it."""
        with self.lock:
            if self.in_flight.get(task.key) is not task:
                return False
            del self.in_flight[task.key]
            node = self.nodes.get(task.node)
            if node is not None:
                node.keys.discard(task.key)
            self.poke()
            return True

    def on_started(self, event: tuple[float, dict[str, Any]]) -> None:
        """A node's pool started a task (the client's IO loop thread)."""
        key = event[1].get("key")
        with self.lock:
            task = self.in_flight.get(str(key))
            if task is None or task.state != "dispatched":
                return
            if task.future.cancelled():
                return  # cancelled meanwhile: its callback (waiting for this lock) kills it
            task.state = "running"
            task.future.set_running_or_notify_cancel()

    def on_future_done(
        self, task: _Task, future: Future[Any], view: DaskPrecompileExecutor | None = None
    ) -> None:
        """The caller's future finished; if it was cancelled, stop the task (any thread)."""
        if view is not None:  # may run with self.lock held (a result set under it): not it
            with view._tasks_lock:
                view._tasks.discard(task)
        if not future.cancelled():
            return
        with self.lock:
            # Only here (on_started skips a cancelled future), at once: wait() and
            # as_completed() see it without waiting for a node slot.
            future.set_running_or_notify_cancel()
            self.cancelled += 1
            if self.in_flight.get(task.key) is task:
                del self.in_flight[task.key]
                node = self.nodes.get(task.node)
                if node is not None:
                    node.keys.discard(task.key)
                self.kills.append(task)
                self.poke()

    def on_dask_done(self, task: _Task, fut: Any) -> None:
        """The dask task finished (dask's callback thread): fetch the outcome, resolve."""
        outcome: dict[str, Any] | None = None
        error: BaseException | None = None
        try:
            if fut.status == "finished":
                while outcome is None:
                    try:
                        outcome = fut.result(timeout=FETCH_POLL_S)
                    except TimeoutError:
                        with self.lock:
                            if self.in_flight.get(task.key) is not task:
                                return
            elif fut.status == "cancelled":
                error = NodeLostError(task.node, "dask cancelled the task (was the client closed?)")
            else:
                exc = fut.exception()
                if type(exc).__name__ == "KilledWorker":
                    error = NodeLostError(task.node, str(exc))
                else:
                    error = RuntimeError(f"dask failed the task: {exc!r}")
        except Exception as exc:  # noqa: BLE001
            error = RuntimeError(f"could not fetch the task's outcome from dask: {exc!r}")
        if not self.take(task):
            return
        task.dask_future = None
        if error is not None:
            self.finish(task, exc=error)
        else:
            assert outcome is not None
            self.finish_outcome(task, outcome)

    # -- resolving a task (no lock held; the caller owns the task) -------------------------------

    def finish_outcome(self, task: _Task, outcome: dict[str, Any]) -> None:
        status = outcome.get("status")
        if status == "ok":
            try:
                value = cloudpickle.loads(outcome["value"])
            except Exception as exc:  # noqa: BLE001
                err = ResultSerializationError(
                    "the task's result could not be unpickled in the parent: "
                    f"{type(exc).__name__}: {exc}. Return plain data, or make its class "
                    "importable in the caller."
                )
                err.worker_pid = int(outcome.get("pid", 0))
                self.finish(task, exc=err)
                return
            if task.opts.with_output:
                value = TaskResult(
                    value, outcome["output"], outcome["pid"], float(outcome["elapsed_s"])
                )
            self.finish(task, value=value)
        elif status == "error":
            try:
                error = pickle.loads(outcome["error"])
            except Exception as exc:  # noqa: BLE001 - should not happen: records are plain
                error = RuntimeError(f"the task failed and its error could not be loaded: {exc}")
            if isinstance(error, RemoteError):
                error.classification = outcome.get("classification", "raise")
            self.finish(task, exc=error)
        elif outcome.get("reason") == "cancelled":
            task.future.cancel()  # killed on the node before it started (interrupt())
        elif outcome.get("reason") == "node-changed":
            self.finish(task, exc=NodeLostError(task.node, outcome.get("message", "")))
        else:
            self.finish(task, exc=WorkerStartError(outcome.get("message", "node unavailable")))

    def finish(self, task: _Task, *, exc: BaseException | None = None, value: Any = None) -> None:
        """The one place that resolves a task's future."""
        with self.lock:
            if exc is None:
                self.completed += 1
            else:
                self.failed += 1
                if isinstance(exc, WorkerStartError) and self.broken is None:
                    self.broken = exc
                if isinstance(exc, TaskTimeoutError):
                    self.timed_out += 1
                elif isinstance(exc, WorkerCrashedError):
                    self.crashed += 1
            self.wake.notify_all()
        future = task.future
        try:
            if future.cancelled():
                return
            if not future.running() and not future.set_running_or_notify_cancel():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(value)
        except (InvalidStateError, RuntimeError):
            pass  # cancelled in between: the cancel stands


class DaskPrecompileExecutor(Executor):
    """Runs callables on node-local ``PrecompileExecutor`` pools of a dask cluster.

    Each dask worker is a node: a :class:`~._plugin.NodePlugin` gives it a pool of warm worker
    processes with per-task timeouts that kill the task's process group, crash isolation,
    captured output and classification, exactly as :class:`~precompile_executor.PrecompileExecutor`
    on one machine. This executor keeps its own priority queue and sends each node at most its
    window of tasks; futures are standard ``concurrent.futures.Future`` objects, PENDING (and
    cancellable) until a node's pool really starts the task.

    Args:
        client: a connected synchronous ``distributed.Client``. Its workers must run with
            ``distributed.worker.daemon: False``.
        timeout: default per-task timeout in seconds, counted from the task's start on a node;
            ``None`` for none. Override per call with :meth:`options`.
        initializer: called once in each pool worker of each node (e.g. ``import torch,
            triton``).
        initargs: arguments for ``initializer``.
        classify: maps a task's exception to ``"raise"``, ``"warn"`` or ``"debug"`` (runs on the
            node; must pickle).
        max_workers_per_node: most tasks one node runs at once; default its dask thread count.
        workers: use only these dask worker addresses (default: every worker, joiners included).

    Raises:
        WorkerStartError: a dask worker is daemonic (it could not start the node pool).
        ValueError, TypeError: a setting is out of range or of the wrong type.
    """

    def __init__(
        self,
        client: Any,
        *,
        timeout: float | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        classify: Callable[[BaseException], Classification] | None = None,
        max_workers_per_node: int | None = None,
        workers: Sequence[str] | None = None,
    ) -> None:
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable or None, got {initializer!r}")
        if not isinstance(initargs, tuple):
            raise TypeError(f"initargs must be a tuple, got {type(initargs).__name__}")
        if classify is not None and not callable(classify):
            raise TypeError(f"classify must be callable or None, got {classify!r}")
        per_node = max_workers_per_node
        if per_node is not None:
            if isinstance(per_node, bool) or not isinstance(per_node, int):
                raise TypeError(
                    f"max_workers_per_node must be an int >= 1 or None, got {per_node!r}"
                )
            if per_node < 1:
                raise ValueError(f"max_workers_per_node must be >= 1, got {per_node}")
        if isinstance(workers, str):
            raise TypeError("workers must be a list of dask worker addresses, not one string")
        self._options = _Options(check_timeout(timeout), 0.0, False)
        try:
            settings = cloudpickle.dumps((initializer, initargs, classify))
        except Exception as exc:
            raise TypeError(
                f"initializer, initargs and classify must be picklable for the nodes: {exc}"
            ) from exc
        daemonic = sorted(a for a, d in client.run(_node.is_daemon).items() if d)
        if daemonic:
            raise WorkerStartError(f"{_node.DAEMON_MESSAGE} (daemonic: {', '.join(daemonic)})")
        name = f"precompile-executor-{uuid.uuid4().hex[:12]}"
        state = _State(client, name, frozenset(workers) if workers is not None else None)
        client.subscribe_topic(state.topic, state.on_started)
        client.register_plugin(NodeCleanupPlugin(), name=NodeCleanupPlugin.name)
        client.register_plugin(NodePlugin(name, settings, max_workers_per_node), name=name)
        state.refresh()
        state.thread.start()
        self._state = state
        self._parent: DaskPrecompileExecutor | None = None
        self._closed = False  # a view's own shutdown (the executor's is state.closing)
        self._tasks: set[_Task] = set()  # submitted through a view, future not yet done
        self._tasks_lock = threading.Lock()  # guards _tasks (done-callbacks run under state.lock)
        # Dropped without shutdown(): let it finish what it has, then unregister its nodes' pools.
        weakref.finalize(self, _abandon, state).atexit = False

    # -- submitting ------------------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Schedule ``fn(*args, **kwargs)`` on a node; return a standard ``Future``.

        Raises:
            TypeError: ``fn`` is not callable.
            RuntimeError: the executor was shut down.
            WorkerStartError: a node's pool could not start (its initializer raised): the
                executor is broken, as the stdlib pools are.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        state = self._state
        future: Future[Any] = Future()
        try:
            blob = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:  # noqa: BLE001 - anything a __reduce__ may raise
            error = SerializationError(
                f"could not serialize {describe_unpicklable(fn, args, kwargs)} to send it to a "
                "node. Tasks on a dask cluster must pickle (cloudpickle)."
            )
            error.__cause__ = exc
            with state.lock:
                if state.closing or self._closed:
                    raise RuntimeError(_AFTER_SHUTDOWN) from None
                state.failed += 1
            future.set_running_or_notify_cancel()
            future.set_exception(error)
            return future
        name = getattr(fn, "__name__", "task")
        task = _Task(
            next(_ids), f"precompile-{name}-{uuid.uuid4().hex}", future, blob, self._options
        )
        with state.lock:
            if state.broken is not None:
                raise state.broken
            if state.closing or self._closed:
                raise RuntimeError(_AFTER_SHUTDOWN)
        view = self if self._parent is not None else None
        future.add_done_callback(lambda f: state.on_future_done(task, f, view))
        with state.lock:
            if state.closing or self._closed:
                raise RuntimeError(_AFTER_SHUTDOWN)
            if view is not None:
                with view._tasks_lock:
                    if not future.done():
                        view._tasks.add(task)
            heapq.heappush(state.queue, (task.sort_key(), task))
            state.poke()
        return future

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Any,
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """Like :meth:`concurrent.futures.Executor.map`: results lazily, in input order.

        ``timeout`` counts from this call; ``chunksize`` is accepted and each call is its own
        task (a dask task per call already amortises nothing that chunks would save);
        ``buffersize`` (Python 3.14's, on any Python): only that many tasks are submitted
        ahead, and one more before each result is waited for, so the input may be endless.
        Closing the iterator cancels what was submitted ahead.
        """
        chunksize = check_chunksize(chunksize)
        buffersize = check_buffersize(buffersize)
        end = None if timeout is None else time.monotonic() + timeout
        arg_tuples = zip(*iterables, strict=False)
        futures = collections.deque(
            self.submit(fn, *args) for args in itertools.islice(arg_tuples, buffersize)
        )
        refill = None
        if buffersize is not None:
            refill = submit_ahead(self, arg_tuples, lambda ex, args: ex.submit(fn, *args))
        return results_in_order(futures, end, chunked=False, refill=refill)

    def options(
        self,
        *,
        timeout: float | None | object = ...,
        priority: float | object = ...,
        with_output: bool | object = ...,
        path: str | object = ...,
        cost: float | None | object = ...,
    ) -> DaskPrecompileExecutor:
        """Return a view with other per-task settings; it shares the queue and the nodes.

        Args:
            timeout: per-task timeout in seconds (``None``: none), counted on the node.
            priority: higher starts first among queued tasks; ties keep submission order.
            with_output: results come back as :class:`~precompile_executor.TaskResult`.
            path: only ``"spawn"``: a node cannot fork the caller's memory.
            cost: a hint, the seconds a call is expected to take: among equal priorities the
                longest starts first (this executor keeps no history; ``None``: no hint).
        """
        opts = self._options
        if timeout is not ...:
            opts = dataclasses.replace(opts, timeout=check_timeout(timeout))
        if priority is not ...:
            opts = dataclasses.replace(opts, priority=check_priority(priority))
        if with_output is not ...:
            opts = dataclasses.replace(opts, with_output=check_flag(with_output, "with_output"))
        if cost is not ...:
            opts = dataclasses.replace(opts, cost=check_cost(cost))
        if path is not ... and path != "spawn":
            raise ValueError(
                "path must be 'spawn' on a dask cluster (a node cannot fork the caller), "
                f"got {path!r}"
            )
        view = object.__new__(DaskPrecompileExecutor)
        view._state = self._state
        view._options = opts
        view._parent = self._parent or self  # keeps the executor (and its finalizer) alive
        view._closed = False
        view._tasks = set()
        view._tasks_lock = threading.Lock()
        return view

    @contextlib.contextmanager
    def batch(self) -> Iterator[DaskPrecompileExecutor]:
        """Queue everything submitted inside the block; dispatch it, by priority, at the end."""
        state = self._state
        with state.lock:
            state.held += 1
        try:
            yield self
        finally:
            with state.lock:
                state.held -= 1
                state.poke()

    # -- the nodes -------------------------------------------------------------------------------

    def nodes(self) -> dict[str, int]:
        """The nodes taking tasks now: dask worker address → window (tasks it may hold)."""
        with self._state.lock:
            return {a: n.window for a, n in self._state.nodes.items()}

    def warm_up(self, timeout: float | None = None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node.

        Raises:
            WorkerStartError: a node's pool could not start (its initializer raised, say).
        """
        state = self._state
        with state.lock:
            addresses = list(state.nodes)
        results = state.client.run(
            _node.warm_up, state.plugin_name, timeout, workers=addresses, on_error="return"
        )
        for address, got in results.items():
            if isinstance(got, BaseException):
                raise WorkerStartError(f"node {address} could not start its pool: {got}") from got
        return {a: list(p) for a, p in results.items()}

    def statistics(self) -> DaskExecutorStatistics:
        """Return an immutable snapshot of the queue, the tasks in flight and the nodes."""
        s = self._state
        with s.lock:
            states = [t.state for t in s.in_flight.values()]
            return DaskExecutorStatistics(
                queued=sum(1 for _, t in s.queue if not t.future.cancelled()),
                dispatched=states.count("dispatched"),
                running=states.count("running"),
                completed=s.completed,
                failed=s.failed,
                cancelled=s.cancelled,
                timed_out=s.timed_out,
                crashed=s.crashed,
                nodes=len(s.nodes),
                slots=sum(n.window for n in s.nodes.values()),
                nodes_lost=s.nodes_lost,
            )

    # -- shutting down ---------------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; when the last one is done, unregister the nodes' pools (their idle
        workers stay warm in each dask worker for the next executor).

        Args:
            wait: block until every queued and running task has finished.
            cancel_futures: cancel the tasks that have not started (queued or dispatched).
        """
        state = self._state
        if self._parent is not None:  # a view: close it alone, as PrecompileExecutor's views do
            with state.lock, self._tasks_lock:
                self._closed = True
                mine = list(self._tasks)
                unstarted = [t for t in mine if t.state in ("queued", "dispatched")]
            if cancel_futures:
                for task in unstarted:
                    task.future.cancel()
            if wait:
                futures_wait([t.future for t in mine])
            return
        with state.lock:
            state.closing = True
            state.held = 0
            unstarted = [t for _, t in state.queue]
            unstarted += [t for t in state.in_flight.values() if t.state == "dispatched"]
            state.poke()
        if cancel_futures:
            for task in unstarted:
                task.future.cancel()
        if wait and state.thread.is_alive() and threading.current_thread() is not state.thread:
            state.thread.join()

    def interrupt(self) -> None:
        """Cancel every task not started and kill the running ones on their nodes (Ctrl-C)."""
        state = self._state
        with state.lock:
            queued = [t for _, t in state.queue]
            running = [t for t in state.in_flight.values() if t.state == "running"]
            dispatched = [t for t in state.in_flight.values() if t.state == "dispatched"]
        for task in queued + dispatched:
            task.future.cancel()
        for task in running:  # its outcome (WorkerCrashedError, "killed ...") still comes back
            state.kill_on_node(task, cancel_dask=False)

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Literal[False]:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupt()
        self.shutdown(wait=True)
        return False


def _abandon(state: _State) -> None:
    with state.lock:
        state.closing = True
        state.poke()
