"""Uniform handles on the pools the benchmark compares, each started and stopped the same way.

Every handle has ``submit(fn, *args)`` → a ``concurrent.futures.Future``, ``map(fn, items,
chunksize)`` → results in order, and ``close()``, which stops every worker process it started
(killing them if needed). Alternatives that are not installed are reported by :func:`missing`
and skipped by the scenarios, which say so in their output.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import precompile_executor as pe


def missing(name: str) -> str | None:
    """Why pool ``name`` can't run here (``None`` when it can)."""
    if name == "pebble":
        try:
            import pebble  # noqa: F401
        except ImportError:
            return "pebble is not installed"
    if name == "loky":
        try:
            import loky  # noqa: F401
        except ImportError:
            return "loky is not installed"
    return None


class Pool:
    """A started pool of one kind; see the module docstring."""

    def __init__(self, name: str, executor: Any, close: Callable[[], None]) -> None:
        self.name = name
        self.executor = executor
        self._close = close

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        return self.executor.submit(fn, *args)  # type: ignore[no-any-return]

    def map(
        self, fn: Callable[..., Any], items: Iterable[Any], chunksize: int = 1
    ) -> Iterator[Any]:
        return self.executor.map(fn, items, chunksize=chunksize)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop every worker this pool started (killing them if they don't stop)."""
        self._close()


class _PebblePool(Pool):
    """pebble's ``ProcessPool`` behind the same interface; ``timeout`` per task is pebble's own."""

    def __init__(self, workers: int, initializer: Callable[[], None] | None) -> None:
        import pebble

        pool: Any = pebble.ProcessPool(max_workers=workers, initializer=initializer)

        def close() -> None:
            pool.stop()
            pool.join(timeout=30)

        super().__init__("pebble ProcessPool", pool, close)
        self.timeout: float | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        return self.executor.schedule(fn, args=args, timeout=self.timeout)  # type: ignore[no-any-return]

    def map(
        self, fn: Callable[..., Any], items: Iterable[Any], chunksize: int = 1
    ) -> Iterator[Any]:
        return self.executor.map(fn, items, chunksize=chunksize).result()  # type: ignore[no-any-return]


def _shutdown_kill(executor: Executor) -> Callable[[], None]:
    def close() -> None:
        executor.shutdown(wait=True, cancel_futures=True)

    return close


def start(name: str, workers: int, initializer: Callable[[], None] | None = None) -> Pool:
    """Start pool ``name`` with ``workers`` workers, each running ``initializer`` first.

    Names: ``"precompile"`` (a :class:`PrecompileExecutor`), ``"ppe-fork"``, ``"ppe-spawn"``
    (stdlib), ``"loky"`` (``get_reusable_executor``), ``"pebble"``, ``"threads"``.
    """
    if name == "precompile":
        ex = pe.PrecompileExecutor(workers, initializer=initializer)
        return Pool("PrecompileExecutor", ex, ex.terminate_workers)
    if name in ("ppe-fork", "ppe-spawn"):
        method = name.split("-")[1]
        with warnings.catch_warnings():
            # Python 3.12+ warns that fork() with threads running may deadlock; the stdlib pool
            # is measured as people use it.
            warnings.simplefilter("ignore", DeprecationWarning)
            ppe = ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context(method), initializer=initializer
            )
        return Pool(f"stdlib PPE ({method})", ppe, _ppe_closer(ppe))
    if name == "loky":
        import loky

        lky = loky.get_reusable_executor(max_workers=workers, initializer=initializer)

        def close_loky() -> None:
            lky.shutdown(wait=True, kill_workers=True)

        return Pool("loky reusable", lky, close_loky)
    if name == "pebble":
        return _PebblePool(workers, initializer)
    if name == "threads":
        tpe = ThreadPoolExecutor(workers)
        return Pool(f"ThreadPoolExecutor({workers})", tpe, _shutdown_kill(tpe))
    raise ValueError(f"unknown pool {name!r}")


def _ppe_closer(ppe: ProcessPoolExecutor) -> Callable[[], None]:
    def close() -> None:
        kill = getattr(ppe, "kill_workers", None)  # Python 3.14+
        if kill is not None:
            with contextlib.suppress(Exception):
                kill()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ppe.shutdown(wait=True, cancel_futures=True)

    return close
