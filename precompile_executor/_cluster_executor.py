"""The facade every cluster backend shares (``dask/``, ``ray/``): :class:`ClusterExecutor`.

A cluster changes the public layer (:mod:`._base`) the same way on every cluster: the settings
go to the nodes (validated once here and pickled once for all of them), a task takes only the
spawn path (a node cannot fork the caller), ``memory_limit`` is enforced by each node's pool,
``map`` sends each call as its own task, and a call is sent as
:meth:`._cluster_state.ClusterState.submit_call`. A backend's subclass adds its constructor
(joining its cluster, building its ``State``), names its cluster in :attr:`ClusterExecutor.WHERE`
and may take more per-task options (the Ray backend's ``resources``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ClassVar

import cloudpickle

from ._base import BaseExecutor, Call, Path, TaskOptions, handoff
from ._cluster_state import ClusterState, S
from ._errors import Classification
from ._node_pool import TritonCheck, triton_version
from ._validate import (
    check_count,
    check_flag,
    check_initializer,
    check_memory_limit,
    check_timeout,
)


class ClusterExecutor(BaseExecutor[ClusterState[Any, Any, S]]):
    """Runs callables on node-local ``PrecompileExecutor`` pools of a cluster (the shared part
    of ``DaskPrecompileExecutor`` and ``RayPrecompileExecutor``; see the module docstring)."""

    CHUNKS = False
    WHERE: ClassVar[str]
    """The cluster, in messages: ``"a dask cluster"``."""

    @staticmethod
    def node_settings(
        timeout: float | None,
        initializer: Callable[..., object] | None,
        initargs: tuple[Any, ...],
        classify: Callable[[BaseException], Classification] | None,
        max_workers_per_node: int | None,
        memory_limit: int | None,
    ) -> tuple[TaskOptions, bytes]:
        """Validate the settings every cluster backend takes; return the executor's
        :class:`TaskOptions` and the pickled ``(initializer, initargs, classify)`` each node's
        pool is built from."""
        check_initializer(initializer, initargs, classify)
        check_count(max_workers_per_node, "max_workers_per_node", 1, optional=True)
        options = TaskOptions(check_timeout(timeout), memory_limit=check_memory_limit(memory_limit))
        try:
            settings = cloudpickle.dumps((initializer, initargs, classify))
        except Exception as exc:
            raise TypeError(
                f"initializer, initargs and classify must be picklable for the nodes: {exc}"
            ) from exc
        return options, settings

    @staticmethod
    def triton_check(require_same_triton: object) -> TritonCheck | None:
        """What a node must have to join: this process's Triton version (``None``: any node
        joins, ``require_same_triton=False``)."""
        if not check_flag(require_same_triton, "require_same_triton"):
            return None
        return TritonCheck(triton_version())

    def _check_path(self, value: object) -> Path:
        if value != "spawn":
            raise ValueError(
                f"path must be 'spawn' on {self.WHERE} (a node cannot fork the caller), "
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
        return self._backend.submit_call(calls[0], opts, self.WHERE)

    # -- the nodes -------------------------------------------------------------------------------

    def nodes(self) -> dict[str, int]:
        """The nodes taking tasks now: node (a dask worker's address, a Ray node id in hex) →
        window (tasks it may hold). A refused node is not among them (``refused_nodes()``)."""
        return self._backend.windows()

    def refused_nodes(self) -> dict[str, str]:
        """The nodes present now that get no tasks, node → why: each has another Triton than
        this process (``require_same_triton``; the message names both versions)."""
        return self._backend.refused_nodes()

    def warm_up(self, timeout: float | None = None) -> dict[str, list[int]]:
        """Start every node's pool workers now; return their pids per node.

        Raises:
            WorkerStartError: a node's pool could not start (its initializer raised, say).
            TimeoutError: a node's pool was not ready within ``timeout`` seconds (where the
                backend waits for each node: Ray; a dask node's timeout fails it as above).
        """
        with handoff.holding():  # the nodes' answers reach a caller that may be busy
            return self._backend.warm_up(timeout)

    def statistics(self) -> S:
        """Return an immutable snapshot of the queue, the tasks in flight and the nodes."""
        return self._backend.statistics()
