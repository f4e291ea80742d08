"""``RayPrecompileExecutor``: the caller side; tasks run on node-local pools of a Ray cluster.

Data flow::

    submit(fn, *args)                               caller's thread
      │ cloudpickle (fn, args, kwargs) → blob; a failure fails this future only
      ▼
    priority heap ── futures PENDING, cancel() works
      │ dispatcher thread: while a node that has the task's resources has a free slot
      │ (window = its Ray CPUs, capped by max_workers_per_node):
      │ actor.run.remote(session, key, blob, timeout, with_output) — still PENDING, cancellable
      ▼
    node actor (one per node, NodeAffinitySchedulingStrategy) ─► session's NodePool: the
      │ node-local PrecompileExecutor (timeouts, group kills, crash isolation, capture,
      │ classification) ─── started keys, answered to the long poll actor.starts.remote()
      │                                                ─► dispatcher: future → RUNNING
      ▼
    plain outcome record (bytes, str, numbers) ─► ObjectRef.future() callback (a Ray thread):
      the result unpickled here, or the RemoteError proxy rebuilt from its record ─► future;
      the node's slot is free again

Who owns what: ``_State.lock`` guards the heap, ``in_flight`` (key → task), the nodes, the
dispatcher's inbox and the counters. A task in flight is resolved by whoever pops it from
``in_flight``: a Ray callback thread (its outcome, or its actor's failure: NodeLostError), the
dispatcher (its node left the cluster: NodeLostError) or the thread that cancelled its future
(then the dispatcher kills it on its node). Only the dispatcher thread places actors and sends
calls; Ray's callback threads only resolve tasks and post what they learnt to the dispatcher's
inbox (``warm_up()`` waits on its own calls in the caller's thread).
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, InvalidStateError
from concurrent.futures import wait as futures_wait
from typing import Any, Literal, TypeVar

import cloudpickle
import ray

from .._base import results_in_order, submit_ahead
from .._cluster_plan import departed, free_slots, has_resources, node_window, pick_node
from .._errors import (
    Classification,
    RemoteError,
    ResultSerializationError,
    SerializationError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
)
from .._executor import _check_devices
from .._records import TaskResult
from .._validate import (
    check_buffersize,
    check_chunksize,
    check_cost,
    check_flag,
    check_priority,
    check_timeout,
    describe_unpicklable,
)
from . import _placement

log = logging.getLogger("precompile_executor.ray")

T = TypeVar("T")

NODE_POLL_S = 0.5
"""How often the dispatcher asks Ray which nodes are alive: a node that left fails its tasks,
and a new node gets an actor, at most this much later than Ray knows. ``ray.nodes()`` is one
call to the cluster's control store."""

STARTS_WAIT_S = 10.0
"""How long a node's long poll for started tasks waits before it answers empty (then the
dispatcher asks again): bounds the idle traffic, not the latency of ``running()``."""

PLACE_TIMEOUT_S = 120.0
"""Longest the constructor waits for the actors on the nodes present at that time (an actor is a
new Ray worker process: about a second; more on a loaded node). Later nodes join on their own."""

PLACE_RETRY_S = 10.0
"""A node whose actor could not be placed (say, ``precompile_executor`` is not importable there)
is tried again this much later, not at every refresh."""

_AFTER_SHUTDOWN = "cannot schedule new futures after shutdown"


