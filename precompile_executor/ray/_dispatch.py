"""The caller side of ``RayPrecompileExecutor``: its queue, the dispatcher thread, node
placement, and the :class:`RayState` an executor shares with its views (the public layer's
``Backend``, see :mod:`.._base`); tasks run on node-local pools of a Ray cluster.

Data flow::

    submit(fn, *args)                               caller's thread
      │ cloudpickle (fn, args, kwargs) → blob; a failure fails this future only
      ▼
    priority heap ── futures PENDING, cancel() works
      │ dispatcher thread: while a node that has the task's resources has a free slot
      │ (window = its Ray CPUs, capped by max_workers_per_node):
      │ actor.run.remote(session, NodeCall(key, blob, timeout, with_output, memory_limit)) —
      │ still PENDING, cancellable
      ▼
    node actor (one per node, NodeAffinitySchedulingStrategy) ─► session's NodePool: the
      │ node-local PrecompileExecutor (timeouts, memory limits, group kills, crash isolation,
      │ capture, classification) ─── started keys, answered to the long poll actor.starts.remote()
      │                                                ─► dispatcher: future → RUNNING
      ▼
    plain outcome record (bytes, str, numbers) ─► ObjectRef.future() callback (a Ray thread)
      ─► a resolver thread: the result unpickled here, or the RemoteError proxy rebuilt from its
      record ─► future (its done-callbacks); the node's slot is free again

Who owns what: ``RayState.lock`` guards the heap, ``in_flight`` (key → task), the nodes, the
dispatcher's inbox and the counters. A task in flight is resolved by whoever pops it from
``in_flight``: a resolver thread (its outcome, or its actor's failure: NodeLostError), the
dispatcher (its node left the cluster, or its actor failed: NodeLostError) or the thread that
cancelled its future (then the dispatcher kills it on its node). Only the dispatcher thread
places actors and sends calls; the resolver threads (``_cluster_state.RESOLVERS``), handed each
outcome by Ray's callback thread, resolve tasks, and they and Ray's callbacks post what they learnt
of a node to the dispatcher's inbox (``warm_up()`` waits on its own calls in the caller's thread).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Literal

import ray

from .._cluster_plan import departed, has_resources, node_window
from .._cluster_state import ClusterState, ClusterStatistics, ClusterTask
from .._errors import ClusterNodeLost, WorkerStartError
from .._node_pool import TritonCheck
from . import _placement

log = logging.getLogger("precompile_executor.ray")

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


class NodeLostError(ClusterNodeLost):
    """The Ray node (or its node actor) that held the task was lost: the node left the cluster,
    or the actor's process died. The task may be the cause, so it is not run again; other tasks
    go on on the remaining nodes.

    Attributes:
        node: the Ray node id (hex).
    """

    LOST = "Ray node {node} was lost"
    LOG = "raylet log (an OOM kill, a crashed raylet or actor)"


@dataclasses.dataclass(frozen=True)
class RayExecutorStatistics(ClusterStatistics):
    """An immutable snapshot of a :class:`~._executor.RayPrecompileExecutor`, from
    ``statistics()``: the :class:`~precompile_executor.TaskCounts` (``queued``: in the caller's
    queue; ``running``: started on a node; ``crashed`` includes tasks whose node was lost), and

    Attributes:
        dispatched: tasks sent to a node that has not started them yet (PENDING).
        nodes: nodes taking tasks now.
        slots: tasks all nodes may hold at once (the sum of their windows).
        nodes_lost: nodes (or node actors) lost while this executor ran.
        nodes_refused: nodes present now that get no tasks (another Triton than the caller's;
            ``refused_nodes()`` says why).
    """


@dataclasses.dataclass(eq=False)
class RayTask(ClusterTask):
    actor: Any = None
    ref: Any = None  # the run() call's ObjectRef, held until the task is resolved


@dataclasses.dataclass(eq=False)
class RayNode:
    node_id: str
    actor: Any
    window: int
    resources: dict[str, float]
    keys: set[str] = dataclasses.field(default_factory=set)
    polling: Any = None  # the starts() long poll's ObjectRef while one is out


def check_devices_per_node(value: object) -> tuple[int | str, ...] | Literal["auto"] | None:
    """``devices_per_node``: ``PrecompileExecutor``'s ``devices`` for every node, or ``"auto"``."""
    if value == "auto":
        return "auto"
    from .._executor import _check_devices  # the local backend's rule, not the layer's

    try:
        return _check_devices(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("devices", "devices_per_node", 1)) from None


