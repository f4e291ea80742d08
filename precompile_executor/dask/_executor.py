"""``DaskPrecompileExecutor``: the public layer (:mod:`.._base`) on a dask cluster.

This module is the dask backend's facade: its settings and their validation and the node plugins
it registers; what every cluster backend shares (the spawn path only, how a call is sent,
``nodes()``, ``warm_up()``, ``statistics()``) is :mod:`.._cluster_executor`'s. The queue, the
dispatcher thread and who owns what are in :mod:`._dispatch` (its :class:`~._dispatch.DaskState` is
the layer's ``Backend``); the node side is in :mod:`._plugin` and :mod:`._node`. Data flow:
``docs/dask.md`` and :mod:`._dispatch`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .._cluster_executor import ClusterExecutor
from .._errors import Classification, WorkerStartError
from . import _node
from ._dispatch import DaskExecutorStatistics, DaskState, NodeLostError
from ._plugin import NodeCleanupPlugin, NodePlugin

__all__ = ["DaskExecutorStatistics", "DaskPrecompileExecutor", "NodeLostError"]

log = logging.getLogger("precompile_executor.dask")


class DaskPrecompileExecutor(ClusterExecutor[DaskExecutorStatistics]):
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
        workers: use only these dask worker addresses (default: every worker, joiners included).
            Tasks wait while none of them is in the cluster; a warning says so at construction.
        require_same_triton: a node whose Triton version differs from this process's (or that
            has Triton where this process has none, or the reverse) is refused when it joins: it
            gets no tasks, a warning is logged, ``refused_nodes()`` says why and
            ``statistics().nodes_refused`` counts it; while every node is refused, tasks fail
            with :class:`~precompile_executor.dask.NodesRefusedError`. ``False`` for work that
            does not compile Triton kernels.
        max_workers_per_node: most tasks one node runs at once; default its dask thread count.
        timeout: as for :class:`~precompile_executor.PrecompileExecutor`, counted from the
            task's start on its node.
        initializer: as for :class:`~precompile_executor.PrecompileExecutor`; runs in each pool
            worker of each node (it must pickle).
        initargs: the initializer's arguments (they must pickle).
        classify: as for :class:`~precompile_executor.PrecompileExecutor`; runs on the node (it
            must pickle).
        memory_limit: as for :class:`~precompile_executor.PrecompileExecutor`, applied by each
            node's pool.

    Raises:
        WorkerStartError: a dask worker is daemonic (it could not start the node pool).
        TypeError: ``client`` is not a synchronous ``distributed.Client`` (a scheduler's
            address, say), or a setting is of the wrong type.
        ValueError: ``client`` is closed, or a setting is out of range.
    """

    WHERE = "a dask cluster"

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
        require_same_triton: bool = True,
    ) -> None:
        _check_client(client)
        options, settings = self.node_settings(
            timeout, initializer, initargs, classify, max_workers_per_node, memory_limit
        )
        triton = self.triton_check(require_same_triton)
        if isinstance(workers, str):
            raise TypeError("workers must be a list of dask worker addresses, not one string")
        daemonic = sorted(a for a, d in client.run(_node.is_daemon).items() if d)
        if daemonic:
            raise WorkerStartError(f"{_node.DAEMON_MESSAGE} (daemonic: {', '.join(daemonic)})")
        name = f"precompile-executor-{uuid.uuid4().hex[:12]}"
        state = DaskState(client, name, frozenset(workers) if workers is not None else None)
        client.subscribe_topic(state.topic, state.on_started)
        client.register_plugin(NodeCleanupPlugin(), name=NodeCleanupPlugin.name)
        client.register_plugin(NodePlugin(name, settings, max_workers_per_node, triton), name=name)
        state.refresh()
        if workers is not None:
            _warn_if_none_present(list(workers), sorted(client.nthreads()))
        state.thread.start()
        super().__init__(state, options)


def _check_client(client: Any) -> None:
    """Refuse what the executor cannot use as its client, saying what to pass instead."""
    from distributed import Client

    if not isinstance(client, Client):
        raise TypeError(
            "client must be a distributed.Client connected to the cluster, e.g. "
            f"Client('tcp://scheduler:8786'); got {type(client).__name__} {client!r:.80}"
        )
    if client.asynchronous:
        raise TypeError("client must be a synchronous distributed.Client (asynchronous=False)")
    if client.status != "running":
        raise ValueError(
            f"the dask client is closed (status {client.status!r}): pass a connected "
            "distributed.Client"
        )


def _warn_if_none_present(named: list[str], present: list[str]) -> None:
    """``workers=`` naming no worker of the cluster: its tasks wait for one to join (as on an
    empty cluster that will scale up), which a mistyped address would make a silent wait."""
    if not set(named) & set(present):
        log.warning(
            "none of the dask workers named in workers= (%s) is in the cluster (present: %s): "
            "tasks wait until one of them joins",
            ", ".join(named) or "none",
            ", ".join(present) or "none",
        )
