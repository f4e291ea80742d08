"""Run ``precompile_executor`` tasks on a dask cluster: one node-local pool per dask worker.

``pip install 'precompile-executor[dask]'``; see ``docs/dask.md``. Importing this package imports
``distributed`` but neither torch nor triton.
"""

from .._cluster_state import NodesRefusedError
from ._dispatch import DaskExecutorStatistics, NodeLostError
from ._executor import DaskPrecompileExecutor
from ._plugin import NodePlugin

__all__ = [
    "DaskExecutorStatistics",
    "DaskPrecompileExecutor",
    "NodeLostError",
    "NodePlugin",
    "NodesRefusedError",
]
