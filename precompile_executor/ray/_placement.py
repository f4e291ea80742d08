"""Where the node actors live: one :class:`~._actor.NodeActor` per node for this caller process.

Process-wide, shared by every :class:`~._executor.RayPrecompileExecutor` of this process (each
opens its own session on the actor), so a second executor finds its nodes placed and, with the
same initializer, their pools warm — as a second ``PrecompileExecutor`` does on one machine.

* :func:`actor_for` places an actor on a node the first time it is asked for (Ray's
  ``NodeAffinitySchedulingStrategy(node_id, soft=False)``: pinned, never moved, never restarted
  — ``max_restarts=0``, ``max_task_retries=0`` — so Ray never re-runs a task elsewhere).
* :func:`retire` forgets and kills an actor that failed (its node was lost, or its process
  died); the next :func:`actor_for` for a node that is still alive places a new one.

The actors are owned by this process's Ray driver: they end with it (``ray.shutdown()`` or
exit), and their pool workers with them. Actors of an earlier Ray session (``ray.shutdown()``
then ``ray.init()``) are forgotten. Any thread may call these; ``_lock`` guards ``_actors``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._actor import NodeActor

ACTOR_CONCURRENCY = 100_000
"""Calls one node actor may serve at once (it is async: calls wait on its event loop, not on
threads): every in-flight task of every session plus one long poll per session, far above any
node's window."""

_RemoteNodeActor: Any = ray.remote(NodeActor)

_lock = threading.Lock()
_actors: dict[tuple[str, str], Any] = {}  # (driver, node id) -> actor handle


def _driver() -> str:
    """This driver in this Ray session. The cluster's session name is part of it: a new
    cluster's first job (and its driver's worker id) repeats the previous cluster's."""
    context = ray.get_runtime_context()
    return f"{context.get_session_name()}/{context.get_job_id()}"


def actor_for(node_id: str) -> Any:
    """This process's actor on ``node_id``, placed now if there is none."""
    driver = _driver()
    with _lock:
        for key in [k for k in _actors if k[0] != driver]:
            del _actors[key]  # from an earlier ray.init(): its actors died with that session
        handle = _actors.get((driver, node_id))
        if handle is None:
            handle = _RemoteNodeActor.options(
                num_cpus=0,
                max_restarts=0,
                max_task_retries=0,
                max_concurrency=ACTOR_CONCURRENCY,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
            _actors[(driver, node_id)] = handle
        return handle


def retire(node_id: str, handle: Any) -> None:
    """Forget ``handle`` as ``node_id``'s actor (if it still is) and kill it."""
    with _lock:
        for key, known in list(_actors.items()):
            if key[1] == node_id and known is handle:
                del _actors[key]
    with contextlib.suppress(Exception):  # already dead, or Ray is shutting down
        ray.kill(handle, no_restart=True)


def node_actors() -> dict[str, Any]:
    """This process's node actors in the current Ray session: node id (hex) -> actor handle.

    ``ray.get(handle.describe.remote())`` gives the actor's ``pid`` and ``node_id``.
    """
    driver = _driver()
    with _lock:
        return {node: h for (d, node), h in _actors.items() if d == driver}
