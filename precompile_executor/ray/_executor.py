"""``RayPrecompileExecutor``: the public layer (:mod:`.._base`) on a Ray cluster.

This module is the Ray backend's facade: its settings and their validation, joining Ray and the
``resources`` option; what every cluster backend shares (the spawn path only, how a call is
sent, ``nodes()``, ``warm_up()``, ``statistics()``) is :mod:`.._cluster_executor`'s. The queue,
the dispatcher thread, node placement and who owns what are in :mod:`._dispatch` (its
:class:`~._dispatch.RayState` is the layer's ``Backend``); the node side is in :mod:`._actor` and
:mod:`.._node_pool`. Data flow: ``docs/ray.md`` and :mod:`._dispatch`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import ray

from .._cluster_executor import ClusterExecutor
from .._errors import Classification
from .._validate import check_resources
from ._dispatch import PLACE_TIMEOUT_S, RayExecutorStatistics, RayState, check_devices_per_node

__all__ = ["RayPrecompileExecutor"]


class RayPrecompileExecutor(ClusterExecutor[RayExecutorStatistics]):
    """Runs callables on node-local ``PrecompileExecutor`` pools of a Ray cluster.

    Each Ray node gets one long-lived actor (placed on it with node-affinity scheduling, and
    re-placed as nodes join and leave) that hosts this executor's node pool: warm worker
    processes with per-task timeouts that kill the task's process group, crash isolation,
    captured output and classification, exactly as
    :class:`~precompile_executor.PrecompileExecutor` on one machine. This executor keeps its own
    priority queue and sends each node at most its window of tasks; futures are standard
    ``concurrent.futures.Future`` objects, PENDING (and cancellable) until a node's pool really
    starts the task. ``map`` sends each call as its own task whatever ``chunksize`` says;
    ``options(path=)`` takes only ``"spawn"``.

    Args:
        address: the cluster to join when Ray is not initialized in this process yet (passed to
            ``ray.init``; ``None``: ``RAY_ADDRESS``, else a running local cluster, else a new
            one). An initialized Ray is used as it is.
        max_workers_per_node: most tasks one node runs at once; default its Ray ``CPU`` count.
        devices_per_node: pin each node's pool workers to these of its GPUs (``devices`` of
            ``PrecompileExecutor``: ``CUDA_VISIBLE_DEVICES`` per worker, spread evenly), or
            ``"auto"``: every GPU Ray counts on that node. ``None``: no pinning.
        resources: use only nodes whose Ray resources cover these amounts (``{"GPU": 1}``: GPU
            nodes). Nothing is reserved: the window bounds what runs on a node. Per task:
            ``options(resources=...)``.
        require_same_triton: a node whose Triton version differs from this process's (or that
            has Triton where this process has none, or the reverse) is refused when its actor
            opens this executor's pool: it gets no tasks, a warning is logged,
            ``refused_nodes()`` says why and ``statistics().nodes_refused`` counts it; while
            every node is refused, tasks fail with
            :class:`~precompile_executor.ray.NodesRefusedError`. ``False`` for work that does
            not compile Triton kernels.
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
        ValueError, TypeError: a setting is out of range or of the wrong type.
        ConnectionError: nothing accepts a connection at ``address`` within
            :data:`CONNECT_TIMEOUT_S` (``ray.init`` itself would retry it for minutes).
    """

    WHERE = "a Ray cluster"

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
        memory_limit: int | None = None,
        require_same_triton: bool = True,
    ) -> None:
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a string or None, got {address!r}")
        options, settings = self.node_settings(
            timeout, initializer, initargs, classify, max_workers_per_node, memory_limit
        )
        devices = check_devices_per_node(devices_per_node)
        node_filter = check_resources(resources)
        triton = self.triton_check(require_same_triton)
        if not ray.is_initialized():
            if address is not None:
                check_reachable(address)
            ray.init(address=address)
        state = RayState(settings, max_workers_per_node, devices, node_filter, triton)
        state.thread.start()
        state.wait_placed(PLACE_TIMEOUT_S)
        super().__init__(state, options)

    def _check_resources(self, value: object) -> tuple[tuple[str, float], ...]:
        """``options(resources=...)``: the task goes only to nodes whose Ray resources cover
        these amounts (``{"GPU": 1}``: a GPU node); a filter, nothing is reserved."""
        return check_resources(value)


CONNECT_TIMEOUT_S = 10.0
"""How long :func:`check_reachable` tries to open a connection to a cluster's address."""


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ``ConnectionError`` unless something accepts a TCP connection at ``address``
    (``host:port`` or ``ray://host:port``; ``"auto"``, ``"local"`` and other forms pass).

    ``ray.init(address=...)`` retries an address nobody listens on for minutes, logging as it
    goes; this asks once, within ``timeout_s``, and says what to do.
    """
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(
            f"cannot reach the Ray cluster at {address} ({exc}): start its head there "
            "(`ray start --head`), or pass address=None to join the cluster ray.init() finds "
            "or start a local one"
        ) from exc
