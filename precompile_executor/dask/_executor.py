"""``DaskPrecompileExecutor``: the public layer (:mod:`.._base`) on a dask cluster.

This module is the dask backend's facade: its settings and their validation, the node plugins
it registers, how a call is sent (cloudpickled as a whole: a node cannot fork the caller), and
``nodes()``, ``warm_up()``, ``statistics()``. The queue, the dispatcher thread and who owns what
are in :mod:`._dispatch` (its :class:`~._dispatch.State` is the layer's ``Backend``); the node
side is in :mod:`._plugin` and :mod:`._node`. Data flow: ``docs/dask.md`` and :mod:`._dispatch`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import cloudpickle

from .._base import BaseExecutor, Call, Path, TaskOptions
from .._errors import Classification, WorkerStartError
from .._validate import check_count, check_initializer, check_memory_limit, check_timeout
from . import _node
from ._dispatch import DaskExecutorStatistics, NodeLostError, State
from ._plugin import NodeCleanupPlugin, NodePlugin

__all__ = ["DaskExecutorStatistics", "DaskPrecompileExecutor", "NodeLostError"]


class DaskPrecompileExecutor(BaseExecutor[State]):
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
        memory_limit: bytes a task's process group may hold on its node, enforced by the node's
            pool as :class:`~precompile_executor.PrecompileExecutor` does (past it the group is
            killed and the task fails alone with ``TaskMemoryError``); ``None``: no limit.
            Per call: ``options(memory_limit=...)``.

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
        memory_limit: int | None = None,
    ) -> None:
        check_initializer(initializer, initargs, classify)
        check_count(max_workers_per_node, "max_workers_per_node", 1, optional=True)
        if isinstance(workers, str):
            raise TypeError("workers must be a list of dask worker addresses, not one string")
        options = TaskOptions(check_timeout(timeout), memory_limit=check_memory_limit(memory_limit))
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
        state = State(client, name, frozenset(workers) if workers is not None else None)
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

    def _check_memory_limit(self, value: object) -> int | None:
        """``memory_limit``: each node's pool enforces it (see the constructor)."""
        return check_memory_limit(value)

    # -- sending a task (the layer's _send) ------------------------------------------------------

    def _send(
        self, opts: TaskOptions, calls: list[Call], *, chunked: bool, prepared: Any
    ) -> Future[Any]:
        return self._backend.submit_call(calls[0], opts, "a dask cluster")

    # -- the nodes -------------------------------------------------------------------------------

    def nodes(self) -> dict[str, int]:
        """The nodes taking tasks now: dask worker address → window (tasks it may hold)."""
        return self._backend.windows()

    def warm_up(self, timeout: float | None = None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node.

        Raises:
            WorkerStartError: a node's pool could not start (its initializer raised, say).
        """
        return self._backend.warm_up(timeout)

    def statistics(self) -> DaskExecutorStatistics:
        """Return an immutable snapshot of the queue, the tasks in flight and the nodes."""
        return self._backend.statistics()
