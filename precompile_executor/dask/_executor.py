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

import contextlib
import dataclasses
import heapq
import itertools
import logging
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import Future, InvalidStateError
from typing import Any, Literal, TypeVar

import cloudpickle

from .._base import BaseExecutor, Call, Path, TaskOptions, failed_future, serialization_error
from .._errors import (
    AFTER_SHUTDOWN,
    Classification,
    RemoteError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
    unpickle_error,
)
from .._records import TaskResult
from .._validate import check_count, check_initializer, check_timeout, describe_unpicklable
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


@dataclasses.dataclass(eq=False)
class _Task:
    id: int
    key: str
    future: Future[Any]
    blob: bytes
    opts: TaskOptions
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

    def on_future_done(self, task: _Task, future: Future[Any]) -> None:
        """The caller's future finished; if it was cancelled, stop the task (any thread)."""
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
                err = unpickle_error(exc)
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

    # -- the executor's requests (no lock held; the _base.Backend protocol) ---------------------

    def unstarted(self) -> list[_Task]:
        """Tasks queued here or dispatched to a node that has not started them (lock held)."""
        queued = [t for _, t in self.queue]
        return queued + [t for t in self.in_flight.values() if t.state == "dispatched"]

    def hold(self) -> None:
        with self.lock:
            self.held += 1

    def release(self) -> None:
        with self.lock:
            self.held -= 1
            self.poke()

    def begin_shutdown(self, *, cancel_futures: bool = False) -> None:
        """Take no new tasks; when the last one is done, unregister the nodes' pools."""
        with self.lock:
            self.closing = True
            self.held = 0
            unstarted = self.unstarted()
            self.poke()
        if cancel_futures:
            for task in unstarted:
                task.future.cancel()

    def join(self) -> None:
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()

    def interrupt(self) -> None:
        """Cancel every task not started and kill the running ones on their nodes (Ctrl-C)."""
        with self.lock:
            unstarted = self.unstarted()
        for task in unstarted:
            task.future.cancel()
        self.kill(None)

    def kill(self, futures: AbstractSet[Future[Any]] | None) -> list[Future[Any]]:
        """Kill the running tasks of ``futures`` (``None``: all) on their nodes; their outcome
        (``WorkerCrashedError``, "killed ...") still comes back through dask."""
        with self.lock:
            running = [
                t
                for t in self.in_flight.values()
                if t.state == "running" and (futures is None or t.future in futures)
            ]
        for task in running:
            self.kill_on_node(task, cancel_dask=False)
        return [t.future for t in running]


class DaskPrecompileExecutor(BaseExecutor[_State]):
    """Runs callables on node-local ``PrecompileExecutor`` pools of a dask cluster.

    Each dask worker is a node: a :class:`~._plugin.NodePlugin` gives it a pool of warm worker
    processes with per-task timeouts that kill the task's process group, crash isolation,
    captured output and classification, exactly as :class:`~precompile_executor.PrecompileExecutor`
    on one machine. This executor keeps its own priority queue and sends each node at most its
    window of tasks; futures are standard ``concurrent.futures.Future`` objects, PENDING (and
    cancellable) until a node's pool really starts the task. ``map`` sends each call as its own
    task whatever ``chunksize`` says (a dask task per call already amortises what chunks save);
    ``options(path=)`` takes only ``"spawn"``.

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

    CHUNKS = False

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
        check_initializer(initializer, initargs, classify)
        check_count(max_workers_per_node, "max_workers_per_node", 1, optional=True)
        if isinstance(workers, str):
            raise TypeError("workers must be a list of dask worker addresses, not one string")
        options = TaskOptions(check_timeout(timeout))
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
        super().__init__(state, options)

    def _check_path(self, value: object) -> Path:
        if value != "spawn":
            raise ValueError(
                "path must be 'spawn' on a dask cluster (a node cannot fork the caller), "
                f"got {value!r}"
            )
        return "spawn"

    # -- sending a task (the layer's _send) ------------------------------------------------------

    def _send(
        self, opts: TaskOptions, calls: list[Call], *, chunked: bool, prepared: Any
    ) -> Future[Any]:
        (fn, args, kwargs) = calls[0]
        state = self._backend
        try:
            blob = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:  # noqa: BLE001 - anything a __reduce__ may raise
            with state.lock:
                if state.closing:
                    raise RuntimeError(AFTER_SHUTDOWN) from None
                state.failed += 1
            what = describe_unpicklable(fn, args, kwargs)
            advice = "Tasks on a dask cluster must pickle (cloudpickle)."
            return failed_future(serialization_error(what, "to send it to a node", advice, exc))
        future: Future[Any] = Future()
        name = getattr(fn, "__name__", "task")
        task = _Task(next(_ids), f"precompile-{name}-{uuid.uuid4().hex}", future, blob, opts)
        with state.lock:
            if state.broken is not None:
                raise state.broken
            if state.closing:
                raise RuntimeError(AFTER_SHUTDOWN)
        future.add_done_callback(lambda f: state.on_future_done(task, f))
        with state.lock:
            if state.closing:
                raise RuntimeError(AFTER_SHUTDOWN)
            heapq.heappush(state.queue, (task.sort_key(), task))
            state.poke()
        return future

    # -- the nodes -------------------------------------------------------------------------------

    def nodes(self) -> dict[str, int]:
        """The nodes taking tasks now: dask worker address → window (tasks it may hold)."""
        with self._backend.lock:
            return {a: n.window for a, n in self._backend.nodes.items()}

    def warm_up(self, timeout: float | None = None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node.

        Raises:
            WorkerStartError: a node's pool could not start (its initializer raised, say).
        """
        state = self._backend
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
        s = self._backend
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
