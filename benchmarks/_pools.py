"""Uniform handles on the pools the benchmark compares, each started and stopped the same way.

Every handle has ``submit(fn, *args)`` → a ``concurrent.futures.Future``, ``map(fn, items,
chunksize)`` → results in order, and ``close()`` (also on leaving a ``with`` block), which stops
every worker process it started, killing them if needed. :func:`each` starts the named pools one
after another and skips, with a note, those whose package is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import precompile_executor as pe


class Pool:
    """A started pool of one kind; see the module docstring."""

    def __init__(self, name: str, executor: Any, close: Callable[[], None]) -> None:
        self.name, self.executor, self.close = name, executor, close
        self.timeout: float | None = None  # per task, where the pool has one (pebble)

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        return self.executor.submit(fn, *args)  # type: ignore[no-any-return]

    def map(self, fn: Callable[..., Any], *items: Iterable[Any], chunksize: int = 1) -> Any:
        return self.executor.map(fn, *items, chunksize=chunksize)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Pebble(Pool):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        return self.executor.schedule(fn, args=args, timeout=self.timeout)  # type: ignore[no-any-return]

    def map(self, fn: Callable[..., Any], *items: Iterable[Any], chunksize: int = 1) -> Any:
        return self.executor.map(fn, *items, chunksize=chunksize).result()


def missing(name: str) -> str | None:
    """Why pool ``name`` can't run here (``None`` when it can)."""
    if name in ("pebble", "loky") and importlib.util.find_spec(name) is None:
        return f"{name} is not installed"
    return None


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
            context = multiprocessing.get_context(method)
            ppe = ProcessPoolExecutor(workers, mp_context=context, initializer=initializer)

        def close_ppe() -> None:
            with contextlib.suppress(Exception):
                getattr(ppe, "kill_workers", lambda: None)()  # Python 3.14+
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                ppe.shutdown(wait=True, cancel_futures=True)

        return Pool(f"stdlib PPE ({method})", ppe, close_ppe)
    if name == "loky":
        import loky

        lky = loky.get_reusable_executor(max_workers=workers, initializer=initializer)
        return Pool("loky reusable", lky, lambda: lky.shutdown(wait=True, kill_workers=True))
    if name == "pebble":
        import pebble

        pool: Any = pebble.ProcessPool(max_workers=workers, initializer=initializer)
        return _Pebble("pebble ProcessPool", pool, lambda: (pool.stop(), pool.join(timeout=30)))
    if name == "threads":
        tpe = ThreadPoolExecutor(workers)
        return Pool(
            f"ThreadPoolExecutor({workers})", tpe, lambda: tpe.shutdown(True, cancel_futures=True)
        )
    raise ValueError(f"unknown pool {name!r}")


def each(
    names: Iterable[str],
    workers: int,
    ctx: Any,
    skipped: list[str],
    initializer: Callable[[], None] | None = None,
) -> Iterator[Pool]:
    """Start each installed pool of ``names`` in turn (the caller closes it: ``with pool:``);
    note the others in ``skipped``."""
    for name in names:
        why = missing(name)
        if why:
            skipped.append(f"{name}: skipped, {why}")
            continue
        ctx.log(f"{ctx.key}: {name}")
        yield start(name, workers, initializer)
