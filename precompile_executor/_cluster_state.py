"""The caller side every cluster backend shares (``dask/``, ``ray/``): a task's record, the
statistics snapshot, and :class:`ClusterState` — the priority queue, ``in_flight``, the
dispatcher thread's loop and its placement of tasks on nodes, the one place a task is resolved
and the executor's requests (the public layer's ``Backend``, see :mod:`._base`). A backend's
``State`` subclasses it and supplies the dispatcher's talk to its cluster (learning the nodes,
sending calls, reading answers) and ``kill_on_node``; ``dask/_dispatch.py`` and
``ray/_dispatch.py`` describe their data flow.

Who owns what: ``lock`` guards the heap, ``in_flight`` (key → task), the nodes (and the refused
ones), the kills, the dispatcher's inbox and the counters. A task in flight is resolved by whoever
pops it from ``in_flight`` (:meth:`take`); a cancelled future's task is popped by
:meth:`on_future_done` and stopped by the dispatcher (:meth:`withdraw`).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import pickle
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import cloudpickle

from ._base import Call, TaskOptions, failed_future, serialization_error
from ._cluster_plan import free_slots, pick_node
from ._errors import (
    AFTER_SHUTDOWN,
    RemoteError,
    WorkerStartError,
    unpickle_error,
)
from ._node_pool import NodeCall
from ._records import TaskCounts, TaskResult, count_outcome
from ._validate import describe_unpicklable


class NodesRefusedError(RuntimeError):
    """Every node of the cluster was refused when it joined (another Triton than the caller's:
    ``require_same_triton``), so no node can run the task; the message names each node and why.
    Raised for the tasks queued while no node is usable: they would otherwise wait for a node
    that may never join. The executor is not broken: a node that joins later takes new tasks.

    Attributes:
        refusals: node → why it was refused.
    """

    def __init__(self, where: str, refusals: dict[str, str]) -> None:
        reasons = "; ".join(refusals[node] for node in sorted(refusals))
        super().__init__(f"no node of {where} can run the task: every node was refused. {reasons}")
        self.refusals = dict(refusals)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_refused, (self.args[0], self.refusals))


def _rebuild_refused(message: str, refusals: dict[str, str]) -> NodesRefusedError:
    error = NodesRefusedError.__new__(NodesRefusedError)
    RuntimeError.__init__(error, message)
    error.refusals = refusals
    return error


@dataclasses.dataclass(frozen=True)
class ClusterStatistics(TaskCounts):
    """The fields a cluster backend's ``statistics()`` adds to the
    :class:`~precompile_executor.TaskCounts` (each backend names its own subclass).

    Attributes:
        dispatched: tasks sent to a node that has not started them yet (PENDING).
        nodes: nodes taking tasks now.
        slots: tasks all nodes may hold at once (the sum of their windows).
        nodes_lost: nodes lost while this executor ran.
        nodes_refused: nodes present now that get no tasks (another Triton than the caller's;
            ``refused_nodes()`` says why).
    """

    dispatched: int
    nodes: int
    slots: int
    nodes_lost: int
    nodes_refused: int


@dataclasses.dataclass(eq=False)
class ClusterTask:
    """One call on its way to a node; a backend's ``Task`` adds what its sending needs."""

    id: int
    key: str
    future: Future[Any]
    blob: bytes
    opts: TaskOptions
    state: Literal["queued", "dispatched", "running"] = "queued"
    node: str = ""

    def node_call(self) -> NodeCall:
        """The call as its node runs it: the pickled call and its per-task settings."""
        opts = self.opts
        return NodeCall(self.key, self.blob, opts.timeout, opts.with_output, opts.memory_limit)

    def sort_key(self) -> tuple[float, float, int]:
        """Higher priority first, then the longest cost hint, then the oldest."""
        return (-self.opts.priority, -(self.opts.cost or 0.0), self.id)


class ClusterNode(Protocol):
    window: int  # tasks it may hold at once
    keys: set[str]  # the keys of the tasks it holds


