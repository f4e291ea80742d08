"""What runs on a node (a dask worker process): the dask task function and the control calls.

Threads on a node:

* a dask executor thread runs :func:`run_task` for one task: it hands the pre-pickled call to
  the node's :class:`~._plugin.NodePlugin` pool, reports the start on the executor's event topic
  and blocks until the node-local future resolves;
* the dask worker's event loop runs :func:`describe`, :func:`kill` and :func:`warm_up`
  (through ``Client.run``); none of them blocks the loop;
* the node-local ``PrecompileExecutor``'s own threads own the pool workers, their timeouts,
  group kills, output capture and classification — exactly as on one machine.

Everything that crosses to the caller is a plain :data:`~.._node_pool.Outcome` (bytes, str,
numbers): the scheduler and dask's serialization never meet a user object, a user exception or
Triton. The node pool itself is the backend-neutral :class:`~.._node_pool.NodePool`.
This module imports nothing heavy at import time, so a scheduler can unpickle a task that names
:func:`run_task` without Triton or the user's modules.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from typing import Any

from .._node_pool import NodeCall, Outcome, refused

__all__ = ["DAEMON_MESSAGE", "Outcome", "describe", "is_daemon", "kill", "refused", "run_task"]

DAEMON_MESSAGE = (
    "dask worker processes are daemonic and cannot start the node pool; start the cluster with "
    "distributed.worker.daemon: False (dask.config.set({'distributed.worker.daemon': False}) "
    "before LocalCluster/SpecCluster, or DASK_DISTRIBUTED__WORKER__DAEMON=False for dask worker)"
)


def _plugin(name: str, dask_worker: Any = None) -> Any:
    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    return dask_worker.plugins.get(name)


def run_task(plugin_name: str, node_token: str, call: NodeCall, topic: str) -> Outcome:
    """The dask task: run one call on this node's pool and return its :data:`Outcome`.

    Never raises: a dask task that raised would travel as a pickled exception through dask's
    own (truncating, type-losing) path, and a bad task must never hurt the dask worker.
    """
    try:
        plugin = _plugin(plugin_name)
        if plugin is None:
            return refused("unavailable", f"this dask worker has no {plugin_name!r} plugin")
        if node_token and plugin.token != node_token:
            # The caller sent this to another incarnation of the node (same address, restarted):
            # the task may have run and killed the old one; never run it again blindly.
            return refused("node-changed", "the node restarted since the task was sent to it")
        outcome: Outcome = plugin.run(call, topic)
        return outcome
    except Exception as exc:  # noqa: BLE001 - the contract: never raise
        return refused(
            "unavailable", f"the node could not run the task: {type(exc).__name__}: {exc}"
        )


def describe(plugin_name: str, dask_worker: Any = None) -> dict[str, Any] | None:
    """What the caller needs to know about this node (``Client.run``; on the event loop)."""
    plugin = _plugin(plugin_name, dask_worker)
    if plugin is None or not hasattr(plugin, "token"):
        return None  # registration still under way: the caller asks again at its next refresh
    return {
        "token": plugin.token,
        "window": plugin.window,
        "error": plugin.error,
        "refused": plugin.refusal,
    }


def kill(plugin_name: str, key: str, dask_worker: Any = None) -> bool:
    """Cancel or kill ``key`` on this node (``Client.run``; returns at once, kills in a thread)."""
    plugin = _plugin(plugin_name, dask_worker)
    return bool(plugin is not None and plugin.kill(key))


async def warm_up(plugin_name: str, timeout: float | None, dask_worker: Any = None) -> list[int]:
    """Start this node's pool workers now and return their pids (``Client.run``)."""
    plugin = _plugin(plugin_name, dask_worker)
    if plugin is None:
        raise RuntimeError(f"this dask worker has no {plugin_name!r} plugin")
    pids: list[int] = await asyncio.to_thread(plugin.warm_up, timeout)
    return pids


def is_daemon() -> bool:
    """Whether this process is daemonic (then it cannot start the node pool)."""
    return bool(multiprocessing.current_process().daemon)
