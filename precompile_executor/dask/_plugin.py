"""``NodePlugin``: the ``WorkerPlugin`` that gives each dask worker its node-local pool.

Registered by the caller's :class:`~._executor.DaskPrecompileExecutor` (dask sends it to every
worker, and to workers that join later). On each node:

* ``setup`` (the worker's event loop) checks that the node has the caller's Triton (with
  ``require_same_triton``: a node with another one is *refused*, builds no pool and tells the
  caller why through :func:`._node.describe`), then builds the node's
  :class:`~.._node_pool.NodePool` (a node-local ``PrecompileExecutor`` with ``max_workers`` =
  the node's window, warming itself in a background thread);
* ``run`` (a dask executor thread, from :func:`._node.run_task`) submits one pre-pickled call,
  tells the caller when it really starts, waits for it and turns the result into an outcome;
* ``kill`` (the event loop, from ``Client.run``) cancels a task not yet started on the node, or
  hands the kill of a running one to a thread: the loop never blocks;
* ``teardown`` shuts the node-local executor down; its idle workers stay warm in the dask
  worker's process-wide pool for the next executor with the same initializer.

:class:`NodeCleanupPlugin` (one per cluster, never unregistered) stops those pools when the dask
worker closes: a dask worker is a ``multiprocessing`` child, which joins its non-daemonic
children and skips ``atexit`` hooks on exit, so warm pool workers would hold it until the nanny's
kill.

The plugin holds only bytes and numbers until ``setup``: the scheduler stores it unopened.
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import Future
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .._node_pool import NodeCall, NodePool, Outcome, TritonCheck, outcome_of, refused
from ._node import DAEMON_MESSAGE, is_daemon
from ._plan import node_window

log = logging.getLogger("precompile_executor.dask")

START_POLL_MAX_S = 0.02
"""Longest pause between checks for "the node-local task has started": the start reaches the
caller at most this late, and a task that ends first needs no start report at all."""


class NodePlugin(WorkerPlugin):
    """Hosts one node-local ``PrecompileExecutor`` in a dask worker (see the module docstring)."""

    def __init__(
        self,
        name: str,
        settings: bytes,
        max_workers_per_node: int | None,
        triton: TritonCheck | None = None,
    ) -> None:
        self.name = name
        self._settings = settings  # cloudpickled (initializer, initargs, classify)
        self._max_workers_per_node = max_workers_per_node
        self._triton = triton  # None: any Triton may join (require_same_triton=False)

    # -- lifecycle (the worker's event loop) -----------------------------------------------------

    def setup(self, worker: Any) -> None:
        """Build the node pool (it warms itself in the background); never raises."""
        self.token = uuid.uuid4().hex
        self.window = node_window(worker.state.nthreads, self._max_workers_per_node)
        self.pool: NodePool | None = None
        self.error: str | None = None
        self.refusal = None if self._triton is None else self._triton.refusal(worker.address)
        if self.refusal is not None:
            self.error = self.refusal
            log.warning("%s", self.refusal)
            return
        if is_daemon():
            self.error = DAEMON_MESSAGE
            log.error("%s", DAEMON_MESSAGE)
            return
        self.pool = NodePool(self._settings, self.window)
        self.error = self.pool.error

    @property
    def executor(self) -> Any:
        """The node-local ``PrecompileExecutor`` (None if the pool could not start)."""
        pool = getattr(self, "pool", None)
        return None if pool is None else pool.executor

    def teardown(self, worker: Any) -> None:
        """Stop the node-local executor; its idle workers stay warm in this process's pool."""
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()

    # -- tasks (dask executor threads) -----------------------------------------------------------

    def warm_up(self, timeout: float | None) -> list[int]:
        """Start every pool worker of this node now; return their pids (a thread, not the loop)."""
        if self.pool is None:
            raise RuntimeError(self.error or "the node pool is not available")
        return self.pool.warm_up(timeout)

    def run(self, call: NodeCall, topic: str) -> Outcome:
        """Run one pre-pickled call on the node-local pool; return its outcome. Never raises."""
        if self.pool is None:
            return refused("unavailable", self.error or "the node pool is not available")
        local = self.pool.submit(call)
        if not isinstance(local, Future):
            return local
        try:
            self._report_start(local, call.key, topic)
            return outcome_of(local, call.with_output)
        finally:
            self.pool.release(call.key)

    def _report_start(self, local: Future[Any], key: str, topic: str) -> None:
        """Tell the caller when the node-local pool really starts the task (not when dask did)."""
        pause = 0.0005
        while not local.running() and not local.done():
            time.sleep(pause)
            pause = min(pause * 2, START_POLL_MAX_S)
        if local.running():
            from distributed import get_worker

            get_worker().log_event(topic, {"key": key})

    def kill(self, key: str) -> bool:
        """Cancel ``key`` if queued on this node, else kill its pool worker's group (a thread)."""
        return self.pool is not None and self.pool.kill(key)


class NodeCleanupPlugin(WorkerPlugin):
    """Stops every node pool of this dask worker when the worker closes (see the docstring)."""

    name = "precompile-executor-cleanup"
    idempotent = True

    def teardown(self, worker: Any) -> None:
        """Kill the pools' running tasks and stop their idle workers."""
        from precompile_executor import stop_idle_workers

        for plugin in list(worker.plugins.values()):
            executor = getattr(plugin, "executor", None) if isinstance(plugin, NodePlugin) else None
            if executor is not None:
                executor.kill_workers()
        stop_idle_workers()