class NodeLostError(WorkerCrashedError):
    """The Ray node (or its node actor) that held the task was lost: the node left the cluster,
    or the actor's process died. The task may be the cause, so it is not run again; other tasks
    go on on the remaining nodes.

    Attributes:
        node: the Ray node id (hex).
    """

    def __init__(self, node: str, detail: str = "") -> None:
        msg = (
            f"Ray node {node} was lost while it held the task; the task is not re-run (it may be "
            "the cause). The other tasks go on on the remaining nodes; check that node's raylet "
            "log (an OOM kill, a crashed raylet or actor)"
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
class RayExecutorStatistics:
    """An immutable snapshot of a :class:`RayPrecompileExecutor`, from ``statistics()``.

    Attributes:
        queued: tasks in the caller's queue (PENDING).
        dispatched: tasks sent to a node that has not started them yet (PENDING).
        running: tasks running on a node's pool.
        completed: tasks that returned a value.
        failed: tasks that raised, timed out, crashed or lost their node.
        cancelled: tasks cancelled before they started.
        timed_out: failed tasks that ran past their timeout.
        crashed: failed tasks whose pool worker died, or whose node was lost.
        nodes: nodes taking tasks now.
        slots: tasks all nodes may hold at once (the sum of their windows).
        nodes_lost: nodes (or node actors) lost while this executor ran.
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
    resources: tuple[tuple[str, float], ...] = ()  # the node must have these (a filter)


@dataclasses.dataclass(eq=False)
class _Task:
    id: int
    key: str
    future: Future[Any]
    blob: bytes
    opts: _Options
    state: Literal["queued", "dispatched", "running"] = "queued"
    node: str = ""
    actor: Any = None
    ref: Any = None  # the run() call's ObjectRef, held until the task is resolved

    def sort_key(self) -> tuple[float, float, int]:
        """Higher priority first, then the longest cost hint, then the oldest."""
        return (-self.opts.priority, -(self.opts.cost or 0.0), self.id)


@dataclasses.dataclass(eq=False)
class _Node:
    node_id: str
    actor: Any
    window: int
    resources: dict[str, float]
    keys: set[str] = dataclasses.field(default_factory=set)
    polling: Any = None  # the starts() long poll's ObjectRef while one is out


_ids = itertools.count(1)


def check_resources(value: object, name: str = "resources") -> tuple[tuple[str, float], ...]:
    """``{"GPU": 1}``-style amounts a node must have, as a sorted tuple (hashable)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of resource name -> amount, got {value!r}")
    items: list[tuple[str, float]] = []
    for key, amount in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{name} names must be strings, got {key!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ValueError(f"{name}[{key!r}] must be a number >= 0, got {amount!r}")
        items.append((key, float(amount)))
    return tuple(sorted(items))


def _check_devices_per_node(value: object) -> tuple[int | str, ...] | Literal["auto"] | None:
    if value == "auto":
        return "auto"
    try:
        return _check_devices(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("devices", "devices_per_node", 1)) from None


class _State:
    """Everything the executor and its ``options()`` views share; see the module docstring."""

    def __init__(
        self,
        settings: bytes,
        max_workers_per_node: int | None,
        devices_per_node: tuple[int | str, ...] | Literal["auto"] | None,
        resources: tuple[tuple[str, float], ...],
    ) -> None:
        self.session = f"precompile-executor-{uuid.uuid4().hex[:12]}"
        self.settings = settings
        self.max_workers_per_node = max_workers_per_node
        self.devices_per_node = devices_per_node
        self.resources = dict(resources)
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.poked = False
        self.queue: list[tuple[tuple[float, float, int], _Task]] = []
        self.in_flight: dict[str, _Task] = {}
        self.nodes: dict[str, _Node] = {}
        self.placing: dict[str, _Node] = {}  # open() sent, not answered
        self.retry_at: dict[str, float] = {}  # node id -> when to try placing again
        self.inbox: list[tuple[str, str, Any, Future[Any]]] = []  # (what, node, actor, answer)
        self.refreshed = False
        self.kills: list[_Task] = []
        self.held = 0
        self.closing = False
        self.broken: BaseException | None = None  # a node's pool could not start: like the stdlib
        self.completed = self.failed = self.cancelled = 0
        self.timed_out = self.crashed = self.nodes_lost = 0
        self.thread = threading.Thread(target=self.run, name="precompile-ray-dispatch", daemon=True)

    def poke(self) -> None:
        """Wake the dispatcher (lock held)."""
        self.poked = True
        self.wake.notify_all()

    def post(self, what: str, node_id: str, actor: Any, answer: Future[Any]) -> None:
        """An answer from a node, for the dispatcher (a Ray callback thread)."""
        with self.lock:
            self.inbox.append((what, node_id, actor, answer))
            self.poke()

    # -- the dispatcher thread -------------------------------------------------------------------

    def run(self) -> None:
        next_refresh = 0.0
        while True:
            with self.wake:
                if not self.poked:
                    self.wake.wait(max(0.0, next_refresh - time.monotonic()))
                self.poked = False
                kills, self.kills = self.kills, []
                inbox, self.inbox = self.inbox, []
            for task in kills:
                self.kill_on_node(task)
            for what, node_id, actor, answer in inbox:
                self.on_answer(what, node_id, actor, answer)
            if time.monotonic() >= next_refresh:
                self.refresh()
                next_refresh = time.monotonic() + NODE_POLL_S
            with self.lock:
                sends = self.plan()
                polls = [n for n in self.nodes.values() if n.keys and n.polling is None]
                for node in polls:
                    node.polling = True  # until poll_starts() stores the call's ObjectRef
                done = (
                    self.closing
                    and not self.in_flight
                    and not self.kills
                    and not any(not t.future.cancelled() for _, t in self.queue)
                )
            for task in sends:
                self.send(task)
            for node in polls:
                self.poll_starts(node)
            if done and not sends:
                break
        self.close()

    def plan(self) -> list[_Task]:
        """Move queued tasks to nodes with free slots, best priority first (lock held).

        A task whose resources no node with a free slot has stays queued, in its place; the
        tasks behind it may go to other nodes.
        """
        if self.held or not self.nodes:
            return []
        free = free_slots(
            {a: n.window for a, n in self.nodes.items()},
            {a: len(n.keys) for a, n in self.nodes.items()},
        )
        sends: list[_Task] = []
        kept: list[tuple[tuple[float, float, int], _Task]] = []
        while self.queue and any(free.values()):
            entry = heapq.heappop(self.queue)
            task = entry[1]
            if task.future.cancelled():
                continue
            among = None
            if task.opts.resources:
                wanted = dict(task.opts.resources)
                among = [a for a, n in self.nodes.items() if has_resources(n.resources, wanted)]
            address = pick_node(free, among)
            if address is None:
                kept.append(entry)
                continue
            node = self.nodes[address]
            task.state, task.node, task.actor = "dispatched", address, node.actor
            node.keys.add(task.key)
            self.in_flight[task.key] = task
            free[address] -= 1
            sends.append(task)
        for entry in kept:
            heapq.heappush(self.queue, entry)
        return sends

    def send(self, task: _Task) -> None:
        try:
            ref = task.actor.run.remote(
                self.session, task.key, task.blob, task.opts.timeout, task.opts.with_output
            )
            answer = ref.future()
        except Exception as exc:  # noqa: BLE001 - Ray shut down under us, say: fail this task only
            if self.take(task):
                self.finish(task, exc=RuntimeError(f"Ray refused the task: {exc!r}"))
            return
        task.ref = ref
        answer.add_done_callback(lambda f: self.on_outcome(task, f))

    def poll_starts(self, node: _Node) -> None:
        try:
            ref = node.actor.starts.remote(self.session, STARTS_WAIT_S)
            answer = ref.future()
        except Exception:  # noqa: BLE001 - Ray shut down: the tasks' own answers say the rest
            with self.lock:
                node.polling = None
            return
        with self.lock:
            node.polling = ref
        answer.add_done_callback(lambda f: self.post("starts", node.node_id, node.actor, f))

    def kill_on_node(self, task: _Task) -> None:
        """Cancel or kill ``task`` on its node (the answer is not awaited)."""
        with contextlib.suppress(Exception):  # the actor is gone: nothing left to kill
            task.actor.kill.remote(self.session, task.key)

    def refresh(self) -> None:
        """Learn which nodes are alive: place actors on new ones, fail the tasks of lost ones."""
        try:
            listing: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        except Exception:  # noqa: BLE001 - Ray is shutting down: the tasks' answers say the rest
            return
        present = {
            n["NodeID"]: n
            for n in listing
            if n.get("Alive") and has_resources(n.get("Resources", {}), self.resources)
        }
        now = time.monotonic()
        with self.lock:
            new = [
                node_id
                for node_id in present
                if node_id not in self.nodes
                and node_id not in self.placing
                and self.retry_at.get(node_id, 0.0) <= now
                and not self.closing
            ]
            gone = departed(self.nodes, present)
            for node_id in departed(self.placing, present):
                del self.placing[node_id]  # its open() fails on its own; nothing was sent there
        for node_id in gone:
            self.lose(node_id, None, "the node left the cluster")
        for node_id in new:
            self.place(node_id, present[node_id].get("Resources", {}))
        with self.lock:
            self.refreshed = True
            self.wake.notify_all()

    def place(self, node_id: str, resources: dict[str, float]) -> None:
        """Ask the node's actor (placed now if need be) to open this executor's pool there."""
        window = node_window(resources.get("CPU", 1.0), self.max_workers_per_node)
        devices: Sequence[int | str] | None
        if self.devices_per_node == "auto":
            gpus = int(resources.get("GPU", 0))
            devices = list(range(gpus)) if gpus else None
        else:
            devices = self.devices_per_node
        node = _Node(node_id, None, window, dict(resources))
        try:
            node.actor = _placement.actor_for(node_id)
            answer = node.actor.open.remote(self.session, self.settings, window, devices).future()
        except Exception as exc:  # noqa: BLE001 - tried again later
            log.warning("could not place a node actor on Ray node %s: %s", node_id, exc)
            with self.lock:
                self.retry_at[node_id] = time.monotonic() + PLACE_RETRY_S
            return
        with self.lock:
            self.placing[node_id] = node
        answer.add_done_callback(lambda f: self.post("opened", node_id, node.actor, f))

    def on_answer(self, what: str, node_id: str, actor: Any, answer: Future[Any]) -> None:
        """A node's answer to ``open()`` or ``starts()`` (dispatcher thread)."""
        error = answer.exception()
        if what == "lost":
            self.lose(node_id, actor, f"its actor failed: {error!r}")
            return
        if what == "opened":
            with self.lock:
                node = self.placing.get(node_id)
                if node is None or node.actor is not actor:
                    return  # the node left meanwhile
                del self.placing[node_id]
                if error is None and not self.closing:
                    self.nodes[node_id] = node
                    self.wake.notify_all()
                    return
                if error is None:
                    return
                self.retry_at[node_id] = time.monotonic() + PLACE_RETRY_S
            log.warning("the node actor on Ray node %s did not start: %s", node_id, error)
            _placement.retire(node_id, actor)
            return
        with self.lock:
            node = self.nodes.get(node_id)
            if node is None or node.actor is not actor:
                return
            node.polling = None
            if error is None:
                for key in answer.result() or ():
                    task = self.in_flight.get(key)
                    if task is None or task.state != "dispatched" or task.future.cancelled():
                        continue  # a cancelled one: its callback (waiting for the lock) kills it
                    task.state = "running"
                    task.future.set_running_or_notify_cancel()
                return
        self.lose(node_id, actor, f"its actor failed: {error!r}")

    def lose(self, node_id: str, actor: Any, detail: str) -> None:
        """Fail the tasks in flight on ``node_id`` (if ``actor`` is still its actor) and retire
        the actor: it is not trusted again (dispatcher thread)."""
        with self.lock:
            node = self.nodes.get(node_id)
            if node is None or (actor is not None and node.actor is not actor):
                return
            del self.nodes[node_id]
            self.nodes_lost += 1
            lost = [t for t in (self.in_flight.pop(k, None) for k in node.keys) if t is not None]
            self.poke()
        log.warning("Ray node %s lost (%s); %d task(s) in flight fail", node_id, detail, len(lost))
        _placement.retire(node_id, node.actor)
        for task in lost:
            self.finish(task, exc=NodeLostError(node_id, detail))

    def wait_placed(self, timeout: float) -> None:
        """Until the nodes present now have answered (the constructor; caller's thread)."""
        end = time.monotonic() + timeout
        with self.lock:
            while not self.refreshed or self.placing:
                left = end - time.monotonic()
                if left <= 0:
                    log.warning("Ray nodes %s still placing after %ss", list(self.placing), timeout)
                    return
                self.wake.wait(left)

    def close(self) -> None:
        """Close this executor's pools on every node; the actors stay for the next executor."""
        with self.lock:
            actors = [n.actor for n in self.nodes.values()]
            actors += [n.actor for n in self.placing.values()]
        for actor in actors:
            with contextlib.suppress(Exception):
                actor.close.remote(self.session)

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

    def on_future_done(
        self, task: _Task, future: Future[Any], view: RayPrecompileExecutor | None = None
    ) -> None:
        """The caller's future finished; if it was cancelled, stop the task (any thread)."""
        if view is not None:  # may run with self.lock held (a result set under it): not it
            with view._tasks_lock:
                view._tasks.discard(task)
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

    def on_outcome(self, task: _Task, answer: Future[Any]) -> None:
        """The node's answer to ``run()`` (a Ray callback thread): resolve the task."""
        error = answer.exception()
        if error is not None:
            # run() never raises: this is Ray's (the actor died, its node left). Not re-run.
            if self.take(task):
                self.finish(task, exc=NodeLostError(task.node, repr(error)))
            done: Future[Any] = Future()
            done.set_exception(error)
            self.post("lost", task.node, task.actor, done)
            return
        if self.take(task):
            self.finish_outcome(task, answer.result())

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


class RayPrecompileExecutor(Executor):
    """Runs callables on node-local ``PrecompileExecutor`` pools of a Ray cluster.

    Each Ray node gets one long-lived actor (placed on it with node-affinity scheduling, and
    re-placed as nodes join and leave) that hosts this executor's node pool: warm worker
    processes with per-task timeouts that kill the task's process group, crash isolation,
    captured output and classification, exactly as
    :class:`~precompile_executor.PrecompileExecutor` on one machine. This executor keeps its own
    priority queue and sends each node at most its window of tasks; futures are standard
    ``concurrent.futures.Future`` objects, PENDING (and cancellable) until a node's pool really
    starts the task.

    Args:
        address: the cluster to join when Ray is not initialized in this process yet (passed to
            ``ray.init``; ``None``: ``RAY_ADDRESS``, else a running local cluster, else a new
            one). An initialized Ray is used as it is.
        timeout: default per-task timeout in seconds, counted from the task's start on a node;
            ``None`` for none. Override per call with :meth:`options`.
        initializer: called once in each pool worker of each node (e.g. ``import torch,
            triton``).
        initargs: arguments for ``initializer``.
        classify: maps a task's exception to ``"raise"``, ``"warn"`` or ``"debug"`` (runs on the
            node; must pickle).
        max_workers_per_node: most tasks one node runs at once; default its Ray ``CPU`` count.
        devices_per_node: pin each node's pool workers to these of its GPUs (``devices`` of
            ``PrecompileExecutor``: ``CUDA_VISIBLE_DEVICES`` per worker, spread evenly), or
            ``"auto"``: every GPU Ray counts on that node. ``None``: no pinning.
        resources: use only nodes whose Ray resources cover these amounts (``{"GPU": 1}``: GPU
            nodes). Nothing is reserved: the window bounds what runs on a node. Per task:
            ``options(resources=...)``.

    Raises:
        ValueError, TypeError: a setting is out of range or of the wrong type.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        timeout: float | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        classify: Callable[[BaseException], Classification] | None = None,
        max_workers_per_node: int | None = None,
        devices_per_node: Sequence[int | str] | Literal["auto"] | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a string or None, got {address!r}")
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
        devices = _check_devices_per_node(devices_per_node)
        node_filter = check_resources(resources)
        self._options = _Options(check_timeout(timeout), 0.0, False)
        try:
            settings = cloudpickle.dumps((initializer, initargs, classify))
        except Exception as exc:
            raise TypeError(
                f"initializer, initargs and classify must be picklable for the nodes: {exc}"
            ) from exc
        if not ray.is_initialized():
            ray.init(address=address)
        state = _State(settings, max_workers_per_node, devices, node_filter)
        state.thread.start()
        state.wait_placed(PLACE_TIMEOUT_S)
        self._state = state
        self._parent: RayPrecompileExecutor | None = None
        self._closed = False  # a view's own shutdown (the executor's is state.closing)
        self._tasks: set[_Task] = set()  # submitted through a view, future not yet done
        self._tasks_lock = threading.Lock()  # guards _tasks (done-callbacks run under state.lock)
        # Dropped without shutdown(): let it finish what it has, then close its nodes' pools.
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
                "node. Tasks on a Ray cluster must pickle (cloudpickle)."
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
        task; ``buffersize`` (Python 3.14's, on any Python): only that many tasks are submitted
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
        resources: Mapping[str, float] | None | object = ...,
    ) -> RayPrecompileExecutor:
        """Return a view with other per-task settings; it shares the queue and the nodes.

        Args:
            timeout: per-task timeout in seconds (``None``: none), counted on the node.
            priority: higher starts first among queued tasks; ties keep submission order.
            with_output: results come back as :class:`~precompile_executor.TaskResult`.
            path: only ``"spawn"``: a node cannot fork the caller's memory.
            cost: a hint, the seconds a call is expected to take: among equal priorities the
                longest starts first (this executor keeps no history; ``None``: no hint).
            resources: the task goes only to nodes whose Ray resources cover these amounts
                (``{"GPU": 1}``: a GPU node); a filter, nothing is reserved.
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
        if resources is not ...:
            opts = dataclasses.replace(opts, resources=check_resources(resources))
        if path is not ... and path != "spawn":
            raise ValueError(
                "path must be 'spawn' on a Ray cluster (a node cannot fork the caller), "
                f"got {path!r}"
            )
        view = object.__new__(RayPrecompileExecutor)
        view._state = self._state
        view._options = opts
        view._parent = self._parent or self  # keeps the executor (and its finalizer) alive
        view._closed = False
        view._tasks = set()
        view._tasks_lock = threading.Lock()
        return view

    @contextlib.contextmanager
    def batch(self) -> Iterator[RayPrecompileExecutor]:
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
        """The nodes taking tasks now: Ray node id (hex) → window (tasks it may hold)."""
        with self._state.lock:
            return {a: n.window for a, n in self._state.nodes.items()}

    def warm_up(self, timeout: float | None = None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node id.

        Raises:
            WorkerStartError: a node's pool could not start (its initializer raised, say).
            TimeoutError: a node's pool was not ready within ``timeout`` seconds.
        """
        state = self._state
        with state.lock:
            if state.broken is not None:
                raise state.broken
            nodes = dict(state.nodes)
        refs = {a: n.actor.warm_up.remote(state.session, timeout) for a, n in nodes.items()}
        pids: dict[str, list[int]] = {}
        for address, ref in refs.items():
            try:
                answer = ray.get(ref, timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"node {address}'s pool was not ready within {timeout}s"
                ) from None
            except Exception as exc:
                raise WorkerStartError(f"node {address} could not start its pool: {exc}") from exc
            if "error" in answer:
                detail = answer["error"]
                raise WorkerStartError(f"node {address} could not start its pool: {detail}")
            pids[address] = list(answer["pids"])
        return pids

    def statistics(self) -> RayExecutorStatistics:
        """Return an immutable snapshot of the queue, the tasks in flight and the nodes."""
        s = self._state
        with s.lock:
            states = [t.state for t in s.in_flight.values()]
            return RayExecutorStatistics(
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
        """Stop taking tasks; when the last one is done, close the nodes' pools (their idle
        workers stay warm in each node actor for the next executor of this process).

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
            state.kill_on_node(task)

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Literal[False]:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupt()
        self.shutdown(wait=True)
        return False


def _abandon(state: _State) -> None:
    with state.lock:
        state.closing = True
        state.poke()
