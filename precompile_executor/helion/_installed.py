"""The active installations of the Helion seam: which executor the patched methods use, and
Helion's originals to put back. A module of its own so that the patched methods (:mod:`._future`,
:mod:`._provider`, :mod:`._warm`) and :mod:`._seam`, which installs them, all import it and none
of them imports :mod:`._seam` back (tests/test_imports.py).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from .. import PrecompileExecutor


@dataclasses.dataclass(frozen=True, eq=False)
class Installation:
    executor: PrecompileExecutor
    create: Any  # the staticmethod objects found on the class before we replaced them
    wait_for_all: Any
    prepare: Any  # BaseSearch._prepare as found


lock = threading.RLock()
stack: list[Installation] = []
"""Active installations, innermost last; the patched methods use ``stack[-1].executor``."""


def current_executor() -> PrecompileExecutor:
    """The executor of the innermost active installation (the patched methods' target)."""
    with lock:
        if not stack:
            raise RuntimeError("precompile_executor.helion is not installed")
        return stack[-1].executor


def uses(executor: PrecompileExecutor) -> bool:
    """Whether ``executor`` is the one the patched methods use now."""
    with lock:
        return bool(stack) and stack[-1].executor is executor


def installed() -> bool:
    """Whether Helion's precompile runs on an executor now (:func:`use` or :func:`install`)."""
    with lock:
        return bool(stack)


def original_wait_for_all() -> Any:
    """Helion's own ``PrecompileFuture.wait_for_all`` (the function), while installed."""
    with lock:
        if not stack:
            return None
        return stack[0].wait_for_all.__func__
