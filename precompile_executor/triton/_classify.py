"""A Triton-aware ``classify`` hook: which compile failures are expected while autotuning.

Autotuners try configs that cannot work on the target; those failures are expected and should
not stop a batch. Anything unrecognised may be a bug (in the kernel, in Triton) and is raised.

========================================================  ==========
failure                                                   result
========================================================  ==========
``OutOfResources``; shared-memory, register or tensor-    ``"debug"``
memory limits; "out of memory"
``PTXASError``; ``PassManager::run failed``               ``"warn"``
a timeout (``TimeoutError``, ``TaskTimeoutError``)        ``"warn"``
anything else (``CompilationError``, ``KeyError``, …)      ``"raise"``
========================================================  ==========

Resource patterns win over PTXAS: ``ptxas`` failing with "Insufficient registers" under a
``maxnreg`` limit is a resource error. Exceptions are matched by class *name* along the MRO and by
the ``exc_type`` attribute of :class:`~precompile_executor.RemoteError` proxies, as well as by
message, so this works whether or not the original class could be imported in the parent.
"""

from __future__ import annotations

from typing import Literal

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


def classify(exc: BaseException) -> Classification:
    """Return how a batch should treat ``exc``, a Triton compile failure.

    Args:
        exc: the exception a compile task ended with (the original or a ``RemoteError`` proxy).

    Returns:
        ``"debug"`` for expected resource limits, ``"warn"`` for ``ptxas``/MLIR pass failures
        and timeouts, ``"raise"`` for anything else.
    """
    names = _type_names(exc)
    message = str(exc).lower()
    if names & _RESOURCE_TYPES or any(p in message for p in _RESOURCE_PHRASES):
        return "debug"
    if names & _PTXAS_TYPES or any(p in message for p in _PTXAS_PHRASES):
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
