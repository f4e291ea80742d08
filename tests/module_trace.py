"""Run in a fresh interpreter: the package modules one warm ``submit().result()`` enters.

The profile hook is set for this thread and every thread started later (the hub's monitor, its
job and settle threads) before the package is imported, and in the worker by its initializer; it
records only between two marks, so one warm round trip is what is counted. Prints a JSON object:
``{"caller": [...], "worker": [...]}``, each a sorted list of module names.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import types
from typing import Any

PACKAGE = "precompile_executor"
_root = ""
_recording = False
_seen: set[str] = set()


def _module_of(filename: str) -> str | None:
    if not _root or not filename.startswith(_root):
        return None
    rel = os.path.relpath(filename, os.path.dirname(_root))
    return rel[: -len(".py")].replace(os.sep, ".") if rel.endswith(".py") else None


def _hook(frame: types.FrameType, event: str, arg: Any) -> None:
    if _recording and event == "call":
        name = _module_of(frame.f_code.co_filename)
        if name is not None:
            _seen.add(name)


def start_worker_trace() -> None:
    """The worker's initializer: the same hook in the worker's serving thread."""
    global _root, _recording
    import precompile_executor

    _root = os.path.dirname(precompile_executor.__file__)
    _recording = True
    sys.setprofile(_hook)


def worker_clear() -> None:
    _seen.clear()


def worker_seen() -> list[str]:
    return sorted(_seen)


def noop(x: int) -> int:
    return x


def main() -> None:
    global _root, _recording
    sys.setprofile(_hook)
    threading.setprofile(_hook)
    import precompile_executor
    from precompile_executor import PrecompileExecutor

    _root = os.path.dirname(precompile_executor.__file__)
    with PrecompileExecutor(1, initializer=start_worker_trace) as ex:
        for i in range(20):  # warm: the worker, the pickled function, the cost model
            assert ex.submit(noop, i).result(timeout=60) == i
        ex.submit(worker_clear).result(timeout=60)
        _seen.clear()
        _recording = True
        assert ex.submit(noop, 7).result(timeout=60) == 7
        _recording = False
        caller = sorted(_seen)
        worker = ex.submit(worker_seen).result(timeout=60)
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    print(json.dumps({"caller": caller, "worker": worker}))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import module_trace  # the functions by their module's name, importable in the worker

    module_trace.main()
