"""Module-level helpers that spawn workers of tests/test_helion.py's child interpreters import
by name (a ``-c`` script's functions cannot be pickled by reference)."""

from __future__ import annotations

import os
import sys


def worker_view(_: int) -> tuple[bool, str | None]:
    """What a worker sees: whether Helion is imported in it, and its CUDA_VISIBLE_DEVICES."""
    return "helion" in sys.modules, os.environ.get("CUDA_VISIBLE_DEVICES")


def held_until(path: str, timeout_s: float = 120.0) -> None:
    """An initializer that holds a worker's start until ``path`` exists (at most ``timeout_s``):
    a test decides when the executor's workers may answer."""
    import time

    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
