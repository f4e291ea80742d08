"""A Triton-aware ``classify`` hook: which compile failures are expected while autotuning.

Autotuners try configs that cannot work on the target; those failures are expected and should
not stop a batch. Anything unrecognised may be a bug (in the kernel, in Triton) and is raised.

========================================================  ==========
failure                                                   result
========================================================  ==========
``OutOfResources``; shared-memory, register or tensor-    ``"debug"``
memory limits; "out of memory"
``PTXASError``; ``PassManager::run failed``               ``"warn"``
a sticky CUDA error in a run-once task (illegal memory    ``"warn"``
access, misaligned address, unspecified launch failure,
illegal instruction, device-side assert)
a timeout (``TimeoutError``, ``TaskTimeoutError``)        ``"warn"``
anything else (``CompilationError``, ``KeyError``, …)      ``"raise"``
========================================================  ==========

Resource patterns win over PTXAS: ``ptxas`` failing with "Insufficient registers" under a
``maxnreg`` limit is a resource error. Exceptions are matched by class *name* along the MRO and by
the ``exc_type`` attribute of :class:`~precompile_executor.RemoteError` proxies, as well as by
message, so this works whether or not the original class could be imported in the parent.

A sticky CUDA error is a ``"warn"``, not a ``"raise"``: a config whose tiles overrun a buffer is a
config the autotuner must skip, and the fault stayed in the worker, which the executor replaced
(the same regex, ``STICKY_CUDA_ERROR``, decides that). It is not ``"debug"`` either: at every
config it usually means a bug in the kernel's masking, which the user should hear about.
"""

from __future__ import annotations

from typing import Literal

from .._worker import STICKY_CUDA_ERROR

Classification = Literal["raise", "warn", "debug"]

_RESOURCE_TYPES = frozenset({"OutOfResources", "OutOfMemoryError"})
_RESOURCE_PHRASES = (
    "out of resource",
    "out of memory",
    "shared memory",
    "too much shared data",
    "insufficient registers",
    "register count",
    "too many resources requested",
    "tensor memory",
)
_PTXAS_TYPES = frozenset({"PTXASError"})
_PTXAS_PHRASES = ("ptxas error", "passmanager::run failed")
_TIMEOUT_TYPES = frozenset({"TimeoutError", "TaskTimeoutError"})
_TORCH_DSA_HINT = "to enable device-side assertions"
"""torch appends "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions." to every
CUDA error, sticky or not; it must not read as a device-side assert."""


def classify(exc: BaseException) -> Classification:
    """Return how a batch should treat ``exc``, a Triton compile failure.

    Args:
        exc: the exception a compile task ended with (the original or a ``RemoteError`` proxy).

    Returns:
        ``"debug"`` for expected resource limits, ``"warn"`` for ``ptxas``/MLIR pass failures,
        sticky CUDA errors of run-once tasks and timeouts, ``"raise"`` for anything else.
    """
    names = _type_names(exc)
    message = str(exc).lower()
    if names & _RESOURCE_TYPES or any(p in message for p in _RESOURCE_PHRASES):
        return "debug"
    if names & _PTXAS_TYPES or any(p in message for p in _PTXAS_PHRASES):
        return "warn"
    if STICKY_CUDA_ERROR.search(message.replace(_TORCH_DSA_HINT, "")):
        return "warn"
    if names & _TIMEOUT_TYPES or isinstance(exc, TimeoutError):
        return "warn"
    return "raise"


def _type_names(exc: BaseException) -> set[str]:
    names = {cls.__name__ for cls in type(exc).__mro__}
    remote_name = getattr(exc, "exc_type", None)
    if isinstance(remote_name, str) and remote_name:
        names.add(remote_name)
    return names
