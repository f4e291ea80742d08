"""Run ``precompile_executor`` tasks on a Ray cluster: one node actor, one node-local pool each.

``pip install 'precompile-executor[ray]'``; see ``docs/ray.md``. Importing this package imports
``ray`` but neither torch nor triton.
"""

from .._cluster_state import NodesRefusedError
from ._actor import NodeActor
from ._dispatch import NodeLostError, RayExecutorStatistics
from ._executor import RayPrecompileExecutor
from ._placement import node_actors

__all__ = [
    "NodeActor",
    "NodeLostError",
    "NodesRefusedError",
    "RayExecutorStatistics",
    "RayPrecompileExecutor",
    "node_actors",
]