class RayState(ClusterState[RayTask, RayNode, RayExecutorStatistics]):
    """Everything the executor and its ``options()`` views share; see the module docstring."""

    where = "a Ray cluster"
    task_type = RayTask
    statistics_type = RayExecutorStatistics

    def __init__(
        self,
        settings: bytes,
        max_workers_per_node: int | None,
        devices_per_node: tuple[int | str, ...] | Literal["auto"] | None,
        resources: tuple[tuple[str, float], ...],
        triton: TritonCheck | None = None,
    ) -> None:
        super().__init__()
        self.triton = triton  # None: any Triton may join (require_same_triton=False)
        self.present: set[str] = set()  # the node ids the last refresh saw alive
        self.session = f"precompile-executor-{uuid.uuid4().hex[:12]}"
        self.settings = settings
        self.max_workers_per_node = max_workers_per_node
        self.devices_per_node = devices_per_node
        self.resources = dict(resources)
        self.placing: dict[str, RayNode] = {}  # open() sent, not answered
        self.retry_at: dict[str, float] = {}  # node id -> when to try placing again
        self.refreshed = False
        self.thread = threading.Thread(target=self.run, name="precompile-ray-dispatch", daemon=True)

    def node_lost(self, node: str, detail: str) -> BaseException:
        return NodeLostError(node, detail)

    def answered(self, what: str, node_id: str, actor: Any, answer: Future[Any]) -> None:
        """An answer from a node, for the dispatcher (a Ray callback thread)."""
        self.post(functools.partial(self.on_answer, what, node_id, actor, answer))

    # -- the dispatcher thread -------------------------------------------------------------------

    node_poll_s = NODE_POLL_S

    def eligible(self, task: RayTask) -> list[str] | None:
        if not task.opts.resources:
            return None
        wanted = dict(task.opts.resources)
        return [a for a, n in self.nodes.items() if has_resources(n.resources, wanted)]

    def bind(self, task: RayTask, node: RayNode) -> None:
        task.actor = node.actor

    def after_plan(self) -> list[Callable[[], None]]:
        """The long polls for started tasks: one out per node holding tasks (lock held)."""
        polls = [n for n in self.nodes.values() if n.keys and n.polling is None]
        for node in polls:
            node.polling = True  # until poll_starts() stores the call's ObjectRef
        return [functools.partial(self.poll_starts, node) for node in polls]

    def send(self, task: RayTask) -> None:
        try:
            ref = task.actor.run.remote(self.session, task.node_call())
            answer = ref.future()
        except Exception as exc:  # noqa: BLE001 - Ray shut down under us, say: fail this task only
            if self.take(task):
                self.finish(task, exc=RuntimeError(f"Ray refused the task: {exc!r}"))
            return
        task.ref = ref
        answer.add_done_callback(lambda f: self.resolve_later(self.on_outcome, task, f))

    def poll_starts(self, node: RayNode) -> None:
        try:
            ref = node.actor.starts.remote(self.session, STARTS_WAIT_S)
            answer = ref.future()
        except Exception:  # noqa: BLE001 - Ray shut down: the tasks' own answers say the rest
            with self.lock:
                node.polling = None
            return
        with self.lock:
            node.polling = ref
        answer.add_done_callback(lambda f: self.answered("starts", node.node_id, node.actor, f))

    def kill_on_node(self, task: RayTask) -> None:
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
            self.present = set(present)
            for node_id in departed(self.refused, present):
                del self.refused[node_id]
            self.stranded = self.all_refused()
            new = [
                node_id
                for node_id in present
                if node_id not in self.nodes
                and node_id not in self.refused
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
        node = RayNode(node_id, None, window, dict(resources))
        try:
            node.actor = _placement.actor_for(node_id)
            answer = node.actor.open.remote(
                self.session, self.settings, window, devices, self.triton
            ).future()
        except Exception as exc:  # noqa: BLE001 - tried again later
            log.warning("could not place a node actor on Ray node %s: %s", node_id, exc)
            with self.lock:
                self.retry_at[node_id] = time.monotonic() + PLACE_RETRY_S
            return
        with self.lock:
            self.placing[node_id] = node
        answer.add_done_callback(lambda f: self.answered("opened", node_id, node.actor, f))

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
                refusal = None if error is not None else answer.result().get("refused")
                if refusal:
                    self.refuse(node_id, str(refusal))
                    self.stranded = self.all_refused()
                    self.poke()
                    return
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

    def all_refused(self) -> bool:
        """Every node alive was refused: no node can ever take a queued task (lock held)."""
        return bool(self.present) and self.present <= set(self.refused)

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

    def on_outcome(self, task: RayTask, answer: Future[Any]) -> None:
        """The node's answer to ``run()`` (a resolver thread): resolve the task."""
        error = answer.exception()
        if error is not None:
            # run() never raises: this is Ray's (the actor died, its node left). Not re-run.
            if self.take(task):
                self.finish(task, exc=NodeLostError(task.node, repr(error)))
            done: Future[Any] = Future()
            done.set_exception(error)
            self.answered("lost", task.node, task.actor, done)
            return
        if self.take(task):
            self.finish_outcome(task, answer.result())

    def warm_up(self, timeout: float | None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node (caller's thread)."""
        with self.lock:
            if self.broken is not None:
                raise self.broken
            nodes = dict(self.nodes)
        refs = {a: n.actor.warm_up.remote(self.session, timeout) for a, n in nodes.items()}
        pids: dict[str, list[int]] = {}
        for node_id, ref in refs.items():
            try:
                answer = ray.get(ref, timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"node {node_id}'s pool was not ready within {timeout}s"
                ) from None
            except Exception as exc:
                raise WorkerStartError(f"node {node_id} could not start its pool: {exc}") from exc
            if "error" in answer:
                detail = answer["error"]
                raise WorkerStartError(f"node {node_id} could not start its pool: {detail}")
            pids[node_id] = list(answer["pids"])
        return pids
