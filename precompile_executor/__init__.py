"""precompile_executor: compile (and run once) many GPU kernel configs in parallel.

The public surface is re-exported here; implementation lives in private modules. Importing this
package imports neither torch nor triton (``precompile_executor.triton`` does, on demand).
"""

from ._base import BUSY_SWITCH_INTERVAL_S, kill_running_futures, set_busy_switch_interval
from ._batch import completed_future, wait_for_all
from ._costs import Estimate, estimated_cost
from ._errors import (
    Classification,
    CudaInForkError,
    RemoteError,
    ResultSerializationError,
    SerializationError,
    TaskMemoryError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
)
from ._executor import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_WORKERS_PER_CORE,
    PrecompileExecutor,
    stop_idle_workers,
)
from ._process import KILL_GRACE_S
from ._records import ExecutorStatistics, TaskCounts, TaskResult, TaskTimeline
from ._worker import worker_device

__version__ = "0.2.0"

__all__ = [
    "BUSY_SWITCH_INTERVAL_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_WORKERS_PER_CORE",
    "KILL_GRACE_S",
    "Classification",
    "CudaInForkError",
    "Estimate",
    "ExecutorStatistics",
    "PrecompileExecutor",
    "RemoteError",
    "ResultSerializationError",
    "SerializationError",
    "TaskCounts",
    "TaskResult",
    "TaskTimeline",
    "TaskMemoryError",
    "TaskTimeoutError",
    "WorkerCrashedError",
    "WorkerStartError",
    "completed_future",
    "kill_running_futures",
    "set_busy_switch_interval",
    "estimated_cost",
    "stop_idle_workers",
    "wait_for_all",
    "worker_device",
]
