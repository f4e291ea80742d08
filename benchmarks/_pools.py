"""Uniform handles on the pools the benchmark compares, each started and stopped the same way.

Every handle has ``submit(fn, *args)`` → a ``concurrent.futures.Future``, ``map(fn, items,
chunksize)`` → results in order, and ``close()`` (also on leaving a ``with`` block), which stops
every worker process it started, killing them if needed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import precompile_executor as pe


class Pool:
    """A started pool of one kind; ``timeout`` is per task, where the pool has one (pebble)."""

    def __init__(self, name: str, executor: Any, close: Callable[[], Any]) -> None:
        self.name, self.executor, self.close = name, executor, close
        self.timeout: float | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        if self.name.startswith("pebble"):
            return self.executor.schedule(fn, args=args, timeout=self.timeout)  # type: ignore[no-any-return]
        return self.executor.submit(fn, *args)  # type: ignore[no-any-return]

    def map(self, fn: Callable[..., Any], *items: Iterable[Any], chunksize: int = 1) -> Any:
        results = self.executor.map(fn, *items, chunksize=chunksize)
        return results.result() if self.name.startswith("pebble") else results

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _stdlib(method: str, workers: int, initializer: Callable[[], None] | None) -> Pool:
    # Python 3.12+ warns that fork() with threads running may deadlock; the stdlib pool is
    # measured as people use it.
    warnings.simplefilter("ignore", DeprecationWarning)
    context = multiprocessing.get_context(method)
    ppe = ProcessPoolExecutor(workers, mp_context=context, initializer=initializer)

    def close() -> None:
        with contextlib.suppress(Exception):
            getattr(ppe, "kill_workers", lambda: None)()  # Python 3.14+
        ppe.shutdown(wait=True, cancel_futures=True)

    return Pool(f"stdlib PPE ({method})", ppe, close)


def start(name: str, workers: int, initializer: Callable[[], None] | None = None) -> Pool:
    """Start pool ``name`` (``"precompile"``, ``"ppe-fork"``, ``"ppe-spawn"``, ``"loky"``
    reusable, ``"pebble"``) of ``workers`` workers, each running ``initializer`` first."""
    if name == "precompile":
        ex = pe.PrecompileExecutor(workers, initializer=initializer)
        return Pool("PrecompileExecutor", ex, ex.terminate_workers)
    if name.startswith("ppe-"):
        return _stdlib(name.removeprefix("ppe-"), workers, initializer)
    if name == "loky":
        import loky

        lky = loky.get_reusable_executor(max_workers=workers, initializer=initializer)
        return Pool("loky reusable", lky, lambda: lky.shutdown(wait=True, kill_workers=True))
    if name == "pebble":
        import pebble

        pool: Any = pebble.ProcessPool(max_workers=workers, initializer=initializer)
        return Pool("pebble ProcessPool", pool, lambda: (pool.stop(), pool.join(timeout=30)))
    raise ValueError(f"unknown pool {name!r}")


def each(
    names: Iterable[str],
    workers: int,
    ctx: Any,
    skipped: list[str],
    initializer: Callable[[], None] | None = None,
) -> Iterator[Pool]:
    """Start each pool of ``names`` in turn (the caller closes it: ``with pool:``); those whose
    package is not installed are noted in ``skipped``."""
    for name in names:
        if name in ("pebble", "loky") and importlib.util.find_spec(name) is None:
            skipped.append(f"{name}: skipped, {name} is not installed")
            continue
        ctx.log(f"{ctx.key}: {name}")
        yield start(name, workers, initializer)
