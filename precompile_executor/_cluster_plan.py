"""Pure scheduling decisions of every cluster backend's caller side: windows and where tasks go.

No locks, no cluster, no processes: the executors call these with their lock held and the tests
call them with plain dictionaries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def node_window(slots: float, max_workers_per_node: int | None) -> int:
    """Tasks one node may hold at once: its slots (dask threads, Ray CPUs), capped by the setting.

    More than the node runs at once would only queue on the node, out of the caller's reach
    (no priority, no cancel before start), so the caller keeps the rest.
    """
    window = max(1, int(slots))
    if max_workers_per_node is not None:
        window = min(window, max_workers_per_node)
    return window


def free_slots(windows: Mapping[str, int], in_flight: Mapping[str, int]) -> dict[str, int]:
    """Free slots per node: its window minus the tasks the caller has in flight there."""
    return {node: max(0, w - in_flight.get(node, 0)) for node, w in windows.items()}


def pick_node(free: Mapping[str, int], among: Iterable[str] | None = None) -> str | None:
    """The node with the most free slots (ties: the first name in sorted order), or None.

    Most-free-first spreads a batch over every node before doubling up on one, so a 2-node
    cluster with 2 slots each runs 2 tasks on each rather than filling the first node.
    ``among`` limits the choice (the nodes that have what a task asks for).
    """
    allowed = None if among is None else set(among)
    best: str | None = None
    for node in sorted(free):
        if allowed is not None and node not in allowed:
            continue
        if free[node] > 0 and (best is None or free[node] > free[best]):
            best = node
    return best


def departed(known: Mapping[str, object], present: Mapping[str, object]) -> list[str]:
    """Nodes the caller knows that the cluster no longer lists."""
    return sorted(set(known) - set(present))


def has_resources(node: Mapping[str, float], wanted: Mapping[str, float]) -> bool:
    """Whether a node's total resources cover every amount in ``wanted`` (a filter: nothing is
    reserved; the node's window bounds how many tasks run there)."""
    return all(node.get(name, 0.0) >= amount for name, amount in wanted.items())
