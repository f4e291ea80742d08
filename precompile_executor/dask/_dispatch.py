"""The caller side of ``DaskPrecompileExecutor``: its queue, the dispatcher thread, and the
:class:`DaskState` an executor shares with its views (the public layer's ``Backend``, see
:mod:`.._base`); tasks run on node-local pools of a dask cluster.

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
    plain outcome (bytes, str, numbers) ─► dask callback thread ─► a resolver thread: outcome
      fetched, result unpickled here or the RemoteError proxy rebuilt from its record ─► future
      (its done-callbacks, e.g. a compile's files installed); the node's slot is free again

Who owns what: the caller's lock guards the heap, ``in_flight`` (key → task), the nodes and the
counters. A task in flight is resolved by whoever pops it from ``in_flight``: a resolver thread
(an outcome), the dispatcher (its node left: :class:`NodeLostError`) or the thread that
cancelled its future (then the dispatcher kills it on its node). Only the dispatcher thread
talks to dask in blocking calls (``submit``, ``cancel``, ``run``, ``nthreads``); the client's IO
loop thread only marks futures running; the dask callback thread only hands finished tasks to
the resolver threads, which fetch outcomes and resolve futures (``_cluster_state.RESOLVERS``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Any

from .._cluster_state import ClusterState, ClusterStatistics, ClusterTask
from .._errors import ClusterNodeLost, WorkerStartError
from . import _node
from ._plan import departed

log = logging.getLogger("precompile_executor.dask")

NODE_POLL_S = 0.2
"""How often the dispatcher asks the scheduler which nodes exist: a lost node's tasks fail, and
a new node gets tasks, at most this much later than the scheduler knows."""

FETCH_POLL_S = 0.5
"""The callback thread fetches an outcome in steps this long, giving up once the task is
resolved otherwise (its node died after finishing, before the outcome could be fetched)."""


class NodeLostError(ClusterNodeLost):
    """The dask worker (node) that held the task left the cluster: its process died or was
    removed. The task may be the cause, so it is not run again; other tasks go on elsewhere.

    Attributes:
        node: the dask worker's address.
    """

    LOST = "dask worker {node} left the cluster"
    LOG = "log (an OOM kill, a crashed dask worker)"


@dataclasses.dataclass(frozen=True)
class DaskExecutorStatistics(ClusterStatistics):
    """An immutable snapshot of a :class:`DaskPrecompileExecutor`, from ``statistics()``: the
    :class:`~precompile_executor.TaskCounts` (``queued``: in the caller's queue; ``running``:
    started on a node), and

    Attributes:
        dispatched: tasks sent to a node that has not started them yet (PENDING).
        nodes: dask workers taking tasks now.
        slots: tasks all nodes may hold at once (the sum of their windows).
        nodes_lost: nodes that left while this executor ran.
        nodes_refused: dask workers present now that get no tasks (another Triton than the
            caller's; ``refused_nodes()`` says why).
    """


@dataclasses.dataclass(eq=False)
class DaskTask(ClusterTask):
    token: str = ""
    dask_future: Any = None


@dataclasses.dataclass(eq=False)
class DaskNode:
    address: str
    token: str
    window: int
    keys: set[str] = dataclasses.field(default_factory=set)


class DaskState(ClusterState[DaskTask, DaskNode, DaskExecutorStatistics]):
    """Everything the executor and its ``options()`` views share; see the module docstring."""

    where = "a dask cluster"
    task_type = DaskTask
    statistics_type = DaskExecutorStatistics

    def __init__(self, client: Any, plugin_name: str, workers: frozenset[str] | None) -> None:
        super().__init__()
        self.client = client
        self.plugin_name = plugin_name
        self.topic = f"{plugin_name}-started"
        self.only = workers
        self.thread = threading.Thread(
            target=self.run, name="precompile-dask-dispatch", daemon=True
        )

    # -- the dispatcher thread -------------------------------------------------------------------

    node_poll_s = NODE_POLL_S

    def bind(self, task: DaskTask, node: DaskNode) -> None:
        task.token = node.token

    def send(self, task: DaskTask) -> None:
        try:
            fut = self.client.submit(
                _node.run_task,
                self.plugin_name,
                task.token,
                task.node_call(),
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
        fut.add_done_callback(lambda f: self.resolve_later(self.on_dask_done, task, f))

    def node_lost(self, node: str, detail: str) -> BaseException:
        return NodeLostError(node, detail)

    def withdraw(self, task: DaskTask) -> None:
        """Its future was cancelled: dask cancels the dask task, the node cancels or kills it."""
        if task.dask_future is not None:
            with contextlib.suppress(Exception):
                task.dask_future.cancel()
        self.kill_on_node(task)

    def kill_on_node(self, task: DaskTask) -> None:
        """Stop ``task`` on its node: dask forgets it, the node cancels or kills it."""
        task.dask_future = None
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
        with self.lock:
            for address in departed(self.refused, present):
                del self.refused[address]  # a node joining at that address is asked again
            new = [a for a in present if a not in self.nodes and a not in self.refused]
        found: dict[str, Any] = {}
        if new:
            try:
                found = self.client.run(
                    _node.describe, self.plugin_name, workers=new, on_error="return"
                )
            except Exception:  # noqa: BLE001 - asked again at the next refresh
                found = {}
        lost: list[tuple[str, DaskTask]] = []
        with self.lock:
            for address, info in found.items():
                if isinstance(info, dict) and address in present:
                    if info.get("refused"):
                        self.refuse(address, str(info["refused"]))
                    else:
                        self.nodes[address] = DaskNode(address, info["token"], int(info["window"]))
            for address in departed(self.nodes, present):
                node = self.nodes.pop(address)
                self.nodes_lost += 1
                for key in node.keys:
                    task = self.in_flight.pop(key, None)
                    if task is not None:
                        lost.append((address, task))
            # Every node present refused (none still unanswered): queued tasks fail, not wait.
            self.stranded = bool(present) and set(present) <= set(self.refused)
            if found or lost or self.stranded:
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

    def on_dask_done(self, task: DaskTask, fut: Any) -> None:
        """The dask task finished (a resolver thread): fetch the outcome, resolve."""
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

    def warm_up(self, timeout: float | None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node."""
        with self.lock:
            addresses = list(self.nodes)
        results = self.client.run(
            _node.warm_up, self.plugin_name, timeout, workers=addresses, on_error="return"
        )
        for address, got in results.items():
            if isinstance(got, BaseException):
                raise WorkerStartError(f"node {address} could not start its pool: {got}") from got
        return {a: list(p) for a, p in results.items()}