T = TypeVar("T", bound=ClusterTask)
N = TypeVar("N", bound=ClusterNode)
S = TypeVar("S", bound=ClusterStatistics)

_ids = itertools.count(1)

log = logging.getLogger("precompile_executor")

RESOLVERS = 4
"""Finished tasks resolved at once, on threads of the executor's own. A cluster's client runs its
futures' done-callbacks on one thread (dask: ``distributed.client.Future._cb_executor``; Ray: the
thread that completes ``ObjectRef.future()``), so a task resolved there — its outcome fetched and
unpickled, its future's own done-callbacks run (a compile's files installed in the caller's
cache, a user's callback) — made every later outcome wait for it, on the way back that was the
largest part of a compile's cost of moving in the GPU box's fleet benchmark (docs/dask.md,
"Compile on CPU nodes"). The work is mostly waiting and writing files: a few threads suffice
(a probe since retired, with ``--resolvers``: beside a caller busy in Python, 1 thread 134 %
per-task cost, 4 threads 38 %, 8 threads 43 %; docs/benchmarks.md, "2026-12-06 01:59 UTC")."""


class ClusterState(Generic[T, N, S]):
    """Everything a cluster executor and its ``options()`` views share (see the module doc)."""

    # The backend's own, set on its subclass.
    where: ClassVar[str]  # the cluster, in messages: "a dask cluster"
    task_type: type[T]
    statistics_type: type[S]
    thread: threading.Thread  # the backend's dispatcher

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.poked = False
        self.queue: list[tuple[tuple[float, float, int], T]] = []
        self.in_flight: dict[str, T] = {}
        self.nodes: dict[str, N] = {}
        self.kills: list[T] = []
        self.inbox: list[Callable[[], None]] = []  # posted for the dispatcher thread
        self.refused: dict[str, str] = {}  # node present now -> why it gets no tasks
        self.stranded = False  # every node present is refused: queued tasks fail, not wait
        self.held = 0
        self.closing = False
        self.broken: BaseException | None = None  # a node's pool could not start: like the stdlib
        self.completed = self.failed = self.cancelled = 0
        self.timed_out = self.crashed = self.nodes_lost = 0
        self.resolvers = ThreadPoolExecutor(RESOLVERS, thread_name_prefix="precompile-resolve")

    def resolve_later(self, resolve: Callable[..., None], *args: Any) -> None:
        """Run ``resolve(*args)`` — a finished task's outcome fetched and its future resolved —
        on a resolver thread (:data:`RESOLVERS`); the client's callback thread calls this."""
        try:
            self.resolvers.submit(resolve, *args)
        except RuntimeError:  # shut down: the task was resolved otherwise; resolve finds out
            resolve(*args)

    def poke(self) -> None:
        """Wake the dispatcher (lock held)."""
        self.poked = True
        self.wake.notify_all()

    def drained(self) -> bool:
        """Shut down with nothing left to run or kill: the dispatcher may end (lock held)."""
        return (
            self.closing
            and not self.in_flight
            and not self.kills
            and not any(not t.future.cancelled() for _, t in self.queue)
        )

    def post(self, call: Callable[[], None]) -> None:
        """Have the dispatcher thread run ``call`` (an answer from a node; any thread)."""
        with self.lock:
            self.inbox.append(call)
            self.poke()

    # -- the dispatcher thread -------------------------------------------------------------------

    def run(self) -> None:
        """The dispatcher thread: stop the cancelled tasks, run what was posted, learn which
        nodes exist (every :attr:`node_poll_s`), send what fits; once shut down and drained,
        close the nodes' pools."""
        next_refresh = 0.0
        while True:
            with self.wake:
                if not self.poked:
                    self.wake.wait(max(0.0, next_refresh - time.monotonic()))
                self.poked = False
                kills, self.kills = self.kills, []
                inbox, self.inbox = self.inbox, []
            for task in kills:
                self.withdraw(task)
            for call in inbox:
                call()
            if time.monotonic() >= next_refresh:
                self.refresh()
                next_refresh = time.monotonic() + self.node_poll_s
            with self.lock:
                sends = self.plan()
                stranded = self.strand()
                refusals = dict(self.refused)
                later = self.after_plan()
                done = self.drained()
            for task in stranded:
                self.finish(task, exc=NodesRefusedError(self.where, refusals))
            for task in sends:
                self.send(task)
            for call in later:
                call()
            if done and not sends:
                break
        # Not waited for: a done-callback that shuts its executor down with wait=True runs on a
        # resolver and waits for this thread. Every task is resolved (drained), so a resolver
        # still at work only finishes what it holds.
        self.resolvers.shutdown(wait=False)
        self.close()

    def plan(self) -> list[T]:
        """Move queued tasks to nodes with free slots, best priority first (lock held).

        A task that no node with a free slot may take (:meth:`eligible`) stays queued, in its
        place; the tasks behind it may go to other nodes.
        """
        if self.held or not self.nodes:
            return []
        free = free_slots(
            {a: n.window for a, n in self.nodes.items()},
            {a: len(n.keys) for a, n in self.nodes.items()},
        )
        sends: list[T] = []
        kept: list[tuple[tuple[float, float, int], T]] = []
        while self.queue and any(free.values()):
            entry = heapq.heappop(self.queue)
            task = entry[1]
            if task.future.cancelled():
                continue
            address = pick_node(free, self.eligible(task))
            if address is None:
                kept.append(entry)
                continue
            node = self.nodes[address]
            task.state, task.node = "dispatched", address
            self.bind(task, node)
            node.keys.add(task.key)
            self.in_flight[task.key] = task
            free[address] -= 1
            sends.append(task)
        for entry in kept:
            heapq.heappush(self.queue, entry)
        return sends

    def strand(self) -> list[T]:
        """Take every queued task out of the queue while no node can ever run it: every node
        present was refused (lock held). A task waits while any node may still join."""
        if not self.stranded:
            return []
        taken = [t for _, t in self.queue if not t.future.cancelled()]
        self.queue.clear()
        return taken

    def refuse(self, node: str, why: str) -> None:
        """``node`` gets no tasks (another Triton than the caller's): remember and say why
        (lock held; a warning in the caller's log, ``refused_nodes()``, ``statistics()``)."""
        if node not in self.refused:
            log.warning("%s", why)
        self.refused[node] = why

    # -- the backend's part of the dispatcher ----------------------------------------------------

    node_poll_s: float
    """How often the dispatcher asks the cluster which nodes exist (the backend's constant)."""

    def refresh(self) -> None:
        raise NotImplementedError  # learn which nodes exist; fail the tasks of lost ones

    def eligible(self, task: T) -> list[str] | None:
        """The nodes that may take ``task`` (lock held); ``None``: any node."""
        return None

    def bind(self, task: T, node: N) -> None:
        """``task`` goes to ``node``: keep what sending it there needs (lock held)."""

    def send(self, task: T) -> None:
        raise NotImplementedError  # send a dispatched task to its node (no lock held)

    def after_plan(self) -> list[Callable[[], None]]:
        """Calls for the dispatcher to make once the tasks are sent (lock held)."""
        return []

    def withdraw(self, task: T) -> None:
        """Stop ``task``, whose future was cancelled, on its node (no lock held)."""
        self.kill_on_node(task)

    def close(self) -> None:
        raise NotImplementedError  # the executor is done: close its pools on the nodes

    def kill_on_node(self, task: T) -> None:
        raise NotImplementedError  # the backend's: kill a running task where it runs

    def node_lost(self, node: str, detail: str) -> BaseException:
        raise NotImplementedError  # the backend's NodeLostError

    def warm_up(self, timeout: float | None) -> dict[str, list[int]]:
        raise NotImplementedError  # start every node's pool workers; their pids per node

    # -- other threads ---------------------------------------------------------------------------

    def take(self, task: T) -> bool:
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

    def on_future_done(self, task: T, future: Future[Any]) -> None:
        """The caller's future finished; if it was cancelled, stop the task (any thread)."""
        if not future.cancelled():
            return
        with self.lock:
            # Only here (starts are skipped for a cancelled future), at once: wait() and
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

    # -- resolving a task (no lock held; the caller owns the task) -------------------------------

    def finish_outcome(self, task: T, outcome: dict[str, Any]) -> None:
        """Resolve ``task`` from a node pool's plain outcome record (:mod:`._node_pool`)."""
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
        elif outcome.get("reason") == "node-changed":  # dask's: the node restarted meanwhile
            self.finish(task, exc=self.node_lost(task.node, outcome.get("message", "")))
        else:
            self.finish(task, exc=WorkerStartError(outcome.get("message", "node unavailable")))

    def finish(self, task: T, *, exc: BaseException | None = None, value: Any = None) -> None:
        """The one place that resolves a task's future."""
        with self.lock:
            count_outcome(self, exc)
            if isinstance(exc, WorkerStartError) and self.broken is None:
                self.broken = exc
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

    def unstarted(self) -> list[T]:
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
        """Take no new tasks; when the last one is done, the dispatcher closes the nodes'
        pools."""
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
        (``WorkerCrashedError``, "killed ...") still comes back from the node."""
        with self.lock:
            running = [
                t
                for t in self.in_flight.values()
                if t.state == "running" and (futures is None or t.future in futures)
            ]
        for task in running:
            self.kill_on_node(task)
        return [t.future for t in running]

    def submit_call(self, call: Call, opts: TaskOptions, where: str) -> Future[Any]:
        """Pickle ``call`` and queue it; one that will not pickle fails its own future only
        (``where``: "a dask cluster", for the advice)."""
        (fn, args, kwargs) = call
        try:
            blob = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:  # noqa: BLE001 - anything a __reduce__ may raise
            with self.lock:
                if self.closing:
                    raise RuntimeError(AFTER_SHUTDOWN) from None
                self.failed += 1
            what = describe_unpicklable(fn, args, kwargs)
            advice = f"Tasks on {where} must pickle (cloudpickle)."
            return failed_future(serialization_error(what, "to send it to a node", advice, exc))
        return self.enqueue(getattr(fn, "__name__", "task"), blob, opts)

    def enqueue(self, name: str, blob: bytes, opts: TaskOptions) -> Future[Any]:
        """Queue a pickled call; return its future (raises once shut down or broken)."""
        future: Future[Any] = Future()
        key = f"precompile-{name}-{uuid.uuid4().hex}"
        task: T = self.task_type(next(_ids), key, future, blob, opts)
        with self.lock:
            if self.broken is not None:
                raise self.broken
            if self.closing:
                raise RuntimeError(AFTER_SHUTDOWN)
        future.add_done_callback(lambda f: self.on_future_done(task, f))
        with self.lock:
            if self.closing:
                raise RuntimeError(AFTER_SHUTDOWN)
            heapq.heappush(self.queue, (task.sort_key(), task))
            self.poke()
        return future

    def refused_nodes(self) -> dict[str, str]:
        """The nodes present now that get no tasks: node → why."""
        with self.lock:
            return dict(self.refused)

    def windows(self) -> dict[str, int]:
        """The nodes taking tasks now: node → window."""
        with self.lock:
            return {a: n.window for a, n in self.nodes.items()}

    def statistics(self) -> S:
        """An immutable snapshot of the queue, the tasks in flight and the nodes."""
        with self.lock:
            states = [t.state for t in self.in_flight.values()]
            return self.statistics_type(
                queued=sum(1 for _, t in self.queue if not t.future.cancelled()),
                dispatched=states.count("dispatched"),
                running=states.count("running"),
                completed=self.completed,
                failed=self.failed,
                cancelled=self.cancelled,
                timed_out=self.timed_out,
                crashed=self.crashed,
                nodes=len(self.nodes),
                slots=sum(n.window for n in self.nodes.values()),
                nodes_lost=self.nodes_lost,
                nodes_refused=len(self.refused),
            )
