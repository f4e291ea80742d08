"""Pure scheduling decisions of the dask caller side (shared with the Ray backend).

Re-exported from :mod:`precompile_executor._cluster_plan`: a node's window is its dask thread
count, capped by ``max_workers_per_node``.
"""

from __future__ import annotations

from .._cluster_plan import departed, free_slots, node_window, pick_node

__all__ = ["departed", "free_slots", "node_window", "pick_node"]
