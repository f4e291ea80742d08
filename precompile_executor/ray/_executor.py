"""``RayPrecompileExecutor``: the public layer (:mod:`.._base`) on a Ray cluster.

This module is the Ray backend's facade: its settings and their validation, joining Ray, how a
call is sent (cloudpickled as a whole: a node cannot fork the caller), the ``resources`` option,
and ``nodes()``, ``warm_up()``, ``statistics()``. The queue, the dispatcher thread, node
placement and who owns what are in :mod:`._dispatch` (its :class:`~._dispatch.State` is the
layer's ``Backend``); the node side is in :mod:`._actor` and :mod:`.._node_pool`. Data flow:
``docs/ray.md`` and :mod:`._dispatch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Literal, Self

import cloudpickle
import ray

from .._base import BaseExecutor, Call, Path, TaskOptions
from .._errors import Classification
from .._validate import check_count, check_initializer, check_memory_limit, check_timeout
from ._dispatch import (
    PLACE_TIMEOUT_S,
    RayExecutorStatistics,
    RayTaskOptions,
    State,
    check_devices_per_node,
    check_resources,
)

__all__ = ["RayPrecompileExecutor"]


class RayPrecompileExecutor(BaseExecutor[State]):
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
        memory_limit: bytes a task's process group may hold on its node, enforced by the node's
            pool as :class:`~precompile_executor.PrecompileExecutor` does (past it the group is
            killed and the task fails alone with ``TaskMemoryError``); ``None``: no limit.
            Per call: ``options(memory_limit=...)``.

    Raises:
        ValueError, TypeError: a setting is out of range or of the wrong type.
    """

    CHUNKS = False

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
    ) -> None:
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a string or None, got {address!r}")
        check_initializer(initializer, initargs, classify)
        check_count(max_workers_per_node, "max_workers_per_node", 1, optional=True)
        devices = check_devices_per_node(devices_per_node)
        node_filter = check_resources(resources)
        options = RayTaskOptions(
            check_timeout(timeout), memory_limit=check_memory_limit(memory_limit)
        )
        try:
            settings = cloudpickle.dumps((initializer, initargs, classify))
        except Exception as exc:
            raise TypeError(
                f"initializer, initargs and classify must be picklable for the nodes: {exc}"
            ) from exc
        if not ray.is_initialized():
            ray.init(address=address)
        state = State(settings, max_workers_per_node, devices, node_filter)
        state.thread.start()
        state.wait_placed(PLACE_TIMEOUT_S)
        super().__init__(state, options)

    def _check_path(self, value: object) -> Path:
        if value != "spawn":
            raise ValueError(
                "path must be 'spawn' on a Ray cluster (a node cannot fork the caller), "
                f"got {value!r}"
            )
        return "spawn"

    def _check_memory_limit(self, value: object) -> int | None:
        """``memory_limit``: each node's pool enforces it (see the constructor)."""
        return check_memory_limit(value)

    def options(
        self,
        *,
        timeout: float | None | object = ...,
        path: Path | object = ...,
        priority: float | object = ...,
        with_output: bool | object = ...,
        cost: float | None | object = ...,
        memory_limit: int | None | object = ...,
        resources: Mapping[str, float] | None | object = ...,
    ) -> Self:
        """Return a view with other per-task settings; it shares the queue and the nodes.

        Args:
            timeout: per-task timeout in seconds (``None``: none), counted on the node.
            path: only ``"spawn"``: a node cannot fork the caller's memory.
            priority: higher starts first among queued tasks; ties keep submission order.
            with_output: results come back as :class:`~precompile_executor.TaskResult`.
            cost: a hint, the seconds a call is expected to take: among equal priorities the
                longest starts first (this executor keeps no history; ``None``: no hint).
            memory_limit: bytes the task's process group may hold on its node (``None``: no
                limit), enforced by the node's pool.
            resources: the task goes only to nodes whose Ray resources cover these amounts
                (``{"GPU": 1}``: a GPU node); a filter, nothing is reserved.
        """
        wanted = None if resources is ... else check_resources(resources)
        view = super().options(
            timeout=timeout,
            path=path,
            priority=priority,
            with_output=with_output,
            cost=cost,
            memory_limit=memory_limit,
        )
        if wanted is not None:  # the view is new: nobody else holds it yet
            opts = view._options
            assert isinstance(opts, RayTaskOptions)  # built by __init__ and options() only
            view._options = dataclasses.replace(opts, resources=wanted)
        return view

    # -- sending a task (the layer's _send) ------------------------------------------------------

    def _send(
        self, opts: TaskOptions, calls: list[Call], *, chunked: bool, prepared: Any
    ) -> Future[Any]:
        assert isinstance(opts, RayTaskOptions)  # built by __init__ and options() only
        return self._backend.submit_call(calls[0], opts, "a Ray cluster")

    # -- the nodes -------------------------------------------------------------------------------

    def nodes(self) -> dict[str, int]:
        """The nodes taking tasks now: Ray node id (hex) → window (tasks it may hold)."""
        return self._backend.windows()

    def warm_up(self, timeout: float | None = None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node id.

        Raises:
            WorkerStartError: a node's pool could not start (its initializer raised, say).
            TimeoutError: a node's pool was not ready within ``timeout`` seconds.
        """
        return self._backend.warm_up(timeout)

    def statistics(self) -> RayExecutorStatistics:
        """Return an immutable snapshot of the queue, the tasks in flight and the nodes."""
        return self._backend.statistics()
