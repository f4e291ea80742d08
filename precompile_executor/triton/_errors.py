"""Errors of the Triton integration. Each message says what happened and what to do."""

from __future__ import annotations


class KernelTransferError(RuntimeError):
    """A kernel could not be sent to, or rebuilt in, a worker process.

    The message names the kernel, why each way of sending it failed, and what to change (define
    the kernel at module level in an importable module, or make the globals it uses picklable).
    """


class CacheKeyMismatchError(RuntimeError):
    """A worker's Triton computed a different cache hash from the caller's for the same kernel.

    Installing its files would not help: the caller's next compile would look under another key.
    The cause is a different Triton, ``ptxas`` or backend version in the worker, or a Triton knob
    the caller set in code (not through the environment), which workers do not see.
    """

    @classmethod
    def from_hashes(cls, expected: str, actual: str, worker_pid: int) -> CacheKeyMismatchError:
        """Build the error for the caller's ``expected`` hash and the worker's ``actual`` one."""
        return cls(
            f"worker process {worker_pid} computed Triton cache hash {actual[:16]}… but the "
            f"caller expects {expected[:16]}…: the worker runs a different Triton/ptxas, or a "
            "Triton knob was set in the caller's code rather than in the environment. Use the "
            "same installation in workers, and set knobs through TRITON_* environment variables."
        )


class UnsupportedTritonError(RuntimeError):
    """Triton handed over something this integration does not know how to take apart.

    Raised when the closure that ``AsyncCompileMode`` submits does not capture the
    ``src``/``target``/``options`` that Triton 3.6 to 3.9 capture. Please report it with your
    Triton version; meanwhile compile in threads (``AsyncCompileMode(ThreadPoolExecutor())``).
    """
