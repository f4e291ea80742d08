"""``NodeActor``: the long-lived Ray actor on each node, hosting the node pools of one caller.

One actor per node per caller process (see :mod:`._placement`), placed on its node with Ray's
node-affinity scheduling (``soft=False``: it never moves). Each
:class:`~._executor.RayPrecompileExecutor` of that caller opens a *session* on it: a
:class:`~precompile_executor._node_pool.NodePool` (a node-local ``PrecompileExecutor``) with the
executor's initializer, window and devices, warmed as it opens. Sessions with the same
initializer share the warm workers of this process's pool, as executors do on one machine.

Threads: an async actor, so every method runs on the actor's event loop and none blocks it —
``run`` awaits the node-local future, ``warm_up`` runs in a thread, ``kill`` hands a running
task's kill to a thread (:meth:`NodePool.kill`). The node-local executor's own threads own the
pool workers, their timeouts, group kills, capture and classification.

What crosses to the caller: plain :data:`~precompile_executor._node_pool.Outcome` records
(bytes, str, numbers), lists of keys and pids; calls arrive as
:class:`~precompile_executor._node_pool.NodeCall` records of bytes and numbers. Ray never
unpickles a user object here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from .._node_pool import NodeCall, NodePool, Outcome, TritonCheck, outcome_of, refused

START_POLL_MAX_S = 0.02
"""Longest pause between checks for "the node-local task has started": the start reaches the
caller at most this late, and a task that ends first needs no start report at all."""


class _Session:
    """One executor's pool on this node and the starts not yet reported to its caller."""

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool
        self.started: list[str] = []
        self.changed = asyncio.Event()


class NodeActor:
    """Hosts node-local pools, one per executor session (see the module docstring)."""

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}

    def describe(self) -> dict[str, Any]:
        """This actor's process id and node (the caller's check that it landed where asked)."""
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    async def open(
        self,
        session: str,
        settings: bytes,
        window: int,
        devices: Sequence[int | str] | None,
        triton: TritonCheck | None = None,
    ) -> dict[str, Any]:
        """Create the session's node pool (it warms itself in the background); idempotent.

        With ``triton`` (the caller's ``require_same_triton``), a node whose Triton differs from
        the caller's is refused: no pool, and ``{"refused": why}`` tells the caller.
        """
        if triton is not None:
            import ray

            why = triton.refusal(ray.get_runtime_context().get_node_id())
            if why is not None:
                return {"pid": os.getpid(), "window": window, "error": why, "refused": why}
        existing = self.sessions.get(session)
        if existing is None:
            existing = self.sessions[session] = _Session(NodePool(settings, window, devices))
        return {"pid": os.getpid(), "window": existing.pool.window, "error": existing.pool.error}

    async def run(self, session: str, call: NodeCall) -> Outcome:
        """Run one pre-pickled call on the session's pool; return its outcome. Never raises."""
        key = call.key
        try:
            entry = self.sessions.get(session)
            if entry is None:
                return refused("unavailable", "the executor's pool on this node is closed")
            local = entry.pool.submit(call)
            if not isinstance(local, Future):
                return local
            try:
                done = asyncio.wrap_future(local)
                pause = 0.0005
                # Wake at once when it ends, else at growing pauses to see it start.
                while not local.running() and not local.done():
                    await asyncio.wait([done], timeout=pause)
                    pause = min(pause * 2, START_POLL_MAX_S)
                if local.running():
                    entry.started.append(key)
                    entry.changed.set()
                await asyncio.wait([done])
                if not done.cancelled():
                    done.exception()  # retrieved: outcome_of reads it from the node's future
                return outcome_of(local, call.with_output)
            finally:
                entry.pool.release(key)
        except Exception as exc:  # noqa: BLE001 - the contract: never raise
            return refused(
                "unavailable", f"the node could not run the task: {type(exc).__name__}: {exc}"
            )

    async def starts(self, session: str, wait_s: float) -> list[str] | None:
        """The keys started since the last call, waiting up to ``wait_s`` for one (a long poll).

        ``None`` once the session is closed. A lost answer only delays ``running()`` in the
        caller: the outcome resolves the task anyway.
        """
        entry = self.sessions.get(session)
        if entry is None:
            return None
        if not entry.started:
            try:
                await asyncio.wait_for(entry.changed.wait(), wait_s)
            except TimeoutError:  # asyncio.wait_for raises the builtin (3.11+)
                pass
        entry.changed.clear()
        keys, entry.started = entry.started, []
        return keys if session in self.sessions else None

    def kill(self, session: str, key: str) -> bool:
        """Cancel ``key`` if queued in the pool, else kill its worker's group; returns at once."""
        entry = self.sessions.get(session)
        return entry is not None and entry.pool.kill(key)

    async def warm_up(self, session: str, timeout: float | None) -> dict[str, Any]:
        """Start every pool worker of the session now: ``{"pids": [...]}`` or ``{"error": str}``
        (a record, not a raised exception: the caller never unpickles one from here)."""
        entry = self.sessions.get(session)
        if entry is None:
            return {"error": "the executor's pool on this node is closed"}
        try:
            return {"pids": await asyncio.to_thread(entry.pool.warm_up, timeout)}
        except Exception as exc:  # noqa: BLE001 - the initializer's error, a timeout
            return {"error": f"{type(exc).__name__}: {exc}"}

    def close(self, session: str) -> None:
        """Close the session's pool; its idle workers stay warm in this process for the next."""
        entry = self.sessions.pop(session, None)
        if entry is not None:
            entry.pool.close()
            entry.changed.set()  # a waiting starts() returns None now
