"""Pure scheduling decisions of the caller side: node windows and where the next task goes.

No locks, no dask, no processes: the executor calls these with its lock held and the tests call
them with plain dictionaries.
"""

from __future__ import annotations

from collections.abc import Mapping


def node_window(nthreads: int, max_workers_per_node: int | None) -> int:
    """Tasks one node may hold at once: its dask thread count, capped by the setting.

    A dask task blocks one of the node's threads while its node-local worker runs it, so more
    than ``nthreads`` in flight would only queue inside dask, out of the caller's reach.
    """
    window = max(1, int(nthreads))
    if max_workers_per_node is not None:
        window = min(window, max_workers_per_node)
    return window


def free_slots(windows: Mapping[str, int], in_flight: Mapping[str, int]) -> dict[str, int]:
    """Free slots per node: its window minus the tasks the caller has in flight there."""
    return {node: max(0, w - in_flight.get(node, 0)) for node, w in windows.items()}


def pick_node(free: Mapping[str, int]) -> str | None:
    """The node with the most free slots (ties: the first address in sorted order), or None.

    Most-free-first spreads a batch over every node before doubling up on one, so a 2-node
    cluster with 2 slots each runs 2 tasks on each rather than filling the first node.
    """
    best: str | None = None
    for node in sorted(free):
        if free[node] > 0 and (best is None or free[node] > free[best]):
            best = node
    return best


def departed(known: Mapping[str, object], present: Mapping[str, object]) -> list[str]:
    """Nodes the caller knows that the scheduler no longer lists."""
    return sorted(set(known) - set(present))
